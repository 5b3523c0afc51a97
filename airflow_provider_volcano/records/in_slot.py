"""The in-slot waiter marker: XCom ``volcano_waiting`` of a task waiting for a lock in its worker slot.

Pushed when the wait starts (lock key and since when). It is display only, never a basis for a lock
decision or a permission, so it carries no seal: XComs are cleared at each try, and the board lists
it only while its task instance runs without holding the lock.
"""

from __future__ import annotations

__all__ = ["WAITING_XCOM_KEY"]

WAITING_XCOM_KEY = "volcano_waiting"
"""The XCom key of the in-slot waiter marker."""
