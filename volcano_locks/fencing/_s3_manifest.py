"""The manifest of a fenced S3 prefix: which version is current, who published it, and what it replaced.

The manifest object (``<prefix>/_manifest.json``) names the current version and carries its lineage: the
last :data:`LINEAGE` versions it replaced, newest first, each with when it was current (``since`` to
``until``). The lineage is what lets a publish whose swap response was lost tell "my manifest was current
(and a newer one already replaced it)" from "it never was", and what lets :meth:`FencedS3Prefix.prune`
keep a replaced version for as long as a reader may still hold it. A manifest written before the lineage
existed (format 1) reads with an empty one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

__all__ = ["LINEAGE", "Manifest", "Superseded"]

LINEAGE = 100
"""How many replaced versions a manifest remembers."""


@dataclass(frozen=True)
class Superseded:
    """A version that was current and was replaced: from ``since`` until ``until`` (aware UTC)."""

    version: str
    fencing_token: int
    generation: int
    since: datetime
    until: datetime

    def to_dict(self) -> dict[str, Any]:
        """The lineage entry's JSON form."""
        return {
            "version": self.version,
            "fencing_token": self.fencing_token,
            "generation": self.generation,
            "since": self.since.isoformat(),
            "until": self.until.isoformat(),
        }

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> Superseded:
        """Parse a lineage entry."""
        return cls(
            version=str(body["version"]),
            fencing_token=int(body["fencing_token"]),
            generation=int(body["generation"]),
            since=datetime.fromisoformat(body["since"]),
            until=datetime.fromisoformat(body["until"]),
        )


@dataclass(frozen=True)
class Manifest:
    """The current version of a fenced prefix: who published it, under which token, and its objects.

    Attributes:
        lock_key: The lock the publisher held.
        fencing_token: Its fencing token; a later manifest never has a lower one.
        version: The folder under ``versions/`` holding this publish's objects.
        objects: The names published (relative to the version folder).
        generation: How many publishes this prefix has accepted, this one included.
        writer: Free text the publisher gave (a run id); never a secret.
        written_at: When the publish was made (aware UTC).
        previous: The versions it replaced, newest first (at most :data:`LINEAGE`).
        etag: The manifest object's ETag (what the next swap is conditional on).
        once: The run-once ledger of the prefix: each business key published here, with its record
            (``volcano_locks.once``), carried forward by every later publish.
        forgotten: The audit of forgotten keys (who, when, why, the record), newest first, at most
            :data:`LINEAGE`.
    """

    lock_key: str
    fencing_token: int
    version: str
    objects: tuple[str, ...]
    generation: int
    writer: str = ""
    written_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    previous: tuple[Superseded, ...] = field(default=(), compare=False)
    etag: str = field(default="", compare=False)
    once: Mapping[str, Any] = field(default_factory=dict, compare=False)
    forgotten: tuple[Mapping[str, Any], ...] = field(default=(), compare=False)

    def replacing(self, seen: Manifest | None) -> Manifest:
        """This manifest as the successor of ``seen``: the next generation, ``seen`` first in its lineage."""
        if seen is None:
            return self
        gone = Superseded(seen.version, seen.fencing_token, seen.generation, seen.written_at, self.written_at)
        return Manifest(
            lock_key=self.lock_key,
            fencing_token=self.fencing_token,
            version=self.version,
            objects=self.objects,
            generation=seen.generation + 1,
            writer=self.writer,
            written_at=self.written_at,
            previous=(gone, *seen.previous)[:LINEAGE],
            once={**seen.once, **self.once},
            forgotten=seen.forgotten,
        )

    def knows(self, version: str) -> bool:
        """Whether ``version`` is this manifest's or one it remembers replacing."""
        return version == self.version or any(p.version == version for p in self.previous)

    def remembers(self, generation: int) -> bool:
        """Whether every version current from ``generation`` on is this manifest's or in its lineage."""
        return generation >= (self.previous[-1].generation if self.previous else self.generation)

    def to_json(self) -> bytes:
        """The manifest object's body."""
        body = {
            "format": 2,
            "lock_key": self.lock_key,
            "fencing_token": self.fencing_token,
            "version": self.version,
            "objects": list(self.objects),
            "generation": self.generation,
            "writer": self.writer,
            "written_at": self.written_at.isoformat(),
            "previous": [p.to_dict() for p in self.previous],
        }
        if self.once:
            body["once"] = dict(self.once)
        if self.forgotten:
            body["forgotten"] = list(self.forgotten)
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes, etag: str) -> Manifest:
        """Parse a manifest object's body (format 1, without a lineage, or 2)."""
        body = json.loads(data)
        return cls(
            lock_key=str(body["lock_key"]),
            fencing_token=int(body["fencing_token"]),
            version=str(body["version"]),
            objects=tuple(str(o) for o in body["objects"]),
            generation=int(body["generation"]),
            writer=str(body.get("writer", "")),
            written_at=datetime.fromisoformat(body["written_at"]),
            previous=tuple(Superseded.from_dict(p) for p in body.get("previous", ())),
            etag=etag,
            once=dict(body.get("once", {})),
            forgotten=tuple(body.get("forgotten", ())),
        )
