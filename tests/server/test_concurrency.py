"""Many clients race for one key through two server processes sharing one database: never two holders."""

from __future__ import annotations

import threading
import time
import uuid

from volcano_locks.server.harness import LocalServer

from .helpers import Raw, new_id

THREADS_PER_SERVER = 4
GRANTS = 300


class Referee:
    """Watches grants as the clients report them; a client clears itself before it sends its release."""

    def __init__(self, target: int) -> None:
        self.mutex = threading.Lock()
        self.holder: str | None = None
        self.last_fencing = 0
        self.grants: list[int] = []
        self.problems: list[str] = []
        self.done = threading.Event()
        self.target = target

    def granted(self, who: str, fencing: int) -> None:
        with self.mutex:
            if self.holder is not None:
                self.problems.append(f"{who} granted while {self.holder} holds")
            if fencing <= self.last_fencing:
                self.problems.append(f"fencing {fencing} after {self.last_fencing}")
            self.holder, self.last_fencing = who, fencing
            self.grants.append(fencing)
            if len(self.grants) >= self.target:
                self.done.set()

    def releasing(self, who: str) -> None:
        with self.mutex:
            if self.holder != who:
                self.problems.append(f"{who} releasing but the holder is {self.holder}")
            self.holder = None


def contend(referee: Referee, url: str, key: str, lock: str, name: str) -> None:
    raw = Raw(url, key)
    try:
        while not referee.done.is_set():
            token = new_id()
            r = raw.acquire(lock, token, 60)
            if r.status_code == 201:
                referee.granted(name, r.json()["fencing_token"])
                referee.releasing(name)
                rel = raw.release(lock, token)
                if rel.status_code != 204:
                    referee.problems.append(f"release -> {rel.status_code} {rel.text}")
            elif r.status_code == 409 and r.json()["code"] == "lock_held":
                time.sleep(0.002)
            else:
                referee.problems.append(f"acquire -> {r.status_code} {r.text}")
                return
    except Exception as exc:  # surfaced through the referee, so the test fails with the cause
        referee.problems.append(f"{name}: {exc!r}")
        referee.done.set()
    finally:
        raw.close()


def race(servers: list[LocalServer], lock: str) -> Referee:
    referee = Referee(GRANTS)
    threads = [
        threading.Thread(target=contend, args=(referee, srv.url, srv.service_key, lock, f"s{i}t{t}"))
        for i, srv in enumerate(servers)
        for t in range(THREADS_PER_SERVER)
    ]
    for th in threads:
        th.start()
    referee.done.wait(timeout=240)
    referee.done.set()
    for th in threads:
        th.join(timeout=30)
    return referee


def check(referee: Referee, servers: list[LocalServer], lock: str) -> None:
    assert referee.problems == []
    assert len(referee.grants) >= GRANTS
    assert referee.grants == sorted(set(referee.grants))
    # every server process granted some of them
    per_server = [
        sum(1 for e in srv.requests() if e["op"] == "acquire" and e["status"] == 201) for srv in servers
    ]
    assert all(n > 0 for n in per_server), per_server
    raw = Raw(servers[0].url, servers[0].service_key)
    assert raw.get(lock).json() == {"held": False}
    raw.close()


def test_two_servers_sharing_one_database_never_grant_twice(storage_db: str) -> None:
    # Two processes on one PostgreSQL schema, or on one SQLite file (its locking, not ours, serialises).
    secret = "race-secret-" + uuid.uuid4().hex
    with (
        LocalServer(db=storage_db, secret=secret, quota=0, admin=True, log_requests=False) as a,
        LocalServer(db=storage_db, secret=secret, quota=0, admin=True, log_requests=False) as b,
    ):
        referee = race([a, b], "race")
        check(referee, [a, b], "race")
