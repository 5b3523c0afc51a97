"""Calling the task's callable with the lease's public facts (``volcano_lease``), also pushed to XCom."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from airflow.sdk.definitions.context import context_merge

from airflow_provider_volcano._compat import determine_kwargs

if TYPE_CHECKING:
    from airflow.sdk import Context

    from volcano_locks import LockLease

__all__ = ["LEASE_KWARG", "LEASE_XCOM_KEY", "call_with_lease"]

LEASE_XCOM_KEY = "volcano_lease"
LEASE_KWARG = "volcano_lease"


def call_with_lease(
    python_callable: Callable[..., Any],
    op_args: Collection[Any],
    op_kwargs: Mapping[str, Any],
    context: Context,
    lease: LockLease,
    once: Any = None,
) -> Any:
    """Push the lease's public facts to XCom and call ``python_callable`` as Airflow calls it.

    The callable gets the facts as ``volcano_lease`` if it has that parameter; the ownership token is
    never among them. With ``once`` (``once_key=``), it gets the business key bound to the lease as
    ``volcano_once`` if it has that parameter.
    """

    facts = lease.public_dict()
    context["ti"].xcom_push(key=LEASE_XCOM_KEY, value=facts)
    extra = {LEASE_KWARG: facts} if once is None else {LEASE_KWARG: facts, "volcano_once": once}
    context_merge(context, op_kwargs, **extra)
    kwargs = determine_kwargs(python_callable, op_args, context)
    return python_callable(*op_args, **kwargs)
