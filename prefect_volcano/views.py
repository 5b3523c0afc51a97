"""Looking at a lock from anywhere: read it once and correct its view (the lock's artifact) if stale.

A lock's view is rewritten whenever a run's lock changes hands or its holder ends, and corrected by
every answer of the lock server a run gets (see `_board`). A lock nobody uses again would keep the
last record forever, and a holder that crashed cannot write; `refresh_lock_view` is the look that
settles such a lock: one `GET /locks/{key}` (one request of the project's 600 a minute, through the
core's governor) compared with the record. Run it by hand, or schedule `flows/lock_views.py`.
"""

from __future__ import annotations

from prefect_volcano._board import LockBoard
from prefect_volcano._spec import CredentialSource
from prefect_volcano.credentials import VolcanoCredentials, sync_client_for
from volcano_locks import LockState, validate_key

__all__ = ["refresh_lock_view"]


def refresh_lock_view(key: str, *, credentials: VolcanoCredentials | str | None = None) -> LockState:
    """Read lock `key` once and correct its view if the view says otherwise; return what was read.

    Args:
        key: The lock key.
        credentials: A `VolcanoCredentials` block, a saved block's name, or None (the environment).

    Returns:
        The lock's state as the lock server answered.
    """
    validate_key(key)
    with sync_client_for(CredentialSource(credentials).get()) as client:
        state = client.get(key)
        board = LockBoard(key, client.project)
    board.look(state)
    board.close()
    return state
