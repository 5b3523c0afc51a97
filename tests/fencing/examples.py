"""The stores the fenced-lake example DAG and flow write to, as their tests set them up and read them back.

``dags/volcano_fenced_lake.py`` and ``flows/fenced_lake.py`` publish a day to the table
``example_daily_sales`` (through FencedSQL) and to the S3 prefix ``sales/<day>`` (through FencedS3Prefix),
configured by ``VOLCANO_EXAMPLES_*`` variables; :class:`ExampleStores` points those at a warehouse of the
test's own and a fresh bucket on the session's moto server.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from tests.fencing.s3_server import MotoServer
from volcano_locks.fencing import Fence, FencedS3Prefix, FencedSQL

SALES = sa.table("example_daily_sales", sa.column("day"), sa.column("fencing_token"))


class ExampleStores:
    """A warehouse (SQLAlchemy URL) and a bucket for the examples, and what they hold for a day."""

    def __init__(self, url: str, server: MotoServer) -> None:
        self.url = url
        self.engine = sa.create_engine(url)
        self.bucket = server.bucket()
        self.s3: Any = server.client()
        self.env = {
            **server.env(),
            "VOLCANO_EXAMPLES_SQLALCHEMY_URL": url,
            "VOLCANO_EXAMPLES_S3_ENDPOINT": server.url,
            "VOLCANO_EXAMPLES_S3_BUCKET": self.bucket,
        }
        self.days: list[str] = []

    def lake(self, day: str) -> FencedS3Prefix:
        """The day's fenced prefix."""
        return FencedS3Prefix(self.s3, self.bucket, f"sales/{day}")

    def stored(self, day: str) -> tuple[set[int], int | None]:
        """The fencing tokens on the day's warehouse rows, and the lake's current token for the day."""
        self.days.append(day)
        with self.engine.connect() as conn:
            tokens = conn.execute(sa.select(SALES.c.fencing_token).where(SALES.c.day == day)).scalars().all()
        current = self.lake(day).current()
        return {int(t) for t in tokens}, None if current is None else current.fencing_token

    def overtake(self, day: str, fencing_token: int) -> Fence:
        """A newer holder of the day's lock writes both stores with ``fencing_token``; return its fence."""
        newer = Fence(f"sales:{day}", fencing_token)
        with FencedSQL(self.engine).begin(f"sales:{day}", newer) as conn:
            conn.execute(SALES.update().where(SALES.c.day == day).values(fencing_token=fencing_token))
        self.lake(day).publish(newer, {"sales.csv": b"region,amount\n"})
        return newer

    def close(self) -> None:
        """Delete the days the test read (the PostgreSQL table is shared) and dispose of the engine."""
        if self.days:
            with self.engine.begin() as conn:
                conn.execute(SALES.delete().where(SALES.c.day.in_(sorted(set(self.days)))))
        self.engine.dispose()
