"""The two clients, :class:`VolcanoLocks` and :class:`AsyncVolcanoLocks`: thin I/O shells over ``protocol``.

Both send the calls that the sans-I/O flows in :mod:`volcano_locks.protocol` yield, count every attempt
in ``requests_sent`` and in the process's :class:`~volcano_locks.governor.Governor` for the credential,
so callers can see what the project's 600-a-minute budget paid for.

Each client holds two connection pools, its lanes (:mod:`volcano_locks.transport`): renewals and
releases travel on their own, so no connection or pool slot of theirs is ever taken by a waiter's
read. Both are closed by ``close``/``aclose`` or the context manager.

Every request has a *total* deadline (its timeout covers connecting, sending and the whole response,
not each read: a server dripping bytes cannot hold a call past it) and a response body cap
(:data:`MAX_RESPONSE_BYTES`). The async shell bounds the request with ``asyncio.timeout``; the sync
shell sends it in the caller's own thread with every network wait cut at the deadline. Either way a
request that times out or is cancelled is abandoned with its connection closed: nothing of it runs on
after its caller. An acquisition that ends uncertain or cancelled is released behind its caller
(:mod:`volcano_locks.orphans`) when the client made its token.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from types import TracebackType
from typing import Any, Generic, Self, TypedDict, TypeVar, Unpack, cast

import httpx

from volcano_locks import protocol
from volcano_locks.clock import lease_clock
from volcano_locks.config import ClientConfig, resolve_config
from volcano_locks.errors import OwnershipLost, ProtocolError, RateLimited, TransportError
from volcano_locks.governor import Governor
from volcano_locks.guard import AsyncLockContext, LockContext, OnContention
from volcano_locks.models import LeaseRef, LockLease, LockState
from volcano_locks.orphans import AsyncReaper, Attempt, Orphan, SyncReaper
from volcano_locks.protocol import Call, Flow, Reply
from volcano_locks.telemetry import record
from volcano_locks.transport import (
    DeadlineTransport,
    deadline,
    env_proxy,
    lane_for,
    translate_transport_errors,
)
from volcano_locks.waiting import OnWaiting, WaitPolicy, async_wait_acquire, wait_acquire, wake

__all__ = ["MAX_RESPONSE_BYTES", "AsyncVolcanoLocks", "VolcanoLocks"]

logger = logging.getLogger("volcano_locks.client")

T = TypeVar("T")
_TransportT = TypeVar("_TransportT", httpx.BaseTransport, httpx.AsyncBaseTransport)
_ContextT = TypeVar("_ContextT", LockContext, AsyncLockContext)
_USER_AGENT = "volcano-locks/0.1"
MAX_RESPONSE_BYTES = 64 * 1024
"""The largest response body a client reads; the contract's bodies are a few dozen bytes."""


def _take(body: bytearray, chunk: bytes, call: Call, status: int) -> None:
    """Append ``chunk`` to ``body``, refusing a body over :data:`MAX_RESPONSE_BYTES`."""
    body += chunk
    if len(body) > MAX_RESPONSE_BYTES:
        raise ProtocolError(
            f"{call.op}: response body larger than {MAX_RESPONSE_BYTES} bytes",
            status=status,
            request_id=call.request_id,
        )


class Closing:
    """``with`` for what has a ``close()``: the block's end closes it (the sync client, the SDK's)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close what this holds (each closeable says what)."""
        raise NotImplementedError


class AsyncClosing:
    """``async with`` for what has an ``aclose()`` (the async client, the SDK's)."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close what this holds (each closeable says what)."""
        raise NotImplementedError


class _WaitOptions(TypedDict, total=False):
    """The keyword arguments of both clients' ``wait_acquire`` (see :meth:`VolcanoLocks.wait_acquire`)."""

    timeout: float | None
    token: str | None
    poll: float
    on_waiting: OnWaiting | None
    policy: WaitPolicy | None


class _Run(Generic[T]):
    """One protocol flow being driven: the next call to send (``None`` once done), then the result.

    The decisions both shells make about a flow live here: each call's timeout override, marking an
    acquisition as sent, and handing the flow its reply or the transport failure.
    """

    def __init__(self, flow: Flow[T], attempt: Attempt | None, timeout: float | None) -> None:
        self._flow = flow
        self._attempt = attempt
        self._timeout = timeout
        self.call: Call | None = None
        self.result: T | None = None
        self._resume(partial(next, flow))

    def answer(self, reply: Reply | TransportError) -> None:
        """Hand the flow what the last call got: its reply, or the failure that left it without one."""
        flow = self._flow
        self._resume(
            partial(flow.throw, reply) if isinstance(reply, TransportError) else partial(flow.send, reply)
        )

    def _resume(self, step: Callable[[], Call]) -> None:
        try:
            call = step()
        except StopIteration as stop:
            self.call, self.result = None, cast(T, stop.value)
            return
        if self._timeout is not None:
            call = replace(call, timeout=self._timeout)
        if self._attempt is not None:
            self._attempt.sent = True
        self.call = call


class _Base(Generic[_TransportT, _ContextT]):
    """State, pure helpers and the constructor shared by both shells (no I/O here)."""

    _reaper: SyncReaper | AsyncReaper  # releases acquisitions whose callers gave up (each shell's own)
    _context_type: type[_ContextT]  # what with_lock returns

    def __init__(
        self,
        api_url: str | None = None,
        anon_key: str | None = None,
        service_key: str | None = None,
        *,
        timeout: float = 10.0,
        transport: _TransportT | None = None,
        wait_budget: int | None = None,
    ) -> None:
        self._config: ClientConfig = resolve_config(api_url, anon_key, service_key, timeout)
        self._secrets = tuple(s for s in (self._config.service_key, self._config.anon_key) if s)
        self._sent = 0
        self._sent_lock = threading.Lock()
        self._governor = Governor.for_credential(
            self._config.api_url, self._config.credential_id, wait_budget
        )
        self._closed = False
        self._open(transport)

    def _open(self, transport: _TransportT | None) -> None:
        """Open both lanes on ``transport`` and start the reaper (each shell its own kind)."""
        raise NotImplementedError

    def _lane_options(self) -> dict[str, Any]:
        return {"base_url": self._config.api_url, "headers": self._headers(), "timeout": self._config.timeout}

    @property
    def api_url(self) -> str:
        """The base URL of the Volcano API."""
        return self._config.api_url

    @property
    def timeout(self) -> float:
        """The per-request timeout in seconds."""
        return self._config.timeout

    @property
    def credential_id(self) -> str:
        """A SHA-256 fingerprint of the service key (tells credentials apart; reveals nothing)."""
        return self._config.credential_id

    @property
    def project(self) -> str:
        """The Volcano project of the service key (its ``project_id`` claim; see ``ClientConfig``)."""
        return self._config.project

    @property
    def requests_sent(self) -> int:
        """Every HTTP request attempt this client has sent, retries included."""
        return self._sent

    @property
    def governor(self) -> Governor:
        """This process's request governor for the client's API URL and credential (shared)."""
        return self._governor

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._config.service_key}", "User-Agent": _USER_AGENT}

    def _deadline(self, call: Call) -> float:
        return self._config.timeout if call.timeout is None else call.timeout

    def _count(self, call: Call) -> tuple[float, datetime] | TransportError:
        """Count ``call`` as sent (the time it left), or the error of a client already closed."""
        if self._closed:
            return TransportError(f"{call.op}: the client is closed", request_id=call.request_id)
        with self._sent_lock:
            self._sent += 1
        self._governor.note_sent(call.op)
        record.budget_used(self._governor.window_share())
        return lease_clock(), datetime.now(UTC)

    def _reply(
        self, call: Call, status: int, headers: httpx.Headers, body: bytes, sent: tuple[float, datetime]
    ) -> Reply:
        logger.debug("%s -> %d (request id %s)", call.op, status, call.request_id)
        record.request(call.key, call.op, status)
        reply = Reply(status, headers, body, sent[0], sent[1])
        if status == 429:
            limited = protocol.error_from_reply(call, reply)
            self._governor.note_rate_limited(
                call.op, limited.retry_after if isinstance(limited, RateLimited) else None
            )
        return reply

    def _released(self, lease: LockLease | LeaseRef) -> None:
        if isinstance(lease, LockLease):  # a reference names no tenure this process counted
            record.ended(lease, "released")
        # The lock is free now: this process's waiters on it need not wait for their next look.
        wake(lease.key, api_url=self._config.api_url, credential_id=self._config.credential_id)

    def _unanswered(self, call: Call, error: TransportError) -> TransportError:
        record.request(call.key, call.op, None)
        return error

    @staticmethod
    def _acquired(lease: LockLease) -> LockLease:
        record.acquired(lease)
        return lease

    @contextmanager
    def _acquisition(self, key: str, token: str | None, request_id: str | None) -> Iterator[Attempt]:
        """One acquisition's token and request id; if it ends uncertain, hand it to the clean-up."""
        attempt = Attempt.start(token, request_id)
        try:
            yield attempt
        except BaseException as exc:
            if attempt.abandoned(exc):
                self.abandon(key, attempt.token, attempt.request_id)
            raise

    def _acquire_flow(self, key: str, ttl: int, attempt: Attempt) -> Flow[LockLease]:
        return protocol.acquire_flow(
            key, ttl, token=attempt.token, request_id=attempt.request_id, secrets=self._secrets
        )

    def _renew_within_flow(self, lease: LockLease, timeout: float) -> Flow[LockLease]:
        # A fresh request id, the lease's own TTL.
        return protocol.renew_flow(
            lease.key, lease, None, request_id=None, timeout=timeout, secrets=self._secrets
        )

    def _release_flow(self, lease: LockLease | LeaseRef) -> Flow[None]:
        return protocol.release_flow(lease.key, lease, request_id=None, secrets=self._secrets)

    def _orphan_flow(self, orphan: Orphan) -> Flow[None]:
        return protocol.release_flow(
            orphan.key, LeaseRef(orphan.key, orphan.token), request_id=None, secrets=self._secrets
        )

    def abandon(self, key: str, token: str, request_id: str) -> None:
        """Give up an acquisition of ``key`` whose outcome is unknown: release ``token``'s lease if it lands.

        For callers that made their own token and will not retry (the wait engine when a wait ends
        after an uncertain attempt): the release goes now and on the clean-up schedule, on the
        keeping lane (:mod:`volcano_locks.orphans`), and is ignored once the client is closed.
        """
        self._reaper.add(key, token, request_id)

    def _timed_out(self, call: Call) -> TransportError:
        return TransportError(
            f"{call.op} got no complete response within {self._deadline(call):g} s",
            request_id=call.request_id,
        )

    def with_lock(
        self,
        key: str,
        ttl: int,
        *,
        token: str | None = None,
        request_id: str | None = None,
        on_contention: OnContention = "raise",
        wait_timeout: float | None = None,
        interrupt: bool = False,
        on_loss: Callable[[OwnershipLost], object] | None = None,
        on_waiting: OnWaiting | None = None,
        wait_policy: WaitPolicy | None = None,
        once: object = None,
    ) -> _ContextT:
        """Hold ``key`` for a ``with`` block (``async with``: the async client), renewing in the background.

        The sync client's context yields a :class:`LockGuard` and renews on a named daemon thread; the
        async client's yields an :class:`AsyncLockGuard` and renews in a task named
        ``volcano-lock-keeper:<key>``.

        Args:
            key: The lock key.
            ttl: Lease TTL in seconds; renewed about every ``ttl / 3``.
            token: Ownership token (UUID) for the acquisition; generated when ``None``.
            request_id: Request id (UUID) for the acquisition only; renewals and release use fresh ones.
            on_contention: ``"raise"`` (``LockContention``), ``"wait"`` (``wait_acquire`` up to
                ``wait_timeout``, then ``WaitTimeout``) or ``"skip"`` (``guard.acquired`` is ``False``).
            wait_timeout: Bound for ``on_contention="wait"`` (``None``: no bound).
            interrupt: Sync: raise ``OwnershipLost`` in the thread running the block when loss is
                detected (between bytecodes: a blocking C call finishes first). Async: the block is
                always cancelled on loss, whatever ``interrupt`` says.
            on_loss: Called once, from the keeper thread or task, with the ``OwnershipLost``.
            on_waiting: With ``on_contention="wait"``: called with the last holder seen and the seconds
                waited when the wait starts and about every minute after (e.g. to log it).
            wait_policy: With ``on_contention="wait"``: the backoff of the looks (e.g. slower where
                releases are announced some other way).
            once: A business key on a run-once ledger (``ledger.once(key)``, :mod:`volcano_locks.once`;
                an async ledger's for the async client): looked up once the lock is held.
                ``guard.duplicate`` is then the first run's record (do nothing, return its ``result``),
                and ``guard.once`` the key bound to this lease, to do the effect and record it.

        On exit the keeper is stopped and the latest lease released
        (:func:`volcano_locks.releasing.release_or_lapse`: a release refused for now or unanswered is
        retried while the lease lives, then left to lapse with a warning; it never raises, and
        ``guard.release_outcome`` says which). The block's exception wins; else a renewal failure is
        raised after cleanup; else the ``OwnershipLost`` of a release that found the lease gone. A
        fresh lease with no safe renewal window left is renewed before the block is entered, or
        released with ``OwnershipLost`` (code ``no_safe_window``) and the block is not entered. In the
        async form, loss cancels the task running the block and ``OwnershipLost`` (not
        ``CancelledError``) leaves the ``async with``; a cancellation from elsewhere still propagates
        as ``CancelledError`` after the lease is released.
        """
        context: Callable[..., _ContextT] = self._context_type
        return context(
            self,
            key,
            ttl,
            token=token,
            request_id=request_id,
            on_contention=on_contention,
            wait_timeout=wait_timeout,
            interrupt=interrupt,
            on_loss=on_loss,
            on_waiting=on_waiting,
            wait_policy=wait_policy,
            once=once,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(api_url={self._config.api_url!r})"


class VolcanoLocks(Closing, _Base[httpx.BaseTransport, LockContext]):
    """Synchronous Volcano project locks client.

    Args:
        api_url: Base URL; defaults to ``VOLCANO_API_URL``.
        anon_key: The project's anon key; defaults to ``VOLCANO_ANON_KEY`` (not used by lock calls).
        service_key: A service-role key with ``locks.manage``; defaults to ``VOLCANO_SERVICE_KEY``.
        timeout: Total time a request may take, in seconds (connect, send and the whole response).
        transport: An httpx transport to send through (tests, proxies); both lanes share it. The
            total deadline is then checked between response chunks and each network wait is bounded
            by the request's timeout, but a server that drips a response head is cut only as far as
            that transport cuts it; lane separation of connections is as good as its pooling.
        wait_budget: Requests a minute this process may spend waiting for locks with this credential
            (default ``VOLCANO_WAIT_BUDGET`` or 120; see :mod:`volcano_locks.governor`).

    Raises:
        InvalidRequest: A setting is missing or malformed.

    Example:
        >>> with VolcanoLocks() as locks:                                   # doctest: +SKIP
        ...     with locks.with_lock("daily-rollup", ttl=30) as guard:
        ...         write(fencing_token=guard.fencing_token)
    """

    _reaper: SyncReaper
    _context_type = LockContext

    def _open(self, transport: httpx.BaseTransport | None) -> None:
        if transport is None:
            transport = DeadlineTransport(env_proxy(self._config.api_url))
        self._keeping = httpx.Client(transport=transport, **self._lane_options())
        self._other = httpx.Client(transport=transport, **self._lane_options())
        self._reaper = SyncReaper(self._release_orphan, self._config.timeout)

    def close(self) -> None:
        """Release abandoned acquisitions once more (bounded), then close both connection pools."""
        self._reaper.close()
        self._closed = True
        self._keeping.close()
        self._other.close()

    def _exchange(self, call: Call) -> tuple[int, httpx.Headers, bytes]:
        http = self._keeping if lane_for(call.op) == "keeping" else self._other
        timeout = self._deadline(call)
        ends = time.monotonic() + timeout
        body = bytearray()
        with translate_transport_errors(call.op, call.request_id):
            try:
                with (
                    deadline(ends),
                    http.stream(
                        call.method, call.path, headers=call.headers, content=call.body, timeout=timeout
                    ) as r,
                ):
                    for chunk in r.iter_bytes():
                        _take(body, chunk, call, r.status_code)
                        if time.monotonic() > ends:  # what a caller's own transport is held to
                            raise self._timed_out(call)
                    return r.status_code, r.headers, bytes(body)
            except httpx.TimeoutException:
                # Every wait of the request was cut at its deadline; httpcore closed the connection.
                raise self._timed_out(call) from None

    def _send(self, call: Call) -> Reply | TransportError:
        sent = self._count(call)
        if isinstance(sent, TransportError):
            return sent
        try:
            status, headers, body = self._exchange(call)
        except TransportError as exc:
            return self._unanswered(call, exc)
        return self._reply(call, status, headers, body, sent)

    def _drive(self, flow: Flow[T], attempt: Attempt | None = None, timeout: float | None = None) -> T:
        run = _Run(flow, attempt, timeout)
        while run.call is not None:
            run.answer(self._send(run.call))
        return cast(T, run.result)

    def _release_orphan(self, orphan: Orphan, timeout: float | None) -> None:
        self._drive(self._orphan_flow(orphan), timeout=timeout)

    def acquire(
        self, key: str, ttl: int, *, token: str | None = None, request_id: str | None = None
    ) -> LockLease:
        """Acquire ``key`` for ``ttl`` seconds; retried once (same token, request id) on no reply or 503.

        When the client made the token (``token=None``) and the call ends without a definite answer
        (no response, a timeout, a 503 after the retry, another 5xx, a garbled reply) or is interrupted,
        the lease the server may still grant is released behind the caller, with that token, on the
        keeping lane (:mod:`volcano_locks.orphans`). A caller that supplies ``token`` owns recovery, as
        the contract says: retry with the same token and request id to learn the outcome; the client
        releases nothing for it.

        Raises:
            LockContention: Another live lease holds the key (``OwnershipLost`` if it was this token's).
        """
        with self._acquisition(key, token, request_id) as attempt:
            return self._acquired(self._drive(self._acquire_flow(key, ttl, attempt), attempt))

    def renew(
        self, key: str, lease: LockLease, ttl: int | None = None, *, request_id: str | None = None
    ) -> LockLease:
        """Renew ``lease`` to ``ttl`` seconds from now (default: its TTL); returns the new lease."""
        return self._drive(protocol.renew_flow(key, lease, ttl, request_id=request_id, secrets=self._secrets))

    def renew_within(self, lease: LockLease, timeout: float) -> LockLease:
        """Renew ``lease`` to its TTL with a fresh request id and a request that must finish in ``timeout``.

        This is the lease keeper's call: the timeout is what is left of its safe renewal window.
        """
        return self._drive(self._renew_within_flow(lease, timeout))

    def release(self, key: str, lease: LockLease | LeaseRef, *, request_id: str | None = None) -> None:
        """Release ``lease`` (or a :class:`~volcano_locks.models.LeaseRef`); succeeds if the lock is gone."""
        self._drive(protocol.release_flow(key, lease, request_id=request_id, secrets=self._secrets))
        self._released(lease)

    def release_within(self, lease: LockLease | LeaseRef, timeout: float) -> None:
        """Release ``lease`` with a fresh request id and a request that must finish in ``timeout``.

        One attempt of :func:`volcano_locks.releasing.release_or_lapse`, which bounds it by what is left
        of the lease.
        """
        self._drive(self._release_flow(lease), timeout=timeout)
        self._released(lease)

    def get(self, key: str, *, request_id: str | None = None) -> LockState:
        """Read whether ``key`` is held, with the holder's expiry and fencing token."""
        return self._drive(protocol.get_flow(key, request_id=request_id, secrets=self._secrets))

    def force_release(self, key: str, *, request_id: str | None = None) -> None:
        """Drop whatever lease holds ``key``; safe only where the protected resource checks fencing tokens."""
        self._drive(protocol.force_release_flow(key, request_id=request_id, secrets=self._secrets))

    def wait_acquire(self, key: str, ttl: int, **options: Unpack[_WaitOptions]) -> LockLease:
        """Acquire ``key``, waiting out contention for up to ``timeout`` seconds (``None``: no bound).

        The wait is governed (see :mod:`volcano_locks.waiting`): looks back off from ``poll`` seconds,
        share one poll per key in this process and draw from the process's waiting budget.

        Args:
            key: The lock key.
            ttl: The lease TTL in seconds.
            **options: ``timeout`` (seconds, default ``None``: no bound; ``0``: one attempt), ``token``
                (the ownership token of every attempt; generated when ``None``), ``poll`` (seconds
                before the first look, default 1.0), ``on_waiting(holder, waited)`` (called when the
                wait starts and about every minute after) and ``policy`` (the backoff,
                :class:`~volcano_locks.waiting.WaitPolicy`), all keyword-only.

        Raises:
            WaitTimeout: Still held when ``timeout`` ran out (``.holder`` is the last state seen).
        """
        return wait_acquire(self, key, ttl, **options)


class AsyncVolcanoLocks(AsyncClosing, _Base[httpx.AsyncBaseTransport, AsyncLockContext]):
    """Asynchronous Volcano project locks client; same arguments and method names as :class:`VolcanoLocks`.

    Example:
        >>> async with AsyncVolcanoLocks() as locks:                        # doctest: +SKIP
        ...     async with locks.with_lock("daily-rollup", ttl=30) as guard:
        ...         await write(fencing_token=guard.fencing_token)
    """

    _reaper: AsyncReaper
    _context_type = AsyncLockContext

    def _open(self, transport: httpx.AsyncBaseTransport | None) -> None:
        self._keeping = httpx.AsyncClient(transport=transport, **self._lane_options())
        self._other = httpx.AsyncClient(transport=transport, **self._lane_options())
        self._reaper = AsyncReaper(self._release_orphan, self._config.timeout)

    async def aclose(self) -> None:
        """Release abandoned acquisitions once more (bounded), then close both connection pools."""
        await self._reaper.aclose()
        self._closed = True
        await self._keeping.aclose()
        await self._other.aclose()

    async def _exchange(self, call: Call) -> tuple[int, httpx.Headers, bytes]:
        http = self._keeping if lane_for(call.op) == "keeping" else self._other
        body = bytearray()
        with translate_transport_errors(call.op, call.request_id):
            async with http.stream(
                call.method, call.path, headers=call.headers, content=call.body, timeout=self._deadline(call)
            ) as r:
                async for chunk in r.aiter_bytes():
                    _take(body, chunk, call, r.status_code)
                return r.status_code, r.headers, bytes(body)

    async def _send(self, call: Call) -> Reply | TransportError:
        sent = self._count(call)
        if isinstance(sent, TransportError):
            return sent
        try:
            # On the deadline (or any cancellation) httpcore closes the request's connection.
            async with asyncio.timeout(self._deadline(call)):
                status, headers, body = await self._exchange(call)
        except TimeoutError:
            return self._unanswered(call, self._timed_out(call))
        except TransportError as exc:
            return self._unanswered(call, exc)
        return self._reply(call, status, headers, body, sent)

    async def _drive(self, flow: Flow[T], attempt: Attempt | None = None, timeout: float | None = None) -> T:
        run = _Run(flow, attempt, timeout)
        while run.call is not None:
            run.answer(await self._send(run.call))
        return cast(T, run.result)

    async def _release_orphan(self, orphan: Orphan, timeout: float | None) -> None:
        await self._drive(self._orphan_flow(orphan), timeout=timeout)

    async def acquire(
        self, key: str, ttl: int, *, token: str | None = None, request_id: str | None = None
    ) -> LockLease:
        """Acquire ``key`` for ``ttl`` seconds; retried once (same token, request id) on no reply or 503.

        An uncertain or cancelled acquisition is released behind the caller as in
        :meth:`VolcanoLocks.acquire` (only when the client made the token).
        """
        with self._acquisition(key, token, request_id) as attempt:
            return self._acquired(await self._drive(self._acquire_flow(key, ttl, attempt), attempt))

    async def renew(
        self, key: str, lease: LockLease, ttl: int | None = None, *, request_id: str | None = None
    ) -> LockLease:
        """Renew ``lease`` to ``ttl`` seconds from now (default: its TTL); returns the new lease."""
        return await self._drive(
            protocol.renew_flow(key, lease, ttl, request_id=request_id, secrets=self._secrets)
        )

    async def renew_within(self, lease: LockLease, timeout: float) -> LockLease:
        """Renew ``lease`` to its TTL within ``timeout`` seconds (the keeper's call; see the sync client)."""
        return await self._drive(self._renew_within_flow(lease, timeout))

    async def release(self, key: str, lease: LockLease | LeaseRef, *, request_id: str | None = None) -> None:
        """Release ``lease`` (or a :class:`~volcano_locks.models.LeaseRef`); succeeds if the lock is gone."""
        await self._drive(protocol.release_flow(key, lease, request_id=request_id, secrets=self._secrets))
        self._released(lease)

    async def release_within(self, lease: LockLease | LeaseRef, timeout: float) -> None:
        """Release ``lease`` with a fresh request id and a request that must finish in ``timeout``."""
        await self._drive(self._release_flow(lease), timeout=timeout)
        self._released(lease)

    async def get(self, key: str, *, request_id: str | None = None) -> LockState:
        """Read whether ``key`` is held, with the holder's expiry and fencing token."""
        return await self._drive(protocol.get_flow(key, request_id=request_id, secrets=self._secrets))

    async def force_release(self, key: str, *, request_id: str | None = None) -> None:
        """Drop whatever lease holds ``key``; safe only where the protected resource checks fencing tokens."""
        await self._drive(protocol.force_release_flow(key, request_id=request_id, secrets=self._secrets))

    async def wait_acquire(self, key: str, ttl: int, **options: Unpack[_WaitOptions]) -> LockLease:
        """Acquire ``key``, waiting out contention (cancellable); see :meth:`VolcanoLocks.wait_acquire`."""
        return await async_wait_acquire(self, key, ttl, **options)
