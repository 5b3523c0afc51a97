"""Who may see which locks on the board and force-release which lease: Airflow's own DAG permissions.

The board asks Airflow's auth manager, never a record or a query string: a user reads the locks of the
DAGs they may read (``GET`` on the DAG) and force-releases a lease when they may edit (``PUT``) the DAG
of its sealed provenance record, or every DAG when that holder is unknown or its record is unsealed
(anyone who may write a Variable could have written it). A ``dag_id`` filter only narrows what the user
may already read. Every decision here is taken before the board sends Volcano anything.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from airflow_provider_volcano.plugins.board import LockRow

__all__ = ["Access"]


@dataclass(frozen=True)
class Access:
    """What one signed-in user may read and edit, as Airflow's auth manager answers.

    :param user: the user's name (for pages and the audit log).
    :param read_all: may read every DAG (Airflow's ``DAGs`` resource, no DAG named).
    :param edit_all: may edit every DAG.
    :param readable: the deployment's DAGs the user may read.
    :param editable: the deployment's DAGs the user may edit.
    """

    user: str
    read_all: bool
    edit_all: bool
    readable: frozenset[str]
    editable: frozenset[str]

    @classmethod
    def of(cls, user: Any, session: Session) -> Access:
        """Ask the api-server's auth manager about ``user`` (one call per method, plus the DAG lists)."""
        from airflow.api_fastapi.app import get_auth_manager

        manager = get_auth_manager()

        def every(method: str) -> bool:
            return bool(manager.is_authorized_dag(method=method, user=user, details=None))  # type: ignore[arg-type]

        read_all, edit_all = every("GET"), every("PUT")
        readable = manager.get_authorized_dag_ids(user=user, method="GET", session=session)
        editable = manager.get_authorized_dag_ids(user=user, method="PUT", session=session)
        return cls(user.get_name(), read_all, edit_all, frozenset(readable), frozenset(editable))

    @property
    def reads_any(self) -> bool:
        """May read at least one DAG (else the board is refused, like Airflow's DAG list)."""
        return self.read_all or bool(self.readable)

    @property
    def edits_any(self) -> bool:
        """May edit at least one DAG (else no force release is ever allowed: a Viewer)."""
        return self.edit_all or bool(self.editable)

    def may_read(self, dag_id: str) -> bool:
        """May read DAG ``dag_id``."""
        return self.read_all or dag_id in self.readable

    def may_edit(self, dag_id: str | None) -> bool:
        """May edit DAG ``dag_id`` (``None``: the DAG is unknown, so every DAG)."""
        return self.edit_all or (dag_id is not None and dag_id in self.editable)

    def sees(self, row: LockRow, dag_filter: str | None = None) -> bool:
        """The lock is on this user's board: one of its DAGs is readable (and is ``dag_filter``, if given).

        A lock's DAGs are those that name its key, wait for it, and the DAG of its sealed provenance;
        a lock with none of them (held from outside the deployment) is for users who read every DAG.
        """
        dags = row.dags()
        if dag_filter is not None:
            return dag_filter in dags and self.may_read(dag_filter)
        return self.read_all or any(self.may_read(d) for d in dags)

    def redact(self, row: LockRow) -> LockRow:
        """The row as this user may see it: other DAGs' holder, waiters and names left out, counted, and
        the history's holders of other DAGs unnamed."""
        if self.read_all:
            return row
        holder = row.holder
        hidden_holder = holder is not None and not self.may_read(holder.dag_id)
        waiters = [w for w in row.waiters if self.may_read(w.dag_id)]
        tenures = [replace(t, hidden=not self.may_read(t.record.dag_id)) for t in row.tenures]
        return replace(
            row,
            tenures=tenures,
            holder=None if hidden_holder else holder,
            holder_hidden=hidden_holder,
            waiters=waiters,
            hidden_waiters=row.hidden_waiters + len(row.waiters) - len(waiters),
            named_by={d for d in row.named_by if self.may_read(d)},
        )
