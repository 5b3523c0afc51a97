"""FencedS3Prefix against a real S3-compatible server (moto's server mode, its own process).

Lost responses go through ``s3_proxy.LosingProxy``: the server applies the swap, the client never hears.
"""

from __future__ import annotations

import json
import random
import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.fencing.s3_proxy import LosingProxy
from tests.fencing.s3_server import MotoServer, client_for
from volcano_locks.fencing import Fence, FencedS3Prefix, Snapshot, StaleFencingToken

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
    with pytest.raises(StaleFencingToken, match=f"fenced by lock {KEY!r}") as refused:
        s3_publish(prefix, Fence("other", 50), "b")
    assert refused.value.another_lock
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


# -- lost responses: through a proxy that loses the swap's answer after S3 applied it ------------------------


def _parts(snapshot: Snapshot) -> list[bytes]:
    return [snapshot.read(f"part-{i}.txt") for i in range(PARTS)]


def _folder_keys(client: Any, bucket: str, prefix: FencedS3Prefix, version: str) -> list[str]:
    return [k for k in s3_keys(client, bucket, prefix.prefix) if f"/versions/{version}/" in k]


def test_a_swap_whose_response_was_lost_is_recognised_as_landed(
    lake: tuple[Any, str, FencedS3Prefix], s3_server: MotoServer
) -> None:
    """botocore retries the lost swap and gets 412 (its first attempt landed): the publish returns it."""
    _, bucket, direct = lake
    with LosingProxy(s3_server.url) as proxy:
        via_proxy = FencedS3Prefix(client_for(proxy.url), bucket, direct.prefix)
        proxy.lose("PUT", direct.manifest_key)
        manifest = s3_publish(via_proxy, Fence(KEY, 2), "a")
    assert proxy.lost == [f"PUT /{bucket}/{direct.manifest_key}"]
    snapshot = direct.snapshot()
    assert snapshot is not None and snapshot.manifest == manifest and manifest.generation == 1
    assert _parts(snapshot) == [f"a:{i}".encode() for i in range(PARTS)]


def test_a_lost_swap_response_with_a_newer_publish_in_between_deletes_nothing_that_was_current(
    lake: tuple[Any, str, FencedS3Prefix], s3_server: MotoServer
) -> None:
    """The issue's case: the swap landed, its answer was lost, a newer holder published before the retry
    (412). The publish landed, so it returns its manifest and keeps its data; a reader holding it reads on."""
    client, bucket, direct = lake
    s3_publish(direct, Fence(KEY, 1), "first")
    held: list[Snapshot] = []

    def newer_holder_publishes() -> None:
        snapshot = direct.snapshot()  # a reader takes the publication that just became current
        assert snapshot is not None
        held.append(snapshot)
        s3_publish(direct, Fence(KEY, 5), "newer")

    with LosingProxy(s3_server.url) as proxy:
        via_proxy = FencedS3Prefix(client_for(proxy.url), bucket, direct.prefix)
        proxy.lose("PUT", direct.manifest_key, then=newer_holder_publishes)
        manifest = s3_publish(via_proxy, Fence(KEY, 3), "lost-answer")
    assert proxy.lost and held
    assert (manifest.version, manifest.fencing_token, manifest.writer) == (
        held[0].manifest.version,
        3,
        "lost-answer",
    )
    assert _parts(held[0]) == [f"lost-answer:{i}".encode() for i in range(PARTS)]  # no NoSuchKey
    assert len(_folder_keys(client, bucket, direct, manifest.version)) == PARTS
    current = direct.current()
    assert current is not None and (current.writer, current.generation) == ("newer", 3)
    assert current.previous[0].version == manifest.version  # the lineage remembers it was current


def test_publishers_and_readers_through_lost_responses_delete_nothing_current_and_read_no_mix(
    lake: tuple[Any, str, FencedS3Prefix], s3_server: MotoServer
) -> None:
    """Four publishers with rising tokens, every third swap answer lost; three readers snapshot throughout.

    Every version any manifest ever named keeps all its objects; readers never meet NoSuchKey or read two
    publications in one snapshot; the token in manifest order never goes back.
    """
    client, bucket, direct = lake
    stop = threading.Event()
    reads: list[int] = []
    problems: list[str] = []

    def reader() -> None:
        prefix = FencedS3Prefix(s3_server.client(), bucket, direct.prefix)
        while not stop.is_set():
            snapshot = prefix.snapshot()
            if snapshot is None:
                continue
            try:
                writers = {part.split(b":")[0] for part in _parts(snapshot)}
            except Exception as exc:  # NoSuchKey, above all
                problems.append(f"{type(exc).__name__}: {exc}")
                continue
            if writers != {snapshot.manifest.writer.encode()}:
                problems.append(f"a mix in generation {snapshot.manifest.generation}: {writers}")
            reads.append(snapshot.manifest.generation)

    outcomes: list[tuple[str, int]] = []
    lock = threading.Lock()
    with LosingProxy(s3_server.url) as proxy:
        proxy.lose("PUT", direct.manifest_key, count=1000, every=3)

        def publisher(i: int) -> None:
            prefix = FencedS3Prefix(client_for(proxy.url), bucket, direct.prefix, max_swaps=50)
            for round_ in range(6):
                token = 10 * round_ + i  # rising, interleaved between publishers
                try:
                    s3_publish(prefix, Fence(KEY, token), f"p{i}-{round_}")
                    result = "published"
                except StaleFencingToken:
                    result = "refused"
                with lock:
                    outcomes.append((result, token))

        readers = [threading.Thread(target=reader, daemon=True) for _ in range(3)]
        publishers = [threading.Thread(target=publisher, args=(i,)) for i in range(4)]
        for t in readers + publishers:
            t.start()
        for t in publishers:
            t.join(180)
        stop.set()
        for t in readers:
            t.join(30)
    assert not any(t.is_alive() for t in publishers + readers), "a publisher or reader hung"
    assert proxy.lost, "no swap answer was lost: the test did not test anything"
    assert not problems, problems[:5]
    assert reads and len(outcomes) == 24 and any(r == "published" for r, _ in outcomes)
    history = client.list_object_versions(Bucket=bucket, Prefix=direct.manifest_key)["Versions"]
    manifests = [
        json.loads(client.get_object(Bucket=bucket, Key=v["Key"], VersionId=v["VersionId"])["Body"].read())
        for v in history
    ]
    by_generation = sorted(manifests, key=lambda m: m["generation"])
    assert [m["generation"] for m in by_generation] == list(range(1, len(by_generation) + 1))
    tokens = [m["fencing_token"] for m in by_generation]
    assert tokens == sorted(tokens)  # never backwards
    for m in by_generation:  # 0 versions that were current deleted
        assert len(_folder_keys(client, bucket, direct, m["version"])) == PARTS, m["version"]


class _Interrupted(BaseException):
    """What ``with_lock(interrupt=True)`` raises into a body on loss: between any two bytecodes."""


def test_an_interrupt_right_after_the_swap_landed_deletes_nothing_that_is_current(
    lake: tuple[Any, str, FencedS3Prefix],
) -> None:
    """The chaos run's finding: a loss raised into the body just as the swap returned deleted the version
    that had just become current (a reader then met NoSuchKey). The swap lands; the interrupt follows."""
    client, bucket, prefix = lake
    s3_publish(prefix, Fence(KEY, 1), "first")

    def interrupt_after_the_swap(params: dict[str, Any], **_: Any) -> None:
        swapping.append(params.get("Key") == prefix.manifest_key)

    def interrupt(**_: Any) -> None:
        if swapping and swapping[-1]:
            swapping.clear()
            raise _Interrupted

    swapping: list[bool] = []
    client.meta.events.register("provide-client-params.s3.PutObject", interrupt_after_the_swap)
    client.meta.events.register("after-call.s3.PutObject", interrupt)
    with pytest.raises(_Interrupted):
        s3_publish(prefix, Fence(KEY, 2), "interrupted")
    snapshot = FencedS3Prefix(client, bucket, prefix.prefix).snapshot()
    assert snapshot is not None and snapshot.manifest.writer == "interrupted"  # the swap had landed
    assert _parts(snapshot) == [f"interrupted:{i}".encode() for i in range(PARTS)]  # and its data is there


# -- readers: one publication per snapshot -------------------------------------------------------------


def test_a_snapshot_reads_one_publication_while_another_lands(lake: tuple[Any, str, FencedS3Prefix]) -> None:
    _, _, prefix = lake
    s3_publish(prefix, Fence(KEY, 1), "old")
    snapshot = prefix.snapshot()
    assert snapshot is not None and snapshot.names == tuple(f"part-{i}.txt" for i in range(PARTS))
    first = snapshot.read("part-0.txt")
    s3_publish(prefix, Fence(KEY, 2), "new")  # between a reader's files
    assert [first, *(snapshot.read(f"part-{i}.txt") for i in range(1, PARTS))] == [
        f"old:{i}".encode() for i in range(PARTS)
    ]
    assert prefix.read("part-1.txt") == b"new:1"  # read(name): whatever is current at the call
    assert snapshot.urls() == [f"s3://{prefix.bucket}/{snapshot.key(n)}" for n in snapshot.names]
    with pytest.raises(KeyError, match="no object 'nope'"):
        snapshot.read("nope")
    assert repr(snapshot) == f"Snapshot({prefix.prefix!r}, generation=1, fencing_token=1)"


def test_nothing_published_is_no_snapshot(lake: tuple[Any, str, FencedS3Prefix]) -> None:
    _, _, prefix = lake
    assert prefix.snapshot() is None and prefix.current() is None
    with pytest.raises(KeyError):
        prefix.read("part-0.txt")


# -- query engines that list the prefix, and the symlink manifest ----------------------------------------


def _listed_like_hive(client: Any, bucket: str, prefix: str) -> list[str]:
    """What a table located at the prefix reads: every object below it, but names starting with _ or ."""
    return [
        k
        for k in s3_keys(client, bucket, prefix)
        if not any(part.startswith(("_", ".")) for part in k[len(prefix) + 1 :].split("/"))
    ]


def test_a_prefix_listing_sees_every_version_and_the_symlink_manifest_one(
    s3_server: MotoServer,
) -> None:
    client, bucket = s3_server.client(), s3_server.bucket()
    prefix = FencedS3Prefix(client, bucket, f"marts/{uuid.uuid4().hex[:8]}", symlink_manifest=True)
    counted = Requests(client)
    for token in (1, 2, 3):
        s3_publish(prefix, Fence(KEY, token), f"w{token}")
    assert counted.sent == (["GET"] + ["PUT"] * (PARTS + 1) + ["HEAD", "PUT"]) * 3  # two more per publish
    listed = _listed_like_hive(client, bucket, prefix.prefix)
    assert len(listed) == 3 * PARTS  # three publications at once: what a table on the prefix would read
    snapshot = prefix.snapshot()
    assert snapshot is not None
    symlinks = client.get_object(Bucket=bucket, Key=prefix.symlink_key)["Body"].read().decode().splitlines()
    assert symlinks == snapshot.urls()  # one publication, the current one
    assert prefix.symlink_key.split("/")[-2].startswith("_")  # hidden from the prefix listing itself


def test_the_symlink_manifest_only_moves_forward_and_can_be_caught_up(s3_server: MotoServer) -> None:
    client, bucket = s3_server.client(), s3_server.bucket()
    name = f"marts/{uuid.uuid4().hex[:8]}"
    pointing = FencedS3Prefix(client, bucket, name, symlink_manifest=True)
    silent = FencedS3Prefix(client, bucket, name)  # a publisher that died right after its swap
    s3_publish(pointing, Fence(KEY, 1), "a")
    first = pointing.current()
    s3_publish(silent, Fence(KEY, 2), "b")
    lagging = client.get_object(Bucket=bucket, Key=pointing.symlink_key)["Body"].read().decode()
    assert first is not None and first.version in lagging  # behind, never ahead: a whole older publication
    pointing._point_engines(first)  # a late pointer for generation 1 cannot move it back
    assert pointing.refresh_symlink_manifest() is not None
    snapshot = pointing.snapshot()
    assert snapshot is not None
    body = client.get_object(Bucket=bucket, Key=pointing.symlink_key)["Body"].read().decode()
    assert body.splitlines() == snapshot.urls()
    pointing._point_engines(first)
    assert client.get_object(Bucket=bucket, Key=pointing.symlink_key)["Body"].read().decode() == body


# -- old versions ---------------------------------------------------------------------------------------


class Clock:
    """A wall clock the test moves (FencedS3Prefix's ``clock``)."""

    def __init__(self) -> None:
        self.now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def test_prune_keeps_what_a_reader_may_hold_and_deletes_the_rest(
    lake: tuple[Any, str, FencedS3Prefix],
) -> None:
    client, bucket, _ = lake
    clock = Clock()
    prefix = FencedS3Prefix(
        client, bucket, f"marts/{uuid.uuid4().hex[:8]}", clock=clock, symlink_manifest=True
    )
    silent = FencedS3Prefix(client, bucket, prefix.prefix, clock=clock)  # died before its symlink step
    for token, publisher in ((1, prefix), (2, prefix), (3, silent), (4, silent)):
        s3_publish(publisher, Fence(KEY, token), f"w{token}")
        clock.now += timedelta(minutes=10)  # replaced at 12:10, 12:20, 12:30; w4 current since 12:30
    leftover = f"{1:020d}-deadbeefdeadbeef"  # an older token's upload that never became current
    client.put_object(Bucket=bucket, Key=f"{prefix.prefix}/versions/{leftover}/part-0.txt", Body=b"x")
    in_flight = f"{9:020d}-cafecafecafecafe"  # a newer token's upload, its swap not made yet
    client.put_object(Bucket=bucket, Key=f"{prefix.prefix}/versions/{in_flight}/part-0.txt", Body=b"y")
    current = prefix.current()
    assert current is not None
    v1, v2, v3 = (p.version for p in reversed(current.previous))
    held = prefix.snapshot()  # a reader of the current publication
    assert held is not None
    assert prefix.prune(timedelta(minutes=25)) == sorted([leftover, v1])  # v1 replaced 12:10, 30 min ago
    clock.now += timedelta(hours=1)
    # v2 is what the symlink manifest names (w3 and w4 never moved it): kept for the tables that read it.
    assert prefix.prune(timedelta(minutes=25)) == [v3]
    remaining = {k.split("/")[3] for k in s3_keys(client, bucket, prefix.prefix) if "/versions/" in k}
    assert remaining == {current.version, v2, in_flight}
    assert _parts(held) == [f"w4:{i}".encode() for i in range(PARTS)]
    assert prefix.refresh_symlink_manifest() is not None
    assert prefix.prune(timedelta(0)) == [v2]
    with pytest.raises(ValueError, match="older_than"):
        prefix.prune(3600)  # type: ignore[arg-type]


def test_a_manifest_written_before_the_lineage_is_read_and_replaced(
    lake: tuple[Any, str, FencedS3Prefix],
) -> None:
    client, bucket, prefix = lake
    version = f"{4:020d}-0123456789abcdef"
    client.put_object(Bucket=bucket, Key=f"{prefix.prefix}/versions/{version}/part-0.txt", Body=b"v1")
    old = {
        "format": 1,
        "lock_key": KEY,
        "fencing_token": 4,
        "version": version,
        "objects": ["part-0.txt"],
        "generation": 7,
        "writer": "old",
        "written_at": "2026-01-01T00:00:00+00:00",
    }
    client.put_object(Bucket=bucket, Key=prefix.manifest_key, Body=json.dumps(old).encode())
    assert prefix.read("part-0.txt") == b"v1"
    manifest = s3_publish(prefix, Fence(KEY, 5), "new")
    assert manifest.generation == 8 and [p.version for p in manifest.previous] == [version]
    assert not manifest.remembers(6) and manifest.remembers(7)
