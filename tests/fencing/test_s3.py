"""FencedS3Prefix against a real S3-compatible server (moto's server mode, its own process)."""

from __future__ import annotations

import random
import threading
import uuid
from typing import Any

import pytest

from tests.fencing.s3_server import MotoServer
from volcano_locks.fencing import Fence, FencedS3Prefix, StaleFencingToken

from .helpers import PARTS, s3_keys, s3_publish

KEY = "lake-lock"


class Requests:
    """Counts the S3 requests a client sends (botocore's before-send event: one per HTTP request)."""

    def __init__(self, client: Any) -> None:
        self.sent: list[str] = []
        client.meta.events.register("before-send.s3", self._count)

    def _count(self, request: Any, **_: Any) -> None:
        self.sent.append(request.method)


@pytest.fixture
def lake(s3_server: MotoServer) -> tuple[Any, str, FencedS3Prefix]:
    client = s3_server.client()
    bucket = s3_server.bucket(versioned=True)
    return client, bucket, FencedS3Prefix(client, bucket, f"marts/{uuid.uuid4().hex[:8]}")


def test_a_publish_becomes_current_in_n_plus_two_requests(lake: tuple[Any, str, FencedS3Prefix]) -> None:
    client, _, prefix = lake
    counted = Requests(client)
    manifest = s3_publish(prefix, Fence(KEY, 4), "a")
    assert counted.sent == ["GET"] + ["PUT"] * PARTS + ["PUT"]  # read the manifest, the parts, the swap
    assert (manifest.fencing_token, manifest.generation, manifest.writer) == (4, 1, "a")
    assert prefix.current() == manifest and prefix.read("part-1.txt") == b"a:1"
    again = s3_publish(prefix, {"lock_key": KEY, "fencing_token": 4}, "a2")  # equal token, mapping form
    assert again.generation == 2 and prefix.read("part-0.txt") == b"a2:0"


def test_an_older_token_is_refused_by_one_read_and_uploads_nothing(
    lake: tuple[Any, str, FencedS3Prefix],
) -> None:
    client, bucket, prefix = lake
    s3_publish(prefix, Fence(KEY, 9), "new")
    before = s3_keys(client, bucket, prefix.prefix)
    counted = Requests(client)
    with pytest.raises(StaleFencingToken) as refused:
        s3_publish(prefix, Fence(KEY, 8), "stale")
    assert counted.sent == ["GET"]
    exc = refused.value
    assert (exc.resource, exc.fencing_token, exc.stored_token) == (prefix.prefix, 8, 9)
    assert s3_keys(client, bucket, prefix.prefix) == before and prefix.read("part-0.txt") == b"new:0"


def test_another_lock_is_refused(lake: tuple[Any, str, FencedS3Prefix]) -> None:
    _, _, prefix = lake
    s3_publish(prefix, Fence(KEY, 2), "a")
    with pytest.raises(StaleFencingToken, match="another lock"):
        s3_publish(prefix, Fence("other", 50), "b")
    assert prefix.read("part-0.txt") == b"a:0"


def test_a_stale_swap_that_lost_the_race_is_refused_and_its_upload_deleted(
    lake: tuple[Any, str, FencedS3Prefix], s3_server: MotoServer
) -> None:
    """The stale holder passed the manifest check; a successor published before its swap: 412, refused."""
    client, bucket, prefix = lake
    s3_publish(prefix, Fence(KEY, 1), "first")
    successor = FencedS3Prefix(s3_server.client(), bucket, prefix.prefix)
    fired: list[int] = []

    def successor_publishes_first(params: dict[str, Any], **_: Any) -> None:
        if params["Key"] == prefix.manifest_key and not fired:
            fired.append(1)
            s3_publish(successor, Fence(KEY, 5), "successor")

    client.meta.events.register("provide-client-params.s3.PutObject", successor_publishes_first)
    with pytest.raises(StaleFencingToken) as refused:
        s3_publish(prefix, Fence(KEY, 3), "stale")
    assert fired and refused.value.stored_token == 5
    current = prefix.current()
    assert current is not None and (current.writer, current.generation) == ("successor", 2)
    versions = {k.split("/")[3] for k in s3_keys(client, bucket, prefix.prefix) if "/versions/" in k}
    assert all(not v.startswith(f"{3:020d}-") for v in versions)  # the stale upload is gone
    assert [prefix.read(f"part-{i}.txt") for i in range(PARTS)] == [
        f"successor:{i}".encode() for i in range(PARTS)
    ]


def test_concurrent_publishers_never_lose_an_accepted_publish(
    lake: tuple[Any, str, FencedS3Prefix], s3_server: MotoServer
) -> None:
    """Eight threads racing publishes with shuffled tokens: each accepted publish is one generation."""
    client, bucket, prefix = lake
    tokens = [t for t in range(1, 13) for _ in range(2)]  # each token twice: same-token swaps race too
    random.Random(5).shuffle(tokens)
    accepted: list[tuple[int, int, str]] = []
    refused: list[tuple[int, int | None]] = []
    lock = threading.Lock()

    def run(i: int, mine: list[int]) -> None:
        mine_prefix = FencedS3Prefix(s3_server.client(), bucket, prefix.prefix, max_swaps=50)
        for n, token in enumerate(mine):
            try:
                m = s3_publish(mine_prefix, Fence(KEY, token), f"t{i}-{n}")
                with lock:
                    accepted.append((m.generation, token, m.version))
            except StaleFencingToken as exc:
                with lock:
                    refused.append((token, exc.stored_token))

    threads = [threading.Thread(target=run, args=(i, tokens[i::8])) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert len(accepted) + len(refused) == len(tokens) and accepted
    generations = sorted(g for g, _, _ in accepted)
    assert generations == list(range(1, len(accepted) + 1))  # no two publishes both won one swap
    in_order = [t for _, t, _ in sorted(accepted)]
    assert in_order == sorted(in_order)  # the manifest's token never went backwards
    assert all(stored is not None and stored > token for token, stored in refused)
    # Every accepted publish's data is whole; nothing of a refused one is left.
    on_store = {k.split("/")[3] for k in s3_keys(client, bucket, prefix.prefix) if "/versions/" in k}
    assert on_store == {v for _, _, v in accepted}
    manifests = client.list_object_versions(Bucket=bucket, Prefix=prefix.manifest_key)["Versions"]
    assert len(manifests) == len(accepted)


def test_bad_arguments_are_refused_naming_the_value(s3_server: MotoServer) -> None:
    client = s3_server.client()
    with pytest.raises(ValueError, match="'/lake'"):
        FencedS3Prefix(client, "b", "/lake")
    prefix = FencedS3Prefix(client, "b", "lake")
    with pytest.raises(ValueError, match=r"'\.\./x'"):
        prefix.publish(Fence(KEY, 1), {"../x": b""})
    with pytest.raises(TypeError, match="'a' must be bytes"):
        prefix.publish(Fence(KEY, 1), {"a": "text"})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="got NoneType"):
        prefix.publish(None, {"a": b""})
    assert repr(prefix) == "FencedS3Prefix(bucket='b', prefix='lake')"


def test_a_swap_whose_response_was_lost_is_recognised_and_its_data_kept(
    lake: tuple[Any, str, FencedS3Prefix],
) -> None:
    """The manifest PUT landed but the client saw an error: the publish reads back its own version."""
    client, _, prefix = lake
    lost: list[int] = []
    swapping: list[bool] = [False]

    def note_the_swap(params: dict[str, Any], **_: Any) -> None:
        swapping[0] = params.get("Key") == prefix.manifest_key

    def lose_the_response(**_: Any) -> None:
        if swapping[0] and not lost:
            lost.append(1)
            raise ConnectionResetError("response lost after the swap was applied")

    client.meta.events.register("provide-client-params.s3.PutObject", note_the_swap)
    client.meta.events.register("after-call.s3.PutObject", lose_the_response)
    manifest = s3_publish(prefix, Fence(KEY, 2), "a")
    assert lost and prefix.current() == manifest and manifest.generation == 1
    assert [prefix.read(f"part-{i}.txt") for i in range(PARTS)] == [f"a:{i}".encode() for i in range(PARTS)]
