"""The `volcano-locks` command line: one argparse subcommand per job (`serve`, `keys`, ...)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from .__about__ import __version__
from .cli_once import add_once_commands
from .cli_ops import add_ops_commands
from .extras import MissingExtra

__all__ = ["build_parser", "main"]


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
        help="run the local Volcano-compatible locks server",
        description="Run the local Volcano-compatible locks server until SIGTERM or Ctrl-C. It prints the "
        "URL, a ready-to-use anon key and service key for project 'local', then 'ready'.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to bind; 0 picks a free one (default 8000)")
    p.add_argument(
        "--db",
        default=None,
        help="SQLite file path, or postgresql://... DSN (add ?schema=NAME to pick the schema; default "
        "volcano_locks). Default: locks.sqlite3 in the user data dir",
    )
    p.add_argument(
        "--secret",
        default=None,
        help="HS256 signing secret, >= 32 bytes (default: $VOLCANO_LOCAL_SECRET, else one generated once "
        "and kept beside the database as <db>.secret, mode 0600)",
    )
    p.add_argument("--quota", type=int, default=600, help="lock requests per project per minute (0 = off)")
    p.add_argument(
        "--faults",
        default=None,
        help="fault injection rules, e.g. 'status=503:rate=0.1,delay=0.5-2:rate=0.05,drop:rate=0.05' "
        "(see volcano_locks.server.faults)",
    )
    p.add_argument(
        "--admin",
        action="store_true",
        help="enable /__admin/faults and /__admin/requests, behind the server's own admin key (printed as "
        "VOLCANO_ADMIN_KEY; no project's key opens them)",
    )
    p.add_argument(
        "--admin-key",
        default=None,
        help="the admin key for --admin, >= 32 characters (default: $VOLCANO_LOCAL_ADMIN_KEY, which keeps "
        "it out of `ps`; else a new random key at each start)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=128,
        help="client connections served at once; at the cap idle and slow ones make room (default 128)",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=10.0,
        help="seconds a client has to send a whole request, head and body (default 10)",
    )
    p.add_argument(
        "--no-request-log", dest="log_requests", action="store_false", help="do not log one line per request"
    )
    p.add_argument(
        "--clock-offset",
        type=float,
        default=0.0,
        help="run the server's clock this many seconds ahead of the system's (negative: behind); for tests",
    )
    p.add_argument(
        "--clock-rate",
        type=float,
        default=1.0,
        help="run the server's clock this many times as fast as real time (0.5: slow; 2: fast); for tests",
    )
    p.add_argument(
        "--history",
        default=None,
        metavar="FILE",
        help="append every lock request's record (op, key, status, answer, decision time; JSON lines, never "
        "a token) to FILE, for model checking",
    )
    p.set_defaults(func=_cmd_serve)


def _cmd_serve(args: argparse.Namespace) -> int:
    from .server.clock import check_clock_offset, check_clock_rate
    from .server.errors import StoreUnavailable
    from .server.faults import parse_faults
    from .server.http11 import Limits
    from .server.runner import ServeConfig, serve

    try:
        parse_faults(args.faults)
        check_clock_offset(args.clock_offset)
        check_clock_rate(args.clock_rate)
        limits = Limits(max_connections=args.max_connections, request_timeout=args.request_timeout)
    except ValueError as exc:
        print(f"volcano-locks serve: {exc}", file=sys.stderr)
        return 2
    if args.quota < 0:
        print("volcano-locks serve: --quota must be >= 0", file=sys.stderr)
        return 2
    if args.admin_key is not None and not args.admin:
        print("volcano-locks serve: --admin-key needs --admin", file=sys.stderr)
        return 2
    config = ServeConfig(
        host=args.host,
        port=args.port,
        db=args.db,
        secret=args.secret,
        quota=args.quota,
        faults=args.faults,
        admin=args.admin,
        admin_key=args.admin_key,
        log_requests=args.log_requests,
        limits=limits,
        clock_offset=args.clock_offset,
        clock_rate=args.clock_rate,
        history=args.history,
    )
    try:
        return serve(config)
    except (ValueError, StoreUnavailable, OSError) as exc:
        print(f"volcano-locks serve: {exc}", file=sys.stderr)
        return 2


def _add_keys(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "keys",
        help="mint service/anon keys offline",
        description="Mint HS256 JWT keys (project_id, role, permissions) for a server's secret.",
    )
    p.add_argument(
        "--secret",
        default=None,
        help="the server's signing secret (default: $VOLCANO_LOCAL_SECRET, else the default server's "
        "kept secret)",
    )
    p.add_argument("--project", default="local", help="project_id claim (default local)")
    p.add_argument("--role", choices=["service", "anon"], default="service", help="role for --format plain")
    p.add_argument(
        "--permissions",
        default=None,
        help="scope the service key: '*' or a comma list such as locks.manage (default: full access)",
    )
    p.add_argument("--expires-in", type=int, default=None, help="add an exp claim this many seconds ahead")
    p.add_argument("--format", choices=["plain", "env", "json"], default="plain")
    p.set_defaults(func=_cmd_keys)


def _cmd_keys(args: argparse.Namespace) -> int:
    from .server.auth import mint_key
    from .server.runner import SECRET_ENV, default_db_path, read_kept_secret, secret_path_for

    secret = args.secret or os.environ.get(SECRET_ENV)
    if secret is None:
        path = secret_path_for(default_db_path())
        if not path.exists():
            print(
                f"volcano-locks keys: no --secret given, ${SECRET_ENV} unset and no kept secret at {path}",
                file=sys.stderr,
            )
            return 2
        try:
            secret = read_kept_secret(path)
        except ValueError as exc:
            print(f"volcano-locks keys: {exc}", file=sys.stderr)
            return 2
    permissions = None
    if args.permissions is not None:
        permissions = [p.strip() for p in args.permissions.split(",") if p.strip()]
    try:
        service = mint_key(secret, args.project, "service", permissions, args.expires_in)
        anon = mint_key(secret, args.project, "anon", None, args.expires_in)
    except ValueError as exc:
        print(f"volcano-locks keys: {exc}", file=sys.stderr)
        return 2
    if args.format == "plain":
        print(service if args.role == "service" else anon)
    elif args.format == "env":
        print(f"VOLCANO_ANON_KEY={anon}")
        print(f"VOLCANO_SERVICE_KEY={service}")
    else:
        print(json.dumps({"project_id": args.project, "anon_key": anon, "service_key": service}))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """Build the `volcano-locks` parser; each subcommand registers itself with a `func` default."""
    parser = argparse.ArgumentParser(prog="volcano-locks", description="Volcano project locks tools.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_serve(sub)
    _add_keys(sub)
    add_ops_commands(sub)
    add_once_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return its exit code."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except MissingExtra as exc:  # `serve` and `keys` without the server's libraries
        print(f"volcano-locks {args.command}: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
