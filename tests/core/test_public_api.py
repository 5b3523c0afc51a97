"""The public surface: ``__all__`` sorted and complete, and the Volcano SDK's front door.

The SDK snippets below are copied verbatim from Volcano's Python SDK guide; only the import line is
changed, which is the promise. The guide is kept in the repository (``sdk_guide/python.txt``, a verbatim
copy of the source document ``seeds/004_6c6ef96458208e8a.txt`` the project was created from), so the
check that the snippets are its own words runs wherever the suite runs.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import volcano_locks
from volcano_locks.server.harness import LocalServer

GUIDE = Path(__file__).with_name("sdk_guide") / "python.txt"

SNIPPETS = [
    """import os

from volcano_sdk import VolcanoClient

client = VolcanoClient(
    anon_key=os.environ["VOLCANO_ANON_KEY"],
    service_key=os.environ["VOLCANO_SERVICE_KEY"],
    api_url=os.environ.get("VOLCANO_API_URL", "https://api.volcano.dev"),
)
lease = client.locks.acquire("daily-report", ttl=30)
try:
    print("Lease acquired", lease.fencing_token)
finally:
    client.locks.release("daily-report", lease)
""",
    """state = client.locks.get("daily-report")
print(state.held, state.expires_at, state.fencing_token)

lease = client.locks.acquire("daily-report", ttl=30)
try:
    lease = client.locks.renew("daily-report", lease, ttl=60)
finally:
    client.locks.release("daily-report", lease)
""",
    """with client.locks.with_lock("daily-report", ttl=30) as guard:
    print("Current fence", guard.lease.fencing_token)
    if guard.lost:
        raise RuntimeError("Lock ownership was lost")
""",
    """from uuid import uuid4

owner_token = str(uuid4())
request_id = str(uuid4())
lease = client.locks.acquire(
    "daily-report", ttl=30, token=owner_token, request_id=request_id
)
""",
]


def test_all_is_sorted_and_complete() -> None:
    public = [
        name
        for name in dir(volcano_locks)  # the names loaded on first use too
        if not name.startswith("_") and not inspect.ismodule(getattr(volcano_locks, name))
    ]
    assert volcano_locks.__all__ == sorted(public)
    with pytest.raises(AttributeError, match="VolcanoLock'"):
        volcano_locks.VolcanoLock  # type: ignore[attr-defined]  # noqa: B018


def test_importing_the_package_for_its_rules_imports_no_client() -> None:
    """A DAG file that only validates a key (or builds a lease) pays for neither httpx nor the clients."""
    code = (
        "import sys\n"
        "from volcano_locks import LockLease, validate_key, validate_ttl, validate_wait_timeout\n"
        "import volcano_locks\n"
        "validate_key('a'); validate_ttl(30); validate_wait_timeout(None)\n"
        "assert volcano_locks.LockContention.__name__ == 'LockContention'\n"
        "print(sorted(m for m in ('httpx', 'httpcore', 'volcano_locks.client') if m in sys.modules))\n"
        "print(volcano_locks.VolcanoLocks.__module__, 'httpx' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["[]", "volcano_locks.client True"]


@pytest.fixture
def sdk_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalServer]:
    """A server of its own (the snippets use the fixed key "daily-report") and the SDK's variables."""
    with LocalServer(db=str(tmp_path / "sdk.sqlite3"), admin=True) as srv:
        for name, value in srv.env().items():
            monkeypatch.setenv(name, value)
        yield srv


def test_the_sdk_snippets_run_with_only_the_import_changed(
    sdk_env: LocalServer, capsys: pytest.CaptureFixture[str]
) -> None:
    guide = GUIDE.read_text(encoding="utf-8")
    for snippet in SNIPPETS:  # the copies above are the guide's own words, each one block of it
        assert snippet.strip() in guide, snippet
    namespace: dict[str, object] = {}
    for snippet in SNIPPETS:
        code = snippet.replace(
            "from volcano_sdk import VolcanoClient", "from volcano_locks import VolcanoClient"
        )
        exec(compile(code, "<seed snippet>", "exec"), namespace)
    client = namespace["client"]
    assert isinstance(client, volcano_locks.VolcanoClient)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("Lease acquired ") and out[2].startswith("Current fence ")
    assert out[1].startswith("False ")  # get: free again after the first snippet released it
    # The last snippet keeps its caller-made identifiers verbatim, and the lease is really held.
    lease = namespace["lease"]
    assert isinstance(lease, volcano_locks.LockLease) and lease.token == namespace["owner_token"]
    state = client.locks.get("daily-report")  # type: ignore[attr-defined]
    assert state.held and state.fencing_token == lease.fencing_token
    requests = [r for r in sdk_env.requests() if r.get("request_id") == namespace["request_id"]]
    assert [r["op"] for r in requests] == ["acquire"]
    client.locks.force_release("daily-report")  # type: ignore[attr-defined]  # the guide's recovery call
    assert not client.locks.get("daily-report").held  # type: ignore[attr-defined]
    client.close()  # type: ignore[attr-defined]
    assert os.environ["VOLCANO_SERVICE_KEY"] not in repr(client)
