"""Operator commands of the ``volcano-locks`` CLI: ``get``, ``force-release`` and ``quota``.

They read ``VOLCANO_API_URL`` / ``VOLCANO_SERVICE_KEY`` (flags override) and exit with codes that
scripts can branch on:

====  =====================================================================
code  meaning
====  =====================================================================
0     success (``get``: the lock was read, held or not)
1     declined at the confirmation prompt, or an unexpected server answer
2     bad usage or input: a missing setting, a malformed URL or lock key
3     the key was refused: 401 (invalid) or 403 (may not manage locks)
4     the server could not be reached, or answered 503 / 5xx
5     rate limited: the project's request budget for this minute is spent
====  =====================================================================
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any, TextIO

from volcano_locks.budget import DEFAULT_QUOTA, holder_budget, renewals_per_minute, waiting_per_minute
from volcano_locks.client import VolcanoLocks
from volcano_locks.errors import (
    AuthError,
    InvalidRequest,
    RateLimited,
    ServerError,
    TransportError,
    Unavailable,
    VolcanoError,
)
from volcano_locks.models import LockState

__all__ = ["EXIT_CODES_HELP", "add_ops_commands", "run_ops_command"]

EXIT_OK, EXIT_DECLINED, EXIT_USAGE, EXIT_AUTH, EXIT_UNREACHABLE, EXIT_RATE_LIMITED = 0, 1, 2, 3, 4, 5

EXIT_CODES_HELP = (
    "exit codes: 0 ok, 1 declined or unexpected answer, 2 bad usage or input, 3 key refused (401/403), "
    "4 server unreachable or failing (503/5xx), 5 rate limited"
)

FORCE_RELEASE_WARNING = (
    "force-release drops the lease whatever token holds it. The old holder keeps working until its next "
    "renewal fails, so this is safe only where the protected resource checks fencing tokens."
)


def add_ops_commands(subparsers: Any) -> None:
    """Register ``get``, ``force-release`` and ``quota`` on the CLI's argparse subparsers."""
    get = subparsers.add_parser(
        "get", help="read a lock: held, expiry countdown, fencing token", epilog=EXIT_CODES_HELP
    )
    get.add_argument("key", help="the lock key")
    _add_connection_flags(get)
    get.add_argument("--json", action="store_true", help="print the state as one JSON object")
    get.set_defaults(func=partial(run_ops_command, _run_get))

    force = subparsers.add_parser(
        "force-release",
        help="drop a lock whatever holds it (only safe for fenced resources)",
        epilog=EXIT_CODES_HELP,
    )
    force.add_argument("key", help="the lock key")
    _add_connection_flags(force)
    force.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    force.set_defaults(func=partial(run_ops_command, _run_force_release))

    quota = subparsers.add_parser(
        "quota",
        help="how many holders a TTL supports within the project's request budget",
        epilog="A holder renewing at a third of its TTL (at least once a minute) spends max(180 / ttl, 1) "
        "requests a minute; a waiting process, one look per key every 20 s once settled, at most its "
        "waiting budget (120 a minute by default).",
    )
    quota.add_argument(
        "--ttl", type=int, action="append", help="lease TTL in seconds (repeatable; default 10, 30, 60)"
    )
    quota.add_argument("--quota", type=int, default=DEFAULT_QUOTA, help="requests a minute (default 600)")
    quota.add_argument(
        "--reserve", type=int, default=0, help="requests a minute kept for reads, waits and acquires"
    )
    quota.add_argument("--holders", type=int, help="also print the smallest TTL that keeps N holders alive")
    quota.add_argument(
        "--waiters",
        type=int,
        default=0,
        help="waiting processes to budget for (their settled cost is added to the reserve)",
    )
    quota.add_argument(
        "--keys-per-waiter", type=int, default=1, help="keys each waiting process waits on (default 1)"
    )
    quota.set_defaults(func=partial(run_ops_command, _run_quota))


def _add_connection_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api-url", help="the Volcano API URL (default: $VOLCANO_API_URL)")
    parser.add_argument(
        "--service-key-env",
        default="VOLCANO_SERVICE_KEY",
        metavar="NAME",
        help="the environment variable holding the service key (default: VOLCANO_SERVICE_KEY); "
        "keys are never taken as flags, so they stay out of shell history and process lists",
    )
    parser.add_argument("--timeout", type=float, default=10.0, help="request timeout in seconds (default 10)")


def _client(args: argparse.Namespace) -> VolcanoLocks:
    api_url = args.api_url or os.environ.get("VOLCANO_API_URL")
    service_key = os.environ.get(args.service_key_env)
    if not api_url:
        raise InvalidRequest("no API URL: set VOLCANO_API_URL or pass --api-url")
    if not service_key:
        raise InvalidRequest(f"no service key: set the environment variable {args.service_key_env}")
    return VolcanoLocks(api_url=api_url, service_key=service_key, timeout=args.timeout)


def _run_get(args: argparse.Namespace, out: TextIO) -> int:
    with _client(args) as client:
        state = client.get(args.key)
    if args.json:
        out.write(json.dumps(_state_json(args.key, state)) + "\n")
    else:
        out.write(_describe_state(args.key, state, datetime.now(UTC)) + "\n")
    return EXIT_OK


def _state_json(key: str, state: LockState) -> dict[str, Any]:
    body: dict[str, Any] = {"key": key, "held": state.held}
    if state.held:
        body["fencing_token"] = state.fencing_token
        body["expires_at"] = state.expires_at.isoformat() if state.expires_at else None
    return body


def _describe_state(key: str, state: LockState, now: datetime) -> str:
    if not state.held:
        return f"{key}: free (an acquire would succeed now)"
    lines = [f"{key}: held", f"  fencing token  {state.fencing_token}"]
    if state.expires_at is not None:
        left = (state.expires_at - now).total_seconds()
        countdown = f"in {left:.1f} s" if left >= 0 else f"{-left:.1f} s ago, in the 1 s takeover grace"
        lines.append(f"  expires        {state.expires_at.isoformat()} ({countdown})")
    return "\n".join(lines)


def _run_force_release(args: argparse.Namespace, out: TextIO) -> int:
    sys.stderr.write(f"warning: {FORCE_RELEASE_WARNING}\n")
    if not args.yes:
        if not sys.stdin.isatty():
            sys.stderr.write("refusing to force-release without a terminal to confirm on; pass --yes\n")
            return EXIT_DECLINED
        answer = input(f"Force-release lock {args.key!r}? Type the key to confirm: ")
        if answer.strip() != args.key:
            sys.stderr.write("not confirmed; nothing was changed\n")
            return EXIT_DECLINED
    with _client(args) as client:
        client.force_release(args.key)
    out.write(f"{args.key}: force-released\n")
    return EXIT_OK


def _run_quota(args: argparse.Namespace, out: TextIO) -> int:
    if args.holders is not None and args.holders < 1:
        raise InvalidRequest(f"--holders must be at least 1, got {args.holders}")
    ttls = args.ttl or [10, 30, 60]
    waiting = math.ceil(waiting_per_minute(args.waiters, args.keys_per_waiter))
    reserve = args.reserve + waiting
    budgets = [holder_budget(ttl, quota=args.quota, reserve=reserve) for ttl in ttls]
    out.write(f"budget: {args.quota} lock requests a minute per project, {reserve} kept in reserve")
    if waiting:
        out.write(
            f" ({waiting} for {args.waiters} waiting process(es) on {args.keys_per_waiter} key(s) each"
            f"{f', {args.reserve} more asked for' if args.reserve else ''})"
        )
    out.write("\n\n")
    out.write("| TTL (s) | requests/min per holder | holders supported |\n| ---: | ---: | ---: |\n")
    for budget in budgets:
        out.write(f"| {budget.ttl} | {budget.renewals_per_minute:.2f} | {budget.holders} |\n")
    if args.holders is not None:
        # holders * 180 / ttl <= quota - reserve  =>  ttl >= 180 * holders / (quota - reserve)
        ttl = max(5, math.ceil(180 * args.holders / (args.quota - reserve)))
        out.write(
            f"\n{args.holders} holders need a TTL of at least {ttl} s "
            f"({args.holders * renewals_per_minute(ttl):.0f} requests a minute)\n"
        )
    return EXIT_OK


def run_ops_command(handler: Callable[[argparse.Namespace, TextIO], int], args: argparse.Namespace) -> int:
    """Run one operator command, turning its errors into a message on stderr and an exit code."""
    try:
        return handler(args, sys.stdout)
    except ValueError as exc:  # InvalidRequest is a ValueError too; budget arithmetic raises plain ones
        return _fail(EXIT_USAGE, exc)
    except AuthError as exc:
        return _fail(EXIT_AUTH, exc)
    except RateLimited as exc:
        return _fail(EXIT_RATE_LIMITED, exc)
    except (TransportError, Unavailable, ServerError) as exc:
        return _fail(EXIT_UNREACHABLE, exc)
    except VolcanoError as exc:
        return _fail(EXIT_DECLINED, exc)


def _fail(code: int, exc: Exception) -> int:
    sys.stderr.write(f"error: {exc}\n")
    return code
