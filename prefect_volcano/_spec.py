"""What one `locked_task(...)` or `locked_flow(...)` application holds: its checked arguments and key.

The contract's rules (key grammar, TTL bounds) are the core's: every check here calls
`volcano_locks.protocol`, so a bad value gets the same message here as from the client.
"""

from __future__ import annotations

import inspect
import re
import string
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from prefect_volcano.credentials import VolcanoCredentials
from volcano_locks import InvalidRequest, validate_key, validate_ttl, validate_wait_timeout
from volcano_locks.once import validate_business_key

__all__ = [
    "KeySpec",
    "LockSpec",
    "OnContention",
    "ResultMode",
    "check_ledger_face",
    "lock_spec",
    "render_key",
]

OnContention = Literal["wait", "skip", "fail"]
ResultMode = Literal["value", "locked_result"]
KeySpec = str | Callable[[dict[str, Any]], str]
"""A lock key: a fixed key, a `str.format` template over the parameters, or a callable
taking the bound parameters (a dict) and returning the key."""

_POLICIES: tuple[str, ...] = ("wait", "skip", "fail")
_RESULT_MODES: tuple[str, ...] = ("value", "locked_result")


class CredentialSource:
    """Where a spec's credentials come from; a saved block named here is loaded once per process.

    Loading a block is a Prefect API round trip (~20 ms), several times a lock's own cost, so the
    first run in a process loads it and later runs reuse it. A block edited in the UI is seen by
    processes started after the edit (Prefect workers start a process per flow run).
    """

    def __init__(self, credentials: VolcanoCredentials | str | None) -> None:
        self._given = credentials
        self._loaded: VolcanoCredentials | None = (
            credentials if isinstance(credentials, VolcanoCredentials) else None
        )
        self._lock = threading.Lock()

    @property
    def name(self) -> str | None:
        """The saved block's name, or None when the block or the environment was given."""
        return self._given if isinstance(self._given, str) else None

    def get(self) -> VolcanoCredentials | None:
        """Return the block (loading a named one on first use), or None for the environment."""
        if self._loaded is not None or self.name is None:
            return self._loaded
        with self._lock:
            if self._loaded is None:
                block = VolcanoCredentials.load(self.name, _sync=True)  # type: ignore[call-arg]
                self._loaded = cast(VolcanoCredentials, block)
        return self._loaded

    async def aget(self) -> VolcanoCredentials | None:
        """Async `get`: a named block is loaded with `aload` on first use."""
        if self._loaded is not None or self.name is None:
            return self._loaded
        block = cast(VolcanoCredentials, await VolcanoCredentials.aload(self.name))
        with self._lock:
            if self._loaded is None:
                self._loaded = block
        return self._loaded

    def __repr__(self) -> str:
        given = "environment" if self._given is None else self.name or "block"
        return f"CredentialSource({given!r})"


@dataclass(frozen=True)
class LockSpec:
    """The checked arguments of one `locked_task(...)` or `locked_flow(...)` application."""

    key: KeySpec
    ttl: int
    credentials: CredentialSource = field(compare=False)
    on_contention: OnContention
    wait_timeout: float | None
    result: ResultMode = "value"
    once_key: KeySpec | None = None
    ledger: Any = field(default=None, compare=False)
    """The run-once ledger (``SQLLedger``, ``AsyncSQLLedger`` or ``S3Ledger``) ``once_key`` is recorded in."""


def lock_spec(
    key: object,
    ttl: object,
    credentials: object,
    on_contention: object,
    wait_timeout: object,
    result: object = "value",
    once_key: object = None,
    ledger: object = None,
) -> LockSpec:
    """Check a decorator's arguments where they are written and return the spec.

    Raises:
        TypeError: An argument has the wrong type.
        ValueError: An argument has an invalid value (`InvalidRequest` for the contract's rules).
    """
    return LockSpec(
        key=_check_key_spec(key),
        ttl=validate_ttl(ttl),
        credentials=CredentialSource(_check_credentials(credentials)),
        on_contention=cast(OnContention, _check_choice("on_contention", on_contention, _POLICIES)),
        wait_timeout=_check_wait_timeout(wait_timeout, on_contention),
        result=cast(ResultMode, _check_choice("result", result, _RESULT_MODES)),
        once_key=_check_once(once_key, ledger),
        ledger=ledger,
    )


def _check_once(once_key: object, ledger: object) -> KeySpec | None:
    """``once_key`` and ``ledger`` go together; the key is checked as the core checks a business key."""
    if once_key is None and ledger is None:
        return None
    if once_key is None or ledger is None:
        given, missing = ("once_key", "ledger") if ledger is None else ("ledger", "once_key")
        raise ValueError(
            f"{given} needs {missing}: the business key and the run-once ledger it is recorded in"
        )
    if not callable(getattr(ledger, "once", None)):
        raise TypeError(
            "ledger must be a run-once ledger (SQLLedger, AsyncSQLLedger or S3Ledger of volcano_locks.once), "
            f"got {type(ledger).__name__}"
        )
    return _check_key_spec(once_key, check=validate_business_key)


def _check_key_spec(key: object, check: Callable[[object], str] = validate_key) -> KeySpec:
    if callable(key):
        return cast(Callable[[dict[str, Any]], str], key)
    if not isinstance(key, str):
        raise TypeError(f"key must be a string, a template string or a callable, got {type(key).__name__}")
    if "{" not in key and "}" not in key:
        check(key)  # a fixed key: check it now, completely
    else:
        template_fields(key, check)
    return key


def template_fields(template: str, check: Callable[[object], str] = validate_key) -> list[str]:
    """Return the root parameter names a key template uses, checking its syntax and literal parts."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"key template {template!r} is malformed: {exc}") from None
    roots: list[str] = []
    sample = ""
    for literal, name, _spec, _conv in parsed:
        sample += literal
        if name is None:
            continue
        root = re.split(r"[.\[]", name, maxsplit=1)[0]
        if not root.isidentifier():
            raise ValueError(
                f"key template {template!r} must name the task's parameters, e.g. 'rollup:{{region}}'"
            )
        roots.append(root)
        sample += "x"
    try:
        # The literal parts must fit the core's key grammar around any value a field renders to.
        check(sample)
    except ValueError as exc:
        what = "lock key" if check is validate_key else "business key"
        raise InvalidRequest(f"key template {template!r} cannot make a valid {what}: {exc}") from None
    return roots


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
    bound = validate_wait_timeout(wait_timeout)  # the core's rule: None, or finite seconds >= 0
    if bound is not None and on_contention != "wait":
        raise ValueError(f"wait_timeout applies only to on_contention='wait', not {on_contention!r}")
    return bound


def check_template_against(
    key: KeySpec,
    signature: inspect.Signature,
    fn: Callable[..., Any],
    check: Callable[[object], str] = validate_key,
) -> None:
    """Check that a key template names only parameters `fn` has (when it has no `**kwargs`)."""
    if not isinstance(key, str):
        return
    params = signature.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return  # any name may arrive through **kwargs; checked when the task runs
    missing = [root for root in template_fields(key, check) if root not in params]
    if missing:
        raise ValueError(
            f"key template {key!r} uses {', '.join(map(repr, missing))}, which"
            f" {getattr(fn, '__qualname__', fn)!r} has no parameter of that name"
            f" (parameters: {', '.join(params) or 'none'})"
        )


def render_key(
    key: KeySpec,
    signature: inspect.Signature,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    check: Callable[[object], str] = validate_key,
) -> str:
    """Render the lock key for one call and check it with the core's key rule.

    Raises:
        InvalidRequest: The template cannot be rendered, or renders an invalid key (both named).
    """
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    parameters = dict(bound.arguments)
    for p in signature.parameters.values():
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            parameters.update(parameters.pop(p.name, {}))
    if callable(key):
        return _checked(key(parameters), getattr(key, "__qualname__", None), check)
    try:
        rendered = key.format_map(parameters)
    except (KeyError, AttributeError, IndexError, ValueError) as exc:
        raise InvalidRequest(f"key template {key!r} cannot be rendered: {exc!r}") from None
    return _checked(rendered, key, check)


def _checked(rendered: object, origin: object, check: Callable[[object], str]) -> str:
    try:
        return check(rendered)
    except ValueError as exc:
        if origin is None:
            raise
        raise InvalidRequest(f"{exc} (rendered from key {origin!r})") from None


def check_ledger_face(ledger: Any, is_async: bool, fn: Callable[..., Any]) -> None:
    """An async body needs an async ledger (``AsyncSQLLedger``), a sync one a sync ledger (the others)."""
    from volcano_locks.once import AsyncSQLLedger

    if ledger is None or isinstance(ledger, AsyncSQLLedger) == is_async:
        return
    name = getattr(fn, "__qualname__", fn)
    if is_async:
        raise TypeError(
            f"{name!r} is async: its ledger must be an AsyncSQLLedger, got {type(ledger).__name__}"
        )
    raise TypeError(f"{name!r} is sync: its ledger must be a SQLLedger or an S3Ledger, got AsyncSQLLedger")
