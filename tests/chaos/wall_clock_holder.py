"""A holder whose wall clock is stepped while it holds: run under libfaketime by ``test_client_clock.py``.

The process runs with libfaketime preloaded (``LD_PRELOAD``), reading its wall-clock offset from the file
``FAKETIME_TIMESTAMP_FILE`` on every reading (``FAKETIME_NO_CACHE=1``) and leaving the monotonic clocks
alone (``DONT_FAKE_MONOTONIC=1``): writing ``-3600`` to the file steps this process's ``time.time()`` and
``datetime.now()`` an hour back, and nothing else on the machine.

It holds ``--key`` with ``with_lock``; steps its wall clock an hour back and keeps holding for two TTLs;
then steps it an hour forward and waits up to a TTL for the guard to report loss. It writes what it saw
as JSON to ``--out`` (never a token). The server URL and key come from the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from volcano_locks import OwnershipLost, VolcanoLocks


def _step_wall_clock(offset: str) -> float:
    """Set this process's wall-clock offset (libfaketime syntax, e.g. ``-3600``); return the step seen."""
    before = time.time()
    Path(os.environ["FAKETIME_TIMESTAMP_FILE"]).write_text(offset + "\n")
    return time.time() - before


def main(argv: list[str] | None = None) -> int:
    """Hold, step the wall clock back, hold on, step it forward; write the record."""
    p = argparse.ArgumentParser(prog="python -m tests.chaos.wall_clock_holder")
    p.add_argument("--key", required=True)
    p.add_argument("--ttl", type=int, default=5)
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args(argv)
    record: dict[str, Any] = {}
    losses: list[str | None] = []

    def on_loss(exc: OwnershipLost) -> None:
        losses.append(exc.code)

    try:
        _hold(args, record, on_loss)
    except OwnershipLost as exc:  # with_lock raises the loss on the way out, after releasing
        record["raised_on_exit"] = exc.code
    record["loss_codes"] = list(losses)
    args.out.write_text(json.dumps(record))
    return 0


def _hold(args: argparse.Namespace, record: dict[str, Any], on_loss: Any) -> None:
    with VolcanoLocks(timeout=1.5) as client, client.with_lock(args.key, args.ttl, on_loss=on_loss) as guard:
        record["fencing_token"] = guard.fencing_token
        record["deadline_before"] = guard.lease.local_deadline
        record["back_step"] = _step_wall_clock("-3600")
        record["back_at"] = time.monotonic()
        record["lost_after_back"] = guard.wait_lost(
            2 * args.ttl
        )  # holds on: the keeper runs on its own clock
        record["deadline_after_back"] = guard.lease.local_deadline
        record["fencing_after_back"] = guard.fencing_token
        record["forward_step"] = _step_wall_clock("+3600")
        forward = time.monotonic()
        record["forward_at"] = forward
        record["lost_after_forward"] = guard.wait_lost(2 * args.ttl)
        record["loss_after_s"] = time.monotonic() - forward
        _step_wall_clock("+0")  # the release goes out with the right wall clock; it does not matter


if __name__ == "__main__":
    sys.exit(main())
