"""``volcano-locks once list | show | forget``: read a run-once ledger, and forget a key on purpose (audited).

The ledger is a SQL database (``--db URL``, default ``$VOLCANO_ONCE_DB``, which keeps a password out of
``ps``; ``--table`` / ``--schema`` as given to ``SQLLedger``) or a fenced S3 prefix (``--s3
s3://bucket/prefix``, with ``--endpoint-url`` for an S3-compatible store; credentials from the usual AWS
settings). Exit codes: 0 done; 1 no record of the key; 2 bad usage or input (the message names the value);
4 the store could not be reached.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from volcano_locks.once._record import AuditEntry, OnceRecord

__all__ = ["DB_ENV", "add_once_commands"]

DB_ENV = "VOLCANO_ONCE_DB"
_PROG = "volcano-locks once"


class _Usage(Exception):
    """Bad usage or input: exit 2 with the message."""


def add_once_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``once`` and its three subcommands."""
    p = sub.add_parser(
        "once",
        help="list, show or forget (audited) the business keys of a run-once ledger",
        description="Read a run-once ledger (volcano_locks.once) and forget a key so it can run again; "
        "every forget is audited (who, when, why).",
    )
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    listing = verbs.add_parser("list", help="the keys done, newest first")
    listing.add_argument("--prefix", default=None, help="only keys starting with this text")
    listing.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    show = verbs.add_parser("show", help="one key's record and its audit trail")
    show.add_argument("key", help="the business key")
    forget = verbs.add_parser("forget", help="delete a key's record so a run may do it again (audited)")
    forget.add_argument("key", help="the business key")
    forget.add_argument("--by", required=True, help="who forgets it (recorded in the audit)")
    forget.add_argument("--why", required=True, help="why (recorded in the audit)")
    for verb in (listing, show, forget):
        verb.add_argument("--db", default=None, help=f"SQLAlchemy URL of the ledger's database (${DB_ENV})")
        verb.add_argument("--table", default="volcano_once", help="the ledger table (default volcano_once)")
        verb.add_argument("--schema", default=None, help="the ledger table's schema")
        verb.add_argument(
            "--s3", default=None, metavar="s3://BUCKET/PREFIX", help="a fenced S3 prefix instead"
        )
        verb.add_argument("--endpoint-url", default=None, help="an S3-compatible store's URL")
        verb.add_argument("--json", action="store_true", help="print JSON")
        verb.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    ledger: Any = None
    try:
        ledger = _ledger(args)
        return _VERBS[args.verb](ledger, args)
    except (_Usage, ValueError) as exc:
        print(f"{_PROG} {args.verb}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        if not _unreachable(exc):
            raise
        print(
            f"{_PROG} {args.verb}: the ledger's store could not be reached: {type(exc).__name__}",
            file=sys.stderr,
        )
        return 4
    finally:
        engine = getattr(getattr(ledger, "fenced", None), "engine", None)
        if engine is not None:
            engine.dispose()


def _unreachable(exc: BaseException) -> bool:
    """A database or S3 that does not answer (never judged on the message)."""
    try:
        import sqlalchemy as sa

        if isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError):
            return True
    except ModuleNotFoundError:
        pass
    try:
        from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped]

        return isinstance(exc, BotoCoreError | ClientError)
    except ModuleNotFoundError:
        return False


def _ledger(args: argparse.Namespace) -> Any:
    url: str | None = args.db or os.environ.get(DB_ENV)
    if (url is None) == (args.s3 is None):
        raise _Usage(
            f"give the ledger: --db URL (or ${DB_ENV}) for SQL, or --s3 s3://BUCKET/PREFIX, not both"
        )
    if args.s3 is not None:
        return _s3_ledger(args.s3, args.endpoint_url)
    import sqlalchemy as sa

    from volcano_locks.once.sql import SQLLedger

    assert url is not None
    try:
        parsed = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        raise _Usage(
            "--db must be a SQLAlchemy URL such as postgresql+psycopg://host/db or sqlite:///file"
        ) from None
    shown = parsed.render_as_string(hide_password=True)
    try:
        engine = sa.create_engine(parsed)
    except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError) as exc:
        raise _Usage(
            f"--db {shown!r}: {type(exc).__name__}: the dialect or driver is not available"
        ) from None
    return SQLLedger(engine, table=args.table, schema=args.schema)


def _s3_ledger(location: str, endpoint_url: str | None) -> Any:
    if not location.startswith("s3://") or "/" not in location[5:]:
        raise _Usage(f"--s3 must be s3://BUCKET/PREFIX, got {location!r}")
    bucket, prefix = location[5:].split("/", 1)
    import boto3  # type: ignore[import-untyped]

    from volcano_locks.fencing.s3 import FencedS3Prefix
    from volcano_locks.once.s3 import S3Ledger

    return S3Ledger(FencedS3Prefix(boto3.client("s3", endpoint_url=endpoint_url), bucket, prefix.rstrip("/")))


def _print_record(record: OnceRecord) -> None:
    print(
        f"{record.business_key}  token {record.fencing_token} of {record.lock_key!r}  "
        f"{record.done_at.isoformat(timespec='seconds')}  {record.who.describe()}"
    )


def _list(ledger: Any, args: argparse.Namespace) -> int:
    records: list[OnceRecord] = ledger.records(prefix=args.prefix, limit=args.limit)
    if args.json:
        print(json.dumps([r.to_dict() for r in records], indent=2))
    else:
        for record in records:
            _print_record(record)
    return 0


def _show(ledger: Any, args: argparse.Namespace) -> int:
    record: OnceRecord | None = ledger.lookup(args.key)
    trail: list[AuditEntry] = ledger.audit(args.key)
    if args.json:
        body = {"record": None if record is None else record.to_dict(), "audit": [e.to_dict() for e in trail]}
        print(json.dumps(body, indent=2))
    else:
        if record is None:
            print(f"no record of {args.key!r}: not done, or forgotten")
        else:
            print(record.describe())
            if record.result is not None:
                print(f"result: {json.dumps(record.result)}")
        for entry in trail:
            print(
                f"forgotten {entry.at.isoformat(timespec='seconds')} by {entry.by}: {entry.why} "
                f"(was token {entry.record.fencing_token}, {entry.record.who.describe()})"
            )
    return 0 if record is not None else 1


def _forget(ledger: Any, args: argparse.Namespace) -> int:
    record: OnceRecord | None = ledger.forget(args.key, by=args.by, why=args.why)
    if record is None:
        print(
            f"{_PROG} forget: no record of {args.key!r}; nothing forgotten, nothing audited", file=sys.stderr
        )
        return 1
    if args.json:
        print(json.dumps({"forgotten": record.to_dict(), "by": args.by, "why": args.why}, indent=2))
    else:
        print(f"forgot: {record.describe()}; audited (by {args.by})")
    return 0


_VERBS = {"list": _list, "show": _show, "forget": _forget}
