"""The S3 run-once ledger (the manifest records the business key) against moto's S3-compatible server."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

from tests.fencing.s3_server import MotoServer
from volcano_locks import VolcanoLocks
from volcano_locks.fencing import Fence, FencedS3Prefix, StaleFencingToken
from volcano_locks.once import AlreadyDone, S3Ledger, Who

LOCK = "lake-lock"
FLOW_RUN = Who.of("prefect", flow_run_id="0b5e", task_run_id="77aa", flow_run_name="brave-otter")


@pytest.fixture
def lake(s3_server: MotoServer) -> tuple[Any, str, S3Ledger]:
    client = s3_server.client()
    bucket = s3_server.bucket()
    return client, bucket, S3Ledger(FencedS3Prefix(client, bucket, f"marts/{uuid.uuid4().hex[:8]}"))


def _versions(client: Any, bucket: str, ledger: S3Ledger) -> set[str]:
    root = f"{ledger.prefix.prefix}/versions/"
    listed = client.list_objects_v2(Bucket=bucket, Prefix=root).get("Contents", [])
    return {o["Key"][len(root) :].split("/", 1)[0] for o in listed}


def test_the_manifest_records_the_key_with_the_publication(lake: tuple[Any, str, S3Ledger]) -> None:
    _, _, ledger = lake
    record = ledger.publish(
        "rollup:2026-12-01", Fence(LOCK, 4), {"part-0.json": b"[1]"}, who=FLOW_RUN, result=7
    )
    manifest = ledger.prefix.current()
    assert manifest is not None and manifest.fencing_token == 4 and "flow_run_id=0b5e" in manifest.writer
    assert ledger.lookup("rollup:2026-12-01") == record and record.result == 7
    assert ledger.prefix.read("part-0.json") == b"[1]"
    ledger.publish("rollup:2026-12-02", Fence(LOCK, 5), {"part-0.json": b"[2]"})
    assert [r.business_key for r in ledger.records()] == ["rollup:2026-12-02", "rollup:2026-12-01"]  # carried


def test_a_duplicate_publish_is_refused_and_leaves_nothing_behind(lake: tuple[Any, str, S3Ledger]) -> None:
    client, bucket, ledger = lake
    first = ledger.publish(
        "rollup:2026-12-01", Fence(LOCK, 4), {"a": b"first"}, who=FLOW_RUN, result={"n": 1}
    )
    before = _versions(client, bucket, ledger)
    with pytest.raises(AlreadyDone) as caught:
        ledger.publish("rollup:2026-12-01", Fence(LOCK, 9), {"a": b"second"})
    assert caught.value.record == first and caught.value.record.result == {"n": 1}
    assert "prefect flow_run_id=0b5e" in str(caught.value)
    assert ledger.prefix.read("a") == b"first" and _versions(client, bucket, ledger) == before


def test_concurrent_duplicate_publishes_make_one_current(s3_server: MotoServer) -> None:
    bucket = s3_server.bucket()
    prefix = f"marts/{uuid.uuid4().hex[:8]}"
    outcomes: list[str] = []
    start = threading.Barrier(6)

    def attempt(i: int) -> None:
        ledger = S3Ledger(FencedS3Prefix(s3_server.client(), bucket, prefix, max_swaps=50))
        start.wait()
        try:
            ledger.publish("day", Fence(LOCK, 3), {"part": f"w{i}".encode()})
            outcomes.append("done")
        except AlreadyDone:
            outcomes.append("duplicate")

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(outcomes) == ["done"] + ["duplicate"] * 5
    ledger = S3Ledger(FencedS3Prefix(s3_server.client(), bucket, prefix))
    manifest = ledger.prefix.current()
    assert manifest is not None and manifest.generation == 1
    assert _versions(s3_server.client(), bucket, ledger) == {manifest.version}  # the losers' uploads deleted


def test_a_stale_publisher_is_refused_before_the_ledger(lake: tuple[Any, str, S3Ledger]) -> None:
    _, _, ledger = lake
    ledger.publish("day-1", Fence(LOCK, 8), {"a": b"x"})
    with pytest.raises(StaleFencingToken):
        ledger.publish("day-2", Fence(LOCK, 7), {"a": b"y"})
    assert ledger.lookup("day-2") is None


def test_forget_is_audited_in_the_manifest_and_allows_a_re_run(lake: tuple[Any, str, S3Ledger]) -> None:
    _, _, ledger = lake
    first = ledger.publish("day", Fence(LOCK, 1), {"a": b"1"})
    assert ledger.forget("day", by="ana", why="bad source") == first
    assert ledger.forget("day", by="ana", why="bad source") is None
    assert ledger.lookup("day") is None and ledger.prefix.read("a") == b"1"  # forgetting undoes nothing
    ledger.publish("day", Fence(LOCK, 2), {"a": b"2"})
    (entry,) = ledger.audit("day")
    assert (entry.by, entry.why, entry.record) == ("ana", "bad source", first)
    ledger.publish("day-2", Fence(LOCK, 3), {"a": b"3"})
    assert len(ledger.audit()) == 1  # the audit is carried forward by later publishes


def test_with_lock_once_on_s3(
    lake: tuple[Any, str, S3Ledger], volcano_client: VolcanoLocks, unique_key: str
) -> None:
    _, _, ledger = lake
    with volcano_client.with_lock(unique_key, ttl=30, once=ledger.once("day")) as guard:
        assert guard.duplicate is None
        guard.once.publish({"a": b"data"}, result={"rows": 3})
    with volcano_client.with_lock(unique_key, ttl=30, once=ledger.once("day")) as again:
        assert again.duplicate is not None and again.duplicate.result == {"rows": 3}
    with pytest.raises(TypeError, match="not bound to a lease"):
        ledger.once("other").publish({"a": b"x"})


def test_s3_ledger_takes_a_fenced_prefix_only() -> None:
    with pytest.raises(TypeError, match="FencedS3Prefix, got str"):
        S3Ledger("marts/x")  # type: ignore[arg-type]
