"""Records in Airflow's store that lock decisions and permissions rest on, each sealed and bound.

Airflow Variables and XCom are writable by REST users and by every task's code, so nothing read
from them is believed until its seal verifies (:mod:`~airflow_provider_volcano.records.seal`). Every
record is sealed with HMAC-SHA256 under a key derived from the service key, one key per record type,
and bound to the lease it describes (lock key, fencing token, owner, kind: ``task`` or ``group``).
Readers have one way in, :func:`open_record`, which returns an :class:`Opened`: the record, or the
refusal that says why it was ignored (and logs it, naming where it was stored, never a key).

========================  ==============================================  ===========================
record                    where                                           written by / read by
========================  ==============================================  ===========================
handoff (``handoff``)     Variable ``volcano_lock_handoff:<key>``         trigger / waiters, board
holder (``holder``)       Variable ``volcano_lock_holder:<key>``          holder task / board, lines
forced (``forced``)       Variable ``volcano_lock_forced:<key>``          board / the losing holder
tenure (``tenure``)       Variable ``volcano_lock_tenure:<key>:<slot>``   holder task / board (display)
group lease (``group``)   XCom ``volcano_lock_group`` of the acquire task acquire task / members
in-slot waiter            XCom ``volcano_waiting`` (display only)         waiting task / board
========================  ==============================================  ===========================
"""

from __future__ import annotations

from airflow_provider_volcano.records.forced import FORCED_PREFIX, ForcedRecord, forced_line, read_forced
from airflow_provider_volcano.records.group import GROUP_XCOM_KEY, GroupLease, open_group, seal_group
from airflow_provider_volcano.records.handoff import (
    HANDOFF_PREFIX,
    HandoffRecord,
    clear_handoff,
    handoff_variable,
    read_handoff,
    write_handoff,
)
from airflow_provider_volcano.records.holder import HOLDER_PREFIX, HolderRecord, read_holder, write_holder
from airflow_provider_volcano.records.in_slot import WAITING_XCOM_KEY
from airflow_provider_volcano.records.opened import LEASE_KINDS, Opened, open_record, sealed
from airflow_provider_volcano.records.seal import ROTATED, Keyring, SealKey

__all__ = [
    "FORCED_PREFIX",
    "GROUP_XCOM_KEY",
    "HANDOFF_PREFIX",
    "HOLDER_PREFIX",
    "LEASE_KINDS",
    "ROTATED",
    "WAITING_XCOM_KEY",
    "ForcedRecord",
    "GroupLease",
    "HandoffRecord",
    "HolderRecord",
    "Keyring",
    "Opened",
    "SealKey",
    "clear_handoff",
    "forced_line",
    "handoff_variable",
    "open_group",
    "open_record",
    "read_forced",
    "read_handoff",
    "read_holder",
    "seal_group",
    "sealed",
    "write_handoff",
    "write_holder",
]
