"""``@task.volcano_lock``: the TaskFlow form of :class:`VolcanoLockOperator`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.bases.decorator import DecoratedOperator, task_decorator_factory

from airflow_provider_volcano.operators.lock import VolcanoLockOperator

if TYPE_CHECKING:
    from airflow.sdk.bases.decorator import TaskDecorator

__all__ = ["volcano_lock_task"]


class _VolcanoLockDecoratedOperator(DecoratedOperator, VolcanoLockOperator):
    """Runs a decorated function while holding a Volcano lock."""

    template_fields: Sequence[str] = VolcanoLockOperator.template_fields
    template_fields_renderers = VolcanoLockOperator.template_fields_renderers
    custom_operator_name: str = "@task.volcano_lock"

    def __init__(self, *, python_callable: Callable[..., Any], op_args: Any, op_kwargs: Any, **kwargs: Any):
        super().__init__(
            kwargs_to_upstream={
                "python_callable": python_callable,
                "op_args": op_args,
                "op_kwargs": op_kwargs,
            },
            python_callable=python_callable,
            op_args=op_args,
            op_kwargs=op_kwargs,
            **kwargs,
        )


def volcano_lock_task(
    python_callable: Callable[..., Any] | None = None,
    multiple_outputs: bool | None = None,
    **kwargs: Any,
) -> TaskDecorator:
    """Wrap a function into a task that runs while holding a Volcano lock.

    Takes the :class:`VolcanoLockOperator` arguments (``lock_key``, ``ttl``, ``on_contention``,
    ``wait_timeout``, ``deferrable``, ``handoff_ttl``, ``volcano_conn_id``, ...). The function gets
    the lease's public facts through a ``volcano_lease=None`` parameter. With ``lock_group=`` (a
    :class:`~airflow_provider_volcano.operators.group.VolcanoLockGroup`) instead of ``lock_key``, the
    task runs under its group's lease: it checks it when it starts and renews it while it runs.

    :param python_callable: the function to decorate.
    :param multiple_outputs: unroll a dict return value into several XCom values.
    """
    return task_decorator_factory(
        python_callable=python_callable,
        multiple_outputs=multiple_outputs,
        decorated_operator_class=_VolcanoLockDecoratedOperator,
        **kwargs,
    )
