"""`locked_task`: run a Prefect task alone across every worker by holding a Volcano project lock.

The decorator wraps the task's function (above or below `@task`), so everything Prefect
does around the function (retries, caching, `.submit()`, `.map()`, timeouts) keeps working
and every attempt runs the body inside its own lease.
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import re
import string
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast, overload

from prefect import State
from prefect.exceptions import MissingContextError
from prefect.flows import Flow
from prefect.logging import get_run_logger
from prefect.states import Completed
from prefect.tasks import Task
from prefect.transactions import get_transaction

from prefect_volcano._context import LeaseSource, _active, lease_info
from prefect_volcano.credentials import VolcanoCredentials, async_client_for, sync_client_for
from prefect_volcano.results import LockedResult
from volcano_locks import InvalidRequest, LockContention, LockLease, OwnershipLost, VolcanoError, WaitTimeout

__all__ = ["SKIPPED_STATE_NAME", "KeySpec", "OnContention", "ResultMode", "locked_task"]

OnContention = Literal["wait", "skip", "fail"]
ResultMode = Literal["value", "locked_result"]
KeySpec = str | Callable[[dict[str, Any]], str]
"""A lock key: a fixed key, a `str.format` template over the task's parameters, or a callable
taking the task's bound parameters (a dict) and returning the key."""

SKIPPED_STATE_NAME = "Skipped"

F = TypeVar("F", bound=Callable[..., Any])

_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_KEY_CHARS = re.compile(r"^[A-Za-z0-9._:-]*$")
_MIN_TTL, _MAX_TTL = 5, 7_776_000
_POLICIES: tuple[str, ...] = ("wait", "skip", "fail")
_RESULT_MODES: tuple[str, ...] = ("value", "locked_result")
# Our "fail" is the core's "raise": we turn the contention into a clear task failure.
_CORE_POLICY: dict[str, Literal["raise", "wait", "skip"]] = {"wait": "wait", "skip": "skip", "fail": "raise"}

_fallback_logger = logging.getLogger("prefect_volcano")


@dataclass(frozen=True)
class _LockSpec:
    """The validated arguments of one `locked_task(...)` application."""

    key: KeySpec
    ttl: int
    credentials: VolcanoCredentials | str | None
    on_contention: OnContention
    wait_timeout: float | None
    result: ResultMode


def locked_task(
    key: KeySpec,
    ttl: int = 30,
    *,
    credentials: VolcanoCredentials | str | None = None,
    on_contention: OnContention = "wait",
    wait_timeout: float | None = None,
    result: ResultMode = "value",
) -> _Decorator:
    """Make a Prefect task run only while it holds the Volcano lock `key`.

    Works above or below `@task`, on sync and async functions. Each run (and each retry)
    takes a new lease, renewed while the body runs and released when it ends, whatever
    the outcome. Inside the body, `current_lease()` gives the lease's fencing token.

    Args:
        key: The lock key; a `str.format` template over the task's parameters
            (`"rollup:{region}"`), or a callable taking the bound parameters (a dict)
            and returning the key. Rendered keys are validated when the task runs.
        ttl: Lease TTL in seconds (5 through 7,776,000); the lease is renewed at about a third of it.
        credentials: A `VolcanoCredentials` block, the name of a saved one, or None to read
            `VOLCANO_API_URL` / `VOLCANO_SERVICE_KEY` / `VOLCANO_ANON_KEY` from the environment.
        on_contention: What to do when another run holds the lock: `"wait"` until it is free
            (bounded by `wait_timeout`), `"skip"` (the task ends Completed, named Skipped, not
            cached), or `"fail"` (the task fails with `LockContention`).
        wait_timeout: Seconds to wait with `on_contention="wait"`; None waits without bound.
        result: `"value"` returns the body's value; `"locked_result"` returns a `LockedResult`
            carrying the value, the lock key and the fencing token.

    Returns:
        A decorator for a task or a function.

    Raises:
        TypeError: An argument has the wrong type.
        ValueError: An argument has an invalid value (named in the message).

    Example:
        ```python
        from prefect import flow, task
        from prefect_volcano import current_lease, locked_task

        @locked_task("rollup:{region}", ttl=60, on_contention="skip")
        @task(retries=2)
        def rollup(region: str) -> int:
            return write_rollup(region, fencing_token=current_lease().fencing_token)
        ```
    """
    spec = _LockSpec(
        key=_check_key_spec(key),
        ttl=_check_ttl(ttl),
        credentials=_check_credentials(credentials),
        on_contention=cast(OnContention, _check_choice("on_contention", on_contention, _POLICIES)),
        wait_timeout=_check_wait_timeout(wait_timeout, on_contention),
        result=cast(ResultMode, _check_choice("result", result, _RESULT_MODES)),
    )
    return _Decorator(spec)


class _Decorator:
    """Applies one validated lock spec to a task or a function."""

    __slots__ = ("_spec",)

    def __init__(self, spec: _LockSpec) -> None:
        self._spec = spec

    @overload
    def __call__(self, obj: Task[Any, Any]) -> Task[Any, Any]: ...

    @overload
    def __call__(self, obj: F) -> F: ...

    def __call__(self, obj: Any) -> Any:
        if isinstance(obj, Flow):
            raise TypeError(
                "locked_task decorates tasks or functions, not flows; lock a task inside the flow instead"
            )
        if isinstance(obj, Task):
            return _lock_task_object(obj, self._spec)
        if callable(obj):
            return _lock_function(obj, self._spec)
        raise TypeError(f"locked_task expects a task or a function, got {type(obj).__name__}")


# ---------------------------------------------------------------- validation at decoration time


def _check_key_spec(key: object) -> KeySpec:
    if callable(key):
        return cast(Callable[[dict[str, Any]], str], key)
    if not isinstance(key, str):
        raise TypeError(f"key must be a string, a template string or a callable, got {type(key).__name__}")
    if "{" not in key and "}" not in key:
        _check_rendered_key(key, template=None)  # a fixed key: check it now, completely
    else:
        _template_fields(key)
    return key


def _template_fields(template: str) -> list[str]:
    """Return the root parameter names a key template uses, checking its syntax and literal parts."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"key template {template!r} is malformed: {exc}") from None
    roots: list[str] = []
    for literal, field, _spec, _conv in parsed:
        if not _KEY_CHARS.match(literal):
            raise ValueError(
                f"key template {template!r} has characters a lock key cannot hold"
                " (allowed: letters, digits, '.', '_', ':', '-')"
            )
        if field is None:
            continue
        root = re.split(r"[.\[]", field, maxsplit=1)[0]
        if not root.isidentifier():
            raise ValueError(
                f"key template {template!r} must name the task's parameters, e.g. 'rollup:{{region}}'"
            )
        roots.append(root)
    return roots


def _check_ttl(ttl: object) -> int:
    if isinstance(ttl, bool) or not isinstance(ttl, int):
        raise TypeError(f"ttl must be an integer number of seconds, got {ttl!r}")
    if not _MIN_TTL <= ttl <= _MAX_TTL:
        raise ValueError(f"ttl must be between {_MIN_TTL} and {_MAX_TTL} seconds, got {ttl}")
    return ttl


def _check_credentials(credentials: object) -> VolcanoCredentials | str | None:
    if credentials is None or isinstance(credentials, VolcanoCredentials):
        return credentials
    if isinstance(credentials, str):
        if not credentials.strip():
            raise ValueError("credentials must name a saved VolcanoCredentials block, got an empty string")
        return credentials
    raise TypeError(
        "credentials must be a VolcanoCredentials block, a saved block's name or None,"
        f" got {type(credentials).__name__}"
    )


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return str(value)


def _check_wait_timeout(wait_timeout: object, on_contention: object) -> float | None:
    if wait_timeout is None:
        return None
    if isinstance(wait_timeout, bool) or not isinstance(wait_timeout, int | float):
        raise TypeError(f"wait_timeout must be a number of seconds or None, got {wait_timeout!r}")
    if not wait_timeout >= 0:
        raise ValueError(f"wait_timeout must be >= 0 seconds, got {wait_timeout!r}")
    if on_contention != "wait":
        raise ValueError(f"wait_timeout applies only to on_contention='wait', not {on_contention!r}")
    return float(wait_timeout)


def _check_rendered_key(key: object, template: object) -> str:
    if isinstance(key, str) and _KEY_RE.match(key):
        return key
    origin = f" (from {template!r})" if template is not None else ""
    raise InvalidRequest(
        f"lock key {key!r}{origin} is invalid: 1-128 characters, letters, digits, '.', '_', ':', '-',"
        " starting with a letter or digit"
    )


# ---------------------------------------------------------------- wrapping


def _lock_task_object(task_obj: Task[Any, Any], spec: _LockSpec) -> Task[Any, Any]:
    """Return a copy of the task whose function runs under the lock; every task option is kept."""
    wrapped = _lock_function(task_obj.fn, spec)
    # A copy, not with_options(): it keeps subclasses (asset tasks) and every option as set.
    locked = copy.copy(task_obj)
    locked.tags = set(task_obj.tags)  # the copy must not share mutable options with the original
    locked.fn = wrapped
    locked.__wrapped__ = wrapped  # type: ignore[attr-defined]
    return locked


def _lock_function(fn: Callable[..., Any], spec: _LockSpec) -> Callable[..., Any]:
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(f"locked_task cannot lock generator function {fn.__qualname__!r}")
    signature = inspect.signature(fn)
    if isinstance(spec.key, str):
        _check_template_against(spec.key, signature, fn)

    if inspect.iscoroutinefunction(fn):
        async_fn = cast(Callable[..., Awaitable[Any]], fn)

        @functools.wraps(fn)
        async def async_locked(*args: Any, **kwargs: Any) -> Any:
            return await _run_async(async_fn, spec, signature, args, kwargs)

        wrapper: Callable[..., Any] = async_locked
    else:

        @functools.wraps(fn)
        def sync_locked(*args: Any, **kwargs: Any) -> Any:
            return _run_sync(fn, spec, signature, args, kwargs)

        wrapper = sync_locked
    # Prefect derives the task key and the cache's source hash from the user's function.
    wrapper.__prefect_task_source__ = fn  # type: ignore[attr-defined]
    return wrapper


def _check_template_against(template: str, signature: inspect.Signature, fn: Callable[..., Any]) -> None:
    params = signature.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return  # any name may arrive through **kwargs; checked when the task runs
    missing = [root for root in _template_fields(template) if root not in params]
    if missing:
        raise ValueError(
            f"key template {template!r} uses {', '.join(map(repr, missing))}, which"
            f" {getattr(fn, '__qualname__', fn)!r} has no parameter of that name"
            f" (parameters: {', '.join(params) or 'none'})"
        )


def _render_key(
    spec: _LockSpec, signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> str:
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    parameters = dict(bound.arguments)
    for p in signature.parameters.values():
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            parameters.update(parameters.pop(p.name, {}))
    if callable(spec.key):
        return _check_rendered_key(spec.key(parameters), template=getattr(spec.key, "__qualname__", None))
    try:
        rendered = spec.key.format_map(parameters)
    except (KeyError, AttributeError, IndexError, ValueError) as exc:
        raise InvalidRequest(f"key template {spec.key!r} cannot be rendered: {exc!r}") from None
    return _check_rendered_key(rendered, template=spec.key)


def _logger() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    try:
        return get_run_logger()
    except MissingContextError:
        return _fallback_logger


def _loss_reporter(
    log: logging.Logger | logging.LoggerAdapter[Any], lock_key: str
) -> Callable[[OwnershipLost], None]:
    def report(exc: OwnershipLost) -> None:
        log.error("Lost ownership of lock %r: %s; interrupting the task body", lock_key, exc)

    return report


def _skipped(lock_key: str, log: logging.Logger | logging.LoggerAdapter[Any]) -> State[None]:
    message = f"Skipped: lock {lock_key!r} is held by another run (on_contention='skip')"
    log.info("%s", message)
    txn = get_transaction()
    if txn is not None:
        # A skip says nothing about the task's inputs: never let it answer a later run from the cache.
        txn.write_on_commit = False
    return Completed(name=SKIPPED_STATE_NAME, message=message)


def _outcome(value: Any, spec: _LockSpec, lease: LockLease) -> Any:
    if spec.result == "locked_result" and not isinstance(value, State):
        info = lease_info(lease)
        return LockedResult(
            value=value,
            lock_key=info.lock_key,
            fencing_token=info.fencing_token,
            acquired_at=info.acquired_at,
            expires_at=info.expires_at,
        )
    return value


@contextmanager
def _held_lock(
    spec: _LockSpec, lock_key: str, log: logging.Logger | logging.LoggerAdapter[Any]
) -> Iterator[Any]:
    """Hold `lock_key` per `spec` around a sync body; yields the core guard (not acquired on skip).

    This is all a sync `locked_task` adds around its function (bench/bench_prefect.py times it).
    """
    credentials = spec.credentials
    if isinstance(credentials, str):
        credentials = cast(VolcanoCredentials, VolcanoCredentials.load(credentials, _sync=True))  # type: ignore[call-arg]
    guard: Any = None
    try:
        with (
            sync_client_for(credentials) as client,
            client.with_lock(
                lock_key,
                spec.ttl,
                on_contention=_CORE_POLICY[spec.on_contention],
                wait_timeout=spec.wait_timeout,
                interrupt=True,
                on_loss=_loss_reporter(log, lock_key),
            ) as guard,
        ):
            if guard.acquired:
                _log_acquired(guard, lock_key, spec, log)
            yield guard
    except VolcanoError as exc:
        _explain_failure(exc, spec, lock_key, guard, log)
        translated = _translated(exc, spec, lock_key, guard)
        if translated is exc:
            raise
        raise translated from exc
    _check_not_lost(guard, lock_key, log)


@asynccontextmanager
async def _held_lock_async(
    spec: _LockSpec, lock_key: str, log: logging.Logger | logging.LoggerAdapter[Any]
) -> AsyncIterator[Any]:
    """Hold `lock_key` per `spec` around an async body (cancelled on loss); yields the core guard."""
    credentials = spec.credentials
    if isinstance(credentials, str):
        credentials = cast(VolcanoCredentials, await VolcanoCredentials.aload(credentials))
    guard: Any = None
    try:
        async with (
            async_client_for(credentials) as client,
            client.with_lock(
                lock_key,
                spec.ttl,
                on_contention=_CORE_POLICY[spec.on_contention],
                wait_timeout=spec.wait_timeout,
                on_loss=_loss_reporter(log, lock_key),
            ) as guard,
        ):
            if guard.acquired:
                _log_acquired(guard, lock_key, spec, log)
            yield guard
    except VolcanoError as exc:
        _explain_failure(exc, spec, lock_key, guard, log)
        translated = _translated(exc, spec, lock_key, guard)
        if translated is exc:
            raise
        raise translated from exc
    _check_not_lost(guard, lock_key, log)


def _run_sync(
    fn: Callable[..., Any],
    spec: _LockSpec,
    signature: inspect.Signature,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    lock_key = _render_key(spec, signature, args, kwargs)
    log = _logger()
    with _held_lock(spec, lock_key, log) as guard:
        if not guard.acquired:
            return _skipped(lock_key, log)
        reset = _active.set(LeaseSource(guard))
        try:
            value = fn(*args, **kwargs)
        finally:
            _active.reset(reset)
        lease = cast(LockLease, guard.lease)
    return _finish(value, spec, lease, lock_key, log)


async def _run_async(
    fn: Callable[..., Awaitable[Any]],
    spec: _LockSpec,
    signature: inspect.Signature,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    lock_key = _render_key(spec, signature, args, kwargs)
    log = _logger()
    async with _held_lock_async(spec, lock_key, log) as guard:
        if not guard.acquired:
            return _skipped(lock_key, log)
        reset = _active.set(LeaseSource(guard))
        try:
            value = await fn(*args, **kwargs)
        finally:
            _active.reset(reset)
        lease = cast(LockLease, guard.lease)
    return _finish(value, spec, lease, lock_key, log)


def _log_acquired(
    guard: Any, lock_key: str, spec: _LockSpec, log: logging.Logger | logging.LoggerAdapter[Any]
) -> None:
    lease = cast(LockLease, guard.lease)
    log.info("Acquired lock %r (fencing token %d, ttl %ds)", lock_key, lease.fencing_token, spec.ttl)


def _ours(exc: VolcanoError, guard: Any) -> bool:
    """Whether `exc` is about our lock, not an error the task body raised (e.g. from a nested lock)."""
    if guard is None or not guard.acquired:
        return True  # we never got in: the error is the acquisition's
    return isinstance(exc, OwnershipLost) and bool(guard.lost)


def _explain_failure(
    exc: VolcanoError,
    spec: _LockSpec,
    lock_key: str,
    guard: Any,
    log: logging.Logger | logging.LoggerAdapter[Any],
) -> None:
    if not _ours(exc, guard):
        return
    if isinstance(exc, OwnershipLost):
        _report_loss(log, lock_key, exc)
    elif isinstance(exc, WaitTimeout):
        log.error("Gave up waiting for lock %r after %ss: %s", lock_key, spec.wait_timeout, exc)
    elif isinstance(exc, LockContention):
        log.error("%s", _contention_message(spec, lock_key, exc))


def _translated(exc: VolcanoError, spec: _LockSpec, lock_key: str, guard: Any) -> VolcanoError:
    """Give a bare contention under on_contention='fail' a message that says what happened."""
    if (_ours(exc, guard) and type(exc) is LockContention) and spec.on_contention == "fail":
        return LockContention(
            _contention_message(spec, lock_key, exc),
            status=exc.status,
            code=exc.code,
            request_id=exc.request_id,
            holder=exc.holder,
        )
    return exc


def _contention_message(spec: _LockSpec, lock_key: str, exc: LockContention) -> str:
    holder = exc.holder
    by = f" (holder's fencing token {holder.fencing_token})" if holder and holder.fencing_token else ""
    return f"lock {lock_key!r} is held by another run{by} and on_contention={spec.on_contention!r}"


def _check_not_lost(guard: Any, lock_key: str, log: logging.Logger | logging.LoggerAdapter[Any]) -> None:
    if guard is not None and guard.lost:
        # Safety over liveness: work that outlived its lease never completes the task.
        loss = guard.loss or OwnershipLost(f"ownership of lock {lock_key!r} was lost while the task ran")
        _report_loss(log, lock_key, loss)
        raise loss


def _finish(
    value: Any,
    spec: _LockSpec,
    lease: LockLease,
    lock_key: str,
    log: logging.Logger | logging.LoggerAdapter[Any],
) -> Any:
    log.info("Released lock %r (fencing token %d)", lock_key, lease.fencing_token)
    return _outcome(value, spec, lease)


def _report_loss(log: logging.Logger | logging.LoggerAdapter[Any], lock_key: str, exc: OwnershipLost) -> None:
    log.error(
        "Lost ownership of lock %r while the task ran (%s); the task fails and a retry takes a new lease",
        lock_key,
        exc,
    )
