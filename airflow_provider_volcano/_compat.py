"""What differs between the supported Airflow versions (3.1 to the newest 3.x), in one place.

Each name is imported from where the newest Airflow keeps it, and from where Airflow 3.1 kept it when
that fails. Where an older Airflow lacks a feature, the provider keeps everything else and says what is
missing in ``providers/volcano/docs/supported-versions.rst``:

- ``airflow.sdk.configuration.conf`` is Airflow 3.2's (3.1: ``airflow.configuration.conf``).
- ``AirflowFailException`` and ``AirflowSkipException`` moved to ``airflow.sdk.exceptions`` in 3.2
  (3.1: ``airflow.exceptions``, the same classes Airflow catches there).
- ``airflow.sdk.bases.decorator.determine_kwargs`` is 3.2's (3.1: ``airflow.utils.operator_helpers``).
- ``airflow.sdk.observability.stats`` is 3.3's (3.1, 3.2: ``airflow.stats.Stats``), see :func:`stats`.
- ``airflow.sdk.log.amask_secret`` is 3.3's: on 3.1 and 3.2 a trigger masks the connection's keys with
  the synchronous ``mask_secret`` (every log line the trigger writes is masked; Airflow 3.2 also tells its
  supervisor through its greenback bridge, 3.1 cannot from inside the event loop and skips that part).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow.sdk.configuration import conf
    from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException
else:
    try:  # Airflow 3.2+
        from airflow.sdk.configuration import conf
    except ImportError:  # Airflow 3.1
        from airflow.configuration import conf
    try:  # Airflow 3.2+
        from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException
    except ImportError:  # Airflow 3.1
        from airflow.exceptions import AirflowFailException, AirflowSkipException

__all__ = [
    "AirflowFailException",
    "AirflowSkipException",
    "amask_secret",
    "conf",
    "determine_kwargs",
    "stats",
]


def stats() -> Any:
    """Airflow's metrics front (``incr``, ``gauge``, ``timing``): 3.3's ``airflow.sdk.observability.stats``,
    else 3.1's and 3.2's ``airflow.stats.Stats`` (3.3 keeps that name only as a deprecated shim)."""
    try:  # Airflow 3.3+
        return importlib.import_module("airflow.sdk.observability.stats")
    except ImportError:  # Airflow 3.1, 3.2
        return importlib.import_module("airflow.stats").Stats


def determine_kwargs(
    callable_: Callable[..., Any], args: Any, context: Mapping[str, Any]
) -> Mapping[str, Any]:
    """The keyword arguments ``callable_`` takes from ``context`` (Airflow's own helper, where it lives)."""
    try:  # Airflow 3.2+
        from airflow.sdk.bases.decorator import determine_kwargs as found
    except ImportError:  # Airflow 3.1
        found = importlib.import_module("airflow.utils.operator_helpers").determine_kwargs
    result: Mapping[str, Any] = found(callable_, args, context)
    return result


async def amask_secret(secret: str) -> None:
    """Mask ``secret`` in the logs from a coroutine (Airflow 3.3's ``amask_secret``, else ``mask_secret``)."""
    try:  # Airflow 3.3+
        from airflow.sdk.log import amask_secret as found
    except ImportError:  # Airflow 3.1, 3.2: the sync call; see the module docstring
        from airflow.sdk.log import mask_secret

        mask_secret(secret)
        return
    await found(secret)
