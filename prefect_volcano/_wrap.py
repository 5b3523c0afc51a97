"""Wrapping a task's or a flow's function so that every run of it holds the lock around the body.

The wrapper replaces the function (above or below `@task`/`@flow`), so everything Prefect does
around the function (retries, caching, `.submit()`, `.map()`, timeouts) keeps working and every
attempt runs the body inside its own lease.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast, overload

from prefect import State
from prefect.flows import Flow
from prefect.tasks import Task

from prefect_volcano._context import lease_info, lease_scope
from prefect_volcano._hold import Holding, hold, hold_async
from prefect_volcano._report import Scope
from prefect_volcano._spec import LockSpec, check_ledger_face, check_template_against, render_key
from prefect_volcano.results import LockedResult
from volcano_locks.once import AlreadyDone, validate_business_key

__all__ = ["Decorator"]

F = TypeVar("F", bound=Callable[..., Any])
P = TypeVar("P", bound=Task[Any, Any] | Flow[Any, Any])


class Decorator:
    """Applies one checked lock spec to a task (`locked_task`) or a flow (`locked_flow`) or a function."""

    __slots__ = ("_scope", "_spec")

    def __init__(self, spec: LockSpec, scope: Scope) -> None:
        self._spec = spec
        self._scope = scope

    @overload
    def __call__(self, obj: P) -> P: ...

    @overload
    def __call__(self, obj: F) -> F: ...

    def __call__(self, obj: Any) -> Any:
        other = Flow if self._scope == "task" else Task
        if isinstance(obj, other):
            raise TypeError(
                f"locked_{self._scope} decorates {self._scope}s or functions, not {other.__name__.lower()}s;"
                f" use locked_{'flow' if self._scope == 'task' else 'task'} for that"
            )
        if isinstance(obj, Task | Flow):
            return _lock_object(obj, self._spec, self._scope)
        if callable(obj):
            return _lock_function(obj, self._spec, self._scope)
        raise TypeError(
            f"locked_{self._scope} expects a {self._scope} or a function, got {type(obj).__name__}"
        )


def _lock_object(obj: P, spec: LockSpec, scope: Scope) -> P:
    """Return a copy of the task or flow whose function runs under the lock; every option is kept."""
    wrapped = _lock_function(obj.fn, spec, scope)
    # A copy, not with_options(): it keeps subclasses (asset tasks) and every option as set.
    locked = copy.copy(obj)
    if isinstance(locked, Task):
        locked.tags = set(locked.tags)  # the copy must not share mutable options with the original
    locked.fn = wrapped
    locked.__wrapped__ = wrapped  # type: ignore[union-attr]
    return locked


def _lock_function(fn: Callable[..., Any], spec: LockSpec, scope: Scope) -> Callable[..., Any]:
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(f"locked_{scope} cannot lock generator function {fn.__qualname__!r}")
    signature = inspect.signature(fn)
    check_template_against(spec.key, signature, fn)
    if spec.once_key is not None:
        check_template_against(spec.once_key, signature, fn, validate_business_key)
        check_ledger_face(spec.ledger, inspect.iscoroutinefunction(fn), fn)

    def keys(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, str | None]:
        key = render_key(spec.key, signature, args, kwargs)
        if spec.once_key is None:
            return key, None
        return key, render_key(spec.once_key, signature, args, kwargs, validate_business_key)

    if inspect.iscoroutinefunction(fn):
        async_fn = cast(Callable[..., Awaitable[Any]], fn)

        @functools.wraps(fn)
        async def async_locked(*args: Any, **kwargs: Any) -> Any:
            key, once_key = keys(args, kwargs)
            value: Any = None
            async with hold_async(spec, key, scope, once_key) as holding:
                if (guard := holding.body_guard) is not None:
                    with lease_scope(guard):
                        try:
                            value = await async_fn(*args, **kwargs)
                        except AlreadyDone as exc:  # recorded first by a run the look-up did not see
                            holding.duplicated(exc.record)
            return _outcome(holding, value)

        wrapper: Callable[..., Any] = async_locked
    else:

        @functools.wraps(fn)
        def sync_locked(*args: Any, **kwargs: Any) -> Any:
            key, once_key = keys(args, kwargs)
            value: Any = None
            with hold(spec, key, scope, once_key) as holding:
                if (guard := holding.body_guard) is not None:
                    with lease_scope(guard):
                        try:
                            value = fn(*args, **kwargs)
                        except AlreadyDone as exc:  # recorded first by a run the look-up did not see
                            holding.duplicated(exc.record)
            return _outcome(holding, value)

        wrapper = sync_locked
    # Prefect 3.9+ derives the task key from the user's function through this attribute (the cache's
    # source hash follows __wrapped__ on every version); older ones derive it from the wrapper.
    wrapper.__prefect_task_source__ = fn  # type: ignore[attr-defined]
    return wrapper


def _outcome(holding: Holding, value: Any) -> Any:
    """What the wrapped function returns: the value (or a `LockedResult`), or the Skipped state.

    A skipped run's body never ran, so it has no value: the wrapper always returns the Completed
    state named Skipped, and Prefect makes it the run's final state. A duplicate (its business key
    already done) is skipped too, and its state holds the first run's recorded result. What a caller
    then sees is Prefect's rule for a returned state: a task call hands the state to its caller
    (`state.result()`: None, or a duplicate's recorded result), a flow call returns the state's
    result; `return_state=True` gives the state in both.
    `is_skipped()` tells a skip from a value.
    """
    if holding.skipped is not None:
        return holding.skipped
    lease = holding.lease
    if holding.spec.result == "locked_result" and lease is not None and not isinstance(value, State):
        return LockedResult(value=value, lease=lease_info(lease))
    return value
