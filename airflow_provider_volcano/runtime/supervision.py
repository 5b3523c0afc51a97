"""The lock's life is tied to the task's supervision: no supervisor, no lock.

Airflow 3 runs a task's code in a process forked by its supervisor (the Task SDK ``supervise()``; under
the CeleryExecutor, inside a Celery pool process). The supervisor heartbeats the task instance, relays its
logs and reports its state. When it is gone (``kill -9`` of the Celery worker and its pool child, an OOM
kill), the task process lives on in its own process group: left alone it would keep renewing the lock and
finish its work invisibly while Airflow, hearing no heartbeat, fails the task.

:class:`SupervisorWatch` watches the task process's parent once a second while the lock is wanted or held.
When the parent changes (the supervisor died and the process was re-parented), it writes why to the task's
log file (the supervisor no longer relays logs, so the line is appended to the file Airflow's log handler
writes, ``[logging] base_log_folder`` / ``log_filename_template``) and to stderr, then raises
:class:`SupervisorGone` in the thread running the task's body: the body stops, ``with_lock`` stops the
keeper and releases the lease, and the task fails. A body stuck in one long C call cannot be interrupted;
after ``grace`` seconds the watch ends the task process (``os._exit``), so renewals stop and the lease
lapses within its TTL.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2

from airflow_provider_volcano._compat import conf
from airflow_provider_volcano.exceptions import VolcanoLockLost

__all__ = ["SupervisorGone", "SupervisorWatch", "supervised", "task_log_file"]

EXIT_CODE = 70
"""The task process's exit status when the watch ends it (a body that would not stop)."""


class SupervisorGone(Exception):
    """The task's supervisor is gone: the task stops its body and gives up its lock."""


def task_log_file(ti: object) -> Path | None:
    """The local log file Airflow's file task handler writes for this try (``None`` if unknown)."""
    try:
        template = conf.get("logging", "log_filename_template")
        base = conf.get("logging", "base_log_folder")
        name = jinja2.Template(template).render(ti=ti, try_number=getattr(ti, "try_number", 1))
    except Exception:
        return None
    return Path(str(base)) / str(name)


class SupervisorWatch:
    """Watch the task process's parent; on its loss stop the body (see the module docstring).

    :param log: the task's logger (its lines may no longer reach the log once the supervisor is gone).
    :param what: what holds or wants the lock, for the log line (e.g. ``lock 'k' (fencing token 3)``).
    :param log_file: the task's log file, to append the reason to (``None``: not known).
    :param interval: seconds between two looks at the parent.
    :param grace: seconds the interrupted body has to stop before the process is ended.
    :param end_process: how the process is ended (``os._exit``; injectable for tests).
    :param parent: the supervisor's pid (default: the parent now).
    """

    def __init__(
        self,
        log: Any,
        what: Callable[[], str],
        log_file: Path | None,
        *,
        interval: float = 1.0,
        grace: float = 5.0,
        end_process: Callable[[int], object] = os._exit,
        parent: int | None = None,
    ) -> None:
        self.log, self.what, self.log_file = log, what, log_file
        self.interval, self.grace, self.end_process = interval, grace, end_process
        self.parent = os.getppid() if parent is None else parent
        self.gone = False
        self._target = threading.get_ident()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="volcano-lock-supervision", daemon=True)

    def __enter__(self) -> SupervisorWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()  # the body has left (and with_lock released the lease): nothing to end
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=self.interval + 1.0)

    def _run(self) -> None:
        while not self._stopped.wait(self.interval):
            now = os.getppid()
            if now != self.parent:
                self._lost(now)
                return

    def _lost(self, now: int) -> None:
        self.gone = True
        self._say(
            f"The task's supervisor (pid {self.parent}) is gone (the process's parent is now pid {now}): "
            f"nobody heartbeats this task or reports its state any more, so it stops its body and gives "
            f"up {self.what()} instead of holding it for a task Airflow will fail"
        )
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(self._target), ctypes.py_object(SupervisorGone)
        )
        if self._stopped.wait(self.grace):
            return
        self._say(
            f"The task's body did not stop within {self.grace:.0f} s of the interrupt (a long call "
            f"cannot be interrupted); ending the task process so its renewals stop and {self.what()} "
            "lapses within its TTL"
        )
        self.end_process(EXIT_CODE)

    def _say(self, line: str) -> None:
        """Write ``line`` to the task's log file first: the supervisor that relayed logs is gone, and
        writing to its socket or pipes may fail (a broken pipe must not stop the watch)."""
        self._append(line)
        for say in (lambda: self.log.error("%s", line), lambda: print(line, file=sys.stderr, flush=True)):
            with contextlib.suppress(Exception):  # the channel to the dead supervisor is broken
                say()

    def _append(self, line: str) -> None:
        if self.log_file is None:
            return
        entry = {
            "timestamp": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
            "level": "error",
            "event": line,
            "logger": "airflow_provider_volcano.supervision",
        }
        try:
            with self.log_file.open("a", encoding="utf-8") as out:
                out.write(json.dumps(entry) + "\n")
        except OSError as exc:
            with contextlib.suppress(Exception):
                print(f"could not append to the task log {self.log_file}: {exc}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def supervised(ti: object, log: Any, what: Callable[[], str], gone: Callable[[], str]) -> Iterator[None]:
    """Run the block under a :class:`SupervisorWatch`; the supervisor's loss fails the task.

    :param ti: the running task instance (its log file gets the reason).
    :param log: the task's logger.
    :param what: what holds or wants the lock, for the watch's line.
    :param gone: the message of the task's failure (:class:`VolcanoLockLost`) when the supervisor is gone.
    """

    try:
        with SupervisorWatch(log, what, task_log_file(ti)):
            yield
    except SupervisorGone:
        raise VolcanoLockLost(gone()) from None
