"""Run once per business key in a locked task (``once_key=``): look the key up under the lease, skip a
duplicate naming the first run (its recorded result in XCom), hand the key to the callable.

Imported with the operator (``volcano_locks.once`` adds about 5 ms once Airflow is loaded). The ledger
is the core's (``volcano_locks.once``): a ``SQLLedger`` or ``S3Ledger`` (or a callable returning one,
built on the worker); the callable does its effect through its ``volcano_once`` parameter
(``with volcano_once.begin() as effect:``), which records the key in the same transaction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_volcano._compat import AirflowSkipException
from volcano_locks.once import Who, validate_business_key

if TYPE_CHECKING:
    from airflow.sdk import Context

    from volcano_locks import LockLease
    from volcano_locks.once import OnceRecord

__all__ = ["ONCE_KWARG", "bound_once", "check_once", "skip_duplicate", "task_who"]

ONCE_KWARG = "volcano_once"


def check_once(once_key: object, ledger: object) -> None:
    """``once_key`` and ``ledger`` go together; a literal key is checked at parse time."""
    if once_key is None and ledger is None:
        return
    if once_key is None or ledger is None:
        given, missing = ("once_key", "ledger") if ledger is None else ("ledger", "once_key")
        raise ValueError(
            f"{given} needs {missing}: the business key and the run-once ledger it is recorded in"
        )
    if not (callable(getattr(ledger, "once", None)) or callable(ledger)):
        raise TypeError(
            f"ledger must be a run-once ledger or a callable returning one, got {type(ledger).__name__}"
        )
    if not isinstance(once_key, str):
        raise TypeError(
            f"once_key must be a string (a template is rendered per run), got {type(once_key).__name__}"
        )
    if "{{" not in once_key and "{%" not in once_key:
        validate_business_key(once_key)


def task_who(context: Context) -> Who:
    """This task try, as a run-once record names it (ids only)."""
    ti = context["ti"]
    map_index = getattr(ti, "map_index", -1)
    return Who.of(
        "airflow",
        dag_id=ti.dag_id,
        run_id=ti.run_id,
        task_id=ti.task_id,
        try_number=ti.try_number,
        map_index=map_index if isinstance(map_index, int) and map_index >= 0 else None,
    )


def bound_once(ledger: Any, once_key: str, context: Context, lease: LockLease) -> Any:
    """The business key on ``ledger``, done by this try, bound to ``lease``."""
    if not callable(getattr(ledger, "once", None)):
        ledger = ledger()  # built on the worker
    return ledger.once(validate_business_key(once_key), who=task_who(context)).bound(lease)


def skip_duplicate(context: Context, record: OnceRecord) -> AirflowSkipException:
    """Push the first run's recorded result as this task's XCom ``return_value``; the skip naming it."""
    context["ti"].xcom_push(key="return_value", value=record.result)
    return AirflowSkipException(f"Duplicate run, the callable did not run: {record.describe()}")
