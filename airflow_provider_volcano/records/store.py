"""Airflow's store as the records see it: Variables read, written and deleted at best effort.

The records are bookkeeping beside the lock: a store that does not answer never fails a task here;
the callers say what its absence costs.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from airflow.sdk import Variable

from airflow_provider_volcano.records.opened import Opened, R, SealedRecord, open_record, sealed
from airflow_provider_volcano.records.seal import Keyring

__all__ = ["delete_variable", "get_variable", "open_variable", "set_sealed", "set_variable"]

log = logging.getLogger(__name__)


def get_variable(name: str) -> object:
    """The Variable's text, or ``None`` (absent, or Airflow did not answer)."""
    try:
        return Variable.get(name, default=None)
    except Exception as exc:  # no supervisor to ask (outside a task or trigger), API errors
        log.debug("could not read Variable %r: %s", name, exc)
        return None


def set_variable(name: str, text: str, description: str, logger: logging.Logger | Any = log) -> bool:
    """Write the Variable; ``False`` (and a warning naming it) if Airflow refused or did not answer."""
    try:
        Variable.set(name, text, description=description)
    except Exception as exc:
        logger.warning("Could not write Variable %r: %s", name, exc)
        return False
    return True


def set_sealed(
    keys: Keyring, name: str, record: SealedRecord, description: str, logger: logging.Logger | Any = log
) -> bool:
    """Write ``record``, sealed under the current key, as the Variable ``name`` (see :func:`set_variable`)."""
    return set_variable(name, json.dumps(sealed(keys, record), sort_keys=True), description, logger)


def delete_variable(name: str, logger: logging.Logger | Any = log) -> bool:
    """Delete the Variable; ``False`` (and a warning naming it) if Airflow refused or did not answer."""
    try:
        Variable.delete(name)
    except Exception as exc:
        logger.warning("Could not delete Variable %r: %s", name, exc)
        return False
    return True


def open_variable(
    keys: Keyring, kind: type[R], name: str, lock_key: str, logger: logging.Logger | Any = log
) -> Opened[R]:
    """Read the Variable ``name`` and open it as a sealed ``kind`` record of ``lock_key``."""
    return open_record(
        keys, kind, get_variable(name), lock_key=lock_key, name=f"Variable {name!r}", logger=logger
    )
