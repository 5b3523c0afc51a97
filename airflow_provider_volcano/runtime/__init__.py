"""What a locked task runs: its hold, its first answer, its waits, and the calls beside its body.

Imported when a task runs or a trigger waits, never when a DAG is parsed. :mod:`.hold` is the one
place a locked task's life is decided; the operator, the TaskFlow decorator, the group's tasks and the
trigger are faces over it.
"""
