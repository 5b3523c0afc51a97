"""A holder that freezes inside its fenced transaction, for test_long_pause: the chaos adapters' long pause.

Run as ``python -m tests.chaos.paused_holder ADAPTER STORE TABLE KEY STALL GO`` from the repository root
with VOLCANO_* in the environment. It takes KEY (TTL 5 s) and writes once through the chaos adapter
ADAPTER (``sql`` or ``sql-async``, ``adapter_stores``) with FencedSQL's stall timeout STALL; after the
write's first statement, inside the transaction, it prints ``{"inside": token}`` and waits for the file GO
(the test SIGSTOPs it there, holding the guard row). It then prints ``{"accepted": bool}`` or
``{"error": type}`` (PostgreSQL ended its session while it was frozen).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from volcano_locks import VolcanoError, VolcanoLocks

from .adapter_stores import AsyncSqlStore, SqlStore


def main() -> None:
    adapter, store_url, table, key, stall, go = sys.argv[1:7]
    kind = AsyncSqlStore if adapter == "sql-async" else SqlStore
    store = kind(store_url, table, key, stall_timeout=float(stall))
    store.current()  # creates the tables
    with VolcanoLocks() as client:
        try:
            with client.with_lock(key, 5) as guard:
                token = guard.fencing_token
                assert token is not None

                def frozen_inside() -> None:
                    print(json.dumps({"inside": token}), flush=True)
                    while not Path(go).exists():
                        time.sleep(0.05)

                try:
                    accepted = store.write(
                        token, "paused", writer="paused", cs=0, late=True, inside=frozen_inside
                    )
                    print(json.dumps({"accepted": accepted}), flush=True)
                except Exception as exc:  # the session PostgreSQL ended: nothing of it committed
                    print(json.dumps({"error": type(exc).__name__}), flush=True)
        except VolcanoError:
            pass  # its lease lapsed while frozen: with_lock says so on the way out
    store.close()


if __name__ == "__main__":
    main()
