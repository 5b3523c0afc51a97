"""One chaos worker process: contend for one key through the core ``with_lock`` and write through fencing.

Run by ``run.py`` as ``python -m tests.chaos.worker ...`` from the repository root. The server URL and the
service key come from the environment (``VOLCANO_API_URL``, ``VOLCANO_SERVICE_KEY``), never from argv,
where ``ps`` would show them.

Behaviour, per critical section: enter ``with_lock(key, ttl, on_contention="wait")``, log ``start``, then
every ``interval`` seconds check the guard and write once to the protected table with the lease's fencing
token, until the hold time is up or the guard reports loss; log ``end``. Each write goes to every store of
``adapter_stores.open_stores``: the shared FencedTable, FencedSQL and (given ``--s3-bucket``) FencedS3Prefix.
A well-behaved body checks
``guard.lost`` before each write. The one exception is the write right after a SIGCONT: it models a
process frozen between its check and its write (GC pause, VM steal), so it goes out unchecked and is logged
``late``; fencing must reject it if a newer holder has written.

SIGTERM asks the worker to finish: a running section ends at its next check; a worker still waiting for
the lock is interrupted (the wait must be cancellable) and leaves.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from volcano_locks import LockContention, OwnershipLost, VolcanoError, VolcanoLocks, WaitTimeout

from .adapter_stores import open_stores
from .events import EventLog
from .history import RecordingTransport

__all__ = ["FROZEN_JUMP", "HOLD_MAX", "main"]

HOLD_MAX = 6.0
"""The longest a worker holds the lock in one section (seconds)."""

FROZEN_JUMP = 1.0
"""Seconds a sleep may overrun before the body assumes it was frozen (SIGSTOP, a long pause)."""


class _Stop(BaseException):
    """Raised from the SIGTERM handler while the worker waits for the lock."""


class _Flags:
    """State the signal handlers share with the loop (plain attributes: handlers must not take locks)."""

    stop = False
    continued = False
    waiting = False
    in_write = False


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.chaos.worker", description=__doc__.splitlines()[0])
    p.add_argument("--name", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--ttl", type=int, default=5)
    p.add_argument("--store", required=True, help="SQLite path or postgresql:// DSN of the protected table")
    p.add_argument("--table", required=True)
    p.add_argument(
        "--s3-bucket",
        default="",
        help="bucket of the fenced S3 adapter (endpoint: $VOLCANO_TEST_S3_ENDPOINT)",
    )
    p.add_argument("--log", required=True, type=Path)
    p.add_argument("--calls", type=Path, default=None, help="record every lock call here (history.py)")
    p.add_argument("--server", type=int, default=0, help="index of the server this worker talks to")
    p.add_argument("--seed", type=int, default=0)
    # Holds up to longer than the TTL, so that sections need renewals and stalled renewals cost the lease.
    p.add_argument("--hold", type=float, nargs=2, default=(1.0, HOLD_MAX), metavar=("MIN", "MAX"))
    p.add_argument("--interval", type=float, default=0.25)
    p.add_argument("--think", type=float, nargs=2, default=(0.05, 0.4), metavar=("MIN", "MAX"))
    p.add_argument("--timeout", type=float, default=1.5, help="the client's per-request timeout")
    p.add_argument("--wait-timeout", type=float, default=60.0)
    p.add_argument(
        "--interrupt", action="store_true", help="with_lock(interrupt=True): loss raises in the body"
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the worker loop until SIGTERM; return the exit status."""
    args = _parse(argv)
    flags = _Flags()
    signal.signal(signal.SIGTERM, lambda *_: setattr(flags, "stop", True))  # asked to finish while starting
    rng = random.Random(args.seed)
    log = EventLog(args.log, args.name)
    stores = open_stores(args.store, args.table, args.key, args.s3_bucket)

    def on_term(signum: int, frame: FrameType | None) -> None:
        flags.stop = True
        if flags.waiting:
            flags.waiting = False
            raise _Stop

    def on_cont(signum: int, frame: FrameType | None) -> None:
        flags.continued = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGCONT, on_cont)

    # Every attempt goes through the client's own transport, recorded for the model checker.
    transport = (
        None if args.calls is None else RecordingTransport(args.calls, worker=args.name, server=args.server)
    )
    client = VolcanoLocks(timeout=args.timeout, transport=transport)
    log.emit("boot", server=args.server, ttl=args.ttl)
    cs = -1
    current: dict[str, Any] = {}
    try:
        while not flags.stop:
            cs += 1
            current.clear()
            current["cs"] = cs

            def on_loss(exc: OwnershipLost, _current: dict[str, Any] = current) -> None:
                guard = _current.get("guard")
                lease = guard.lease if guard is not None else None
                log.emit(
                    "lost",
                    cs=_current["cs"],
                    token=lease.fencing_token if lease else None,
                    deadline=lease.local_deadline if lease else None,
                    code=exc.code,
                )

            entered = False
            try:
                flags.waiting = True
                with client.with_lock(
                    args.key,
                    args.ttl,
                    on_contention="wait",
                    wait_timeout=args.wait_timeout,
                    interrupt=args.interrupt,
                    on_loss=on_loss,
                ) as guard:
                    flags.waiting = False
                    entered = True
                    current["guard"] = guard
                    _body(guard, args, cs, rng, flags, log, stores)
                flags.waiting = False
                log.emit("outcome", cs=cs, result="released", error=None)
            except _Stop:
                log.emit("outcome", cs=cs if entered else None, result="stopped", error=None)
            except OwnershipLost as exc:
                flags.waiting = False
                log.emit("outcome", cs=cs if entered else None, result="lost", error=type(exc).__name__)
                if flags.in_write:
                    stores = _reopen(stores, args, flags)
            except (LockContention, WaitTimeout) as exc:
                flags.waiting = False
                log.emit("outcome", cs=None, result="contention", error=type(exc).__name__)
            except VolcanoError as exc:
                flags.waiting = False
                log.emit(
                    "outcome",
                    cs=cs if entered else None,
                    result="error",
                    error=type(exc).__name__,
                    status=exc.status,
                    code=exc.code,
                )
                time.sleep(rng.uniform(0.1, 0.5))
            except Exception as exc:
                if not (flags.in_write and args.interrupt):
                    raise
                # OwnershipLost landed inside the database driver and surfaced as its own error.
                log.emit("outcome", cs=cs, result="lost", error=type(exc).__name__)
                stores = _reopen(stores, args, flags)
            if not flags.stop:
                time.sleep(rng.uniform(*args.think))
    except _Stop:
        pass
    log.emit("exit")
    client.close()
    if transport is not None:
        transport.close()
    for store in stores.values():
        store.close()
    log.close()
    return 0


def _reopen(stores: dict[str, Any], args: argparse.Namespace, flags: _Flags) -> dict[str, Any]:
    """Interrupted inside a write: the transaction was rolled back (a publish's upload deleted), but a
    connection may have been cut mid-protocol, so start afresh."""
    flags.in_write = False
    for store in stores.values():
        with contextlib.suppress(Exception):
            store.close()
    return open_stores(args.store, args.table, args.key, args.s3_bucket)


def _body(
    guard: Any,
    args: argparse.Namespace,
    cs: int,
    rng: random.Random,
    flags: _Flags,
    log: EventLog,
    stores: dict[str, Any],
) -> None:
    lease = guard.lease
    token = lease.fencing_token
    log.emit("start", cs=cs, token=token, deadline=lease.local_deadline, ttl=args.ttl, server=args.server)
    flags.continued = False
    until = time.monotonic() + rng.uniform(*args.hold)
    n = 0
    try:
        while True:
            before = time.monotonic()
            time.sleep(args.interval)
            # Frozen in between? The SIGCONT flag alone can lose a race with the sleep returning (the signal
            # may land on the keeper thread), so a jump of the shared monotonic clock counts too.
            late = flags.continued or time.monotonic() - before > args.interval + FROZEN_JUMP
            flags.continued = False
            lost = guard.lost
            if not late and (lost or flags.stop or time.monotonic() >= until):
                break
            flags.in_write = True
            value = f"{args.name}:{cs}:{n}"
            # The same attempt through every store: the shared table first, then each adapter.
            verdicts = {
                name: store.write(token, value, writer=args.name, cs=cs, late=late)
                for name, store in stores.items()
            }
            flags.in_write = False
            log.emit(
                "write",
                cs=cs,
                token=token,
                accepted=verdicts["table"],
                adapters={name: ok for name, ok in verdicts.items() if name != "table"},
                deadline=guard.lease.local_deadline,
                lost=lost,
                late=late,
            )
            n += 1
    except Exception as exc:  # interrupt=True: the keeper raised OwnershipLost into this thread
        log.emit(
            "end",
            cs=cs,
            token=token,
            deadline=guard.lease.local_deadline,
            lost=guard.lost,
            interrupted=type(exc).__name__,
        )
        raise
    log.emit("end", cs=cs, token=token, deadline=guard.lease.local_deadline, lost=guard.lost)


if __name__ == "__main__":
    sys.exit(main())
