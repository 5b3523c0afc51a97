"""A child process a test freezes with SIGSTOP: resume it and read its next line, or end it whatever state."""

from __future__ import annotations

import json
import signal
import subprocess
from typing import Any


def resume(proc: subprocess.Popen[str], go: Any) -> dict[str, Any]:
    """Let a frozen child go on (``go``: the file it waits for) and return the JSON line it prints next."""
    assert proc.stdout is not None
    go.touch()
    proc.send_signal(signal.SIGCONT)
    out: dict[str, Any] = json.loads(proc.stdout.readline())
    return out


def end(proc: subprocess.Popen[str]) -> None:
    """Make sure a child that may still be frozen is gone: continue it, kill it, reap it, close its pipe."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
