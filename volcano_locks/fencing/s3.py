"""Fenced publishes to an S3 prefix: data goes under a fresh version, a conditional manifest makes it current.

Layout under ``prefix``::

    <prefix>/_manifest.json                    the pointer: lock key, fencing token, version, objects
    <prefix>/versions/<token>-<id>/<name>      the data of one publish, never overwritten

:meth:`FencedS3Prefix.publish` reads the manifest (refusing at once if its token is newer), uploads the
files under a version nobody else uses, then replaces the manifest with a conditional ``PutObject``:
``If-Match`` the ETag it read (``If-None-Match: *`` when there was none). If another writer replaced the
manifest in between, S3 answers 412 (or 409 for a concurrent conditional write), and the publish reads
the manifest again: a newer token there refuses it, with :class:`StaleFencingToken`; otherwise it retries
the swap. The manifest's token therefore never goes backwards, and a stale holder's upload never becomes
current: after a refusal its objects are deleted, so nothing partial is left (a process killed mid-publish
can leave an unreferenced version folder: never current, and an S3 lifecycle rule on ``versions/`` clears
it). Readers read the manifest, then the version it names (:meth:`current`, :meth:`read`).

The same idea works on any store with compare-and-swap on one object (GCS generation preconditions, Azure
ETags). It relies on S3 conditional writes (``If-Match`` / ``If-None-Match`` on ``PutObject``), which AWS S3
enforces since 2024; check that your S3-compatible store does too.

Cost per publish of N files: N + 2 requests (read the manifest, N uploads, the conditional swap), so fencing
adds two; each lost swap race adds two more (a read and a swap). A refusal costs one request when the
manifest already shows the newer token, else the uploads plus one ``DeleteObjects`` to remove them.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from volcano_locks.errors import VolcanoError
from volcano_locks.fencing._fence import Fence, StaleFencingToken, fence_of, validate_resource

__all__ = ["FencedS3Prefix", "Manifest", "SwapContended"]

_RACE_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "412", "409"})
_MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound"})


class SwapContended(VolcanoError):
    """The manifest kept changing under the publish (``max_swaps`` lost races); nothing was published."""


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
        etag: The manifest object's ETag (what the next swap is conditional on).
    """

    lock_key: str
    fencing_token: int
    version: str
    objects: tuple[str, ...]
    generation: int
    writer: str = ""
    written_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    etag: str = field(default="", compare=False)

    def to_json(self) -> bytes:
        """The manifest object's body."""
        body = {
            "format": 1,
            "lock_key": self.lock_key,
            "fencing_token": self.fencing_token,
            "version": self.version,
            "objects": list(self.objects),
            "generation": self.generation,
            "writer": self.writer,
            "written_at": self.written_at.isoformat(),
        }
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes, etag: str) -> Manifest:
        """Parse a manifest object's body."""
        body = json.loads(data)
        return cls(
            lock_key=str(body["lock_key"]),
            fencing_token=int(body["fencing_token"]),
            version=str(body["version"]),
            objects=tuple(str(o) for o in body["objects"]),
            generation=int(body["generation"]),
            writer=str(body.get("writer", "")),
            written_at=datetime.fromisoformat(body["written_at"]),
            etag=etag,
        )


class FencedS3Prefix:
    """An S3 prefix whose current version only a holder of the newest fencing token can publish.

    Args:
        client: a boto3 S3 client (``boto3.client("s3", ...)``); it is used, never closed.
        bucket: the bucket.
        prefix: the prefix (no leading or trailing ``/``); also the resource name in refusals.
        max_swaps: how many lost manifest races a publish retries before :class:`SwapContended`.

    Example:
        >>> prefix = FencedS3Prefix(boto3.client("s3"), "lake", "marts/orders")  # doctest: +SKIP
        >>> with client.with_lock("orders", ttl=60) as guard:  # doctest: +SKIP
        ...     prefix.publish(guard, {"part-0.parquet": data})
    """

    def __init__(self, client: Any, bucket: str, prefix: str, *, max_swaps: int = 10) -> None:
        if not isinstance(bucket, str) or not bucket:
            raise ValueError(f"bucket must be a non-empty string, got {bucket!r}")
        validate_resource(prefix)
        if prefix.startswith("/") or prefix.endswith("/"):
            raise ValueError(f"prefix must not start or end with '/', got {prefix!r}")
        if isinstance(max_swaps, bool) or not isinstance(max_swaps, int) or max_swaps < 1:
            raise ValueError(f"max_swaps must be a positive int, got {max_swaps!r}")
        self.client = client
        self.bucket = bucket
        self.prefix = prefix
        self.max_swaps = max_swaps
        self.manifest_key = f"{prefix}/_manifest.json"

    def __repr__(self) -> str:
        return f"FencedS3Prefix(bucket={self.bucket!r}, prefix={self.prefix!r})"

    def current(self) -> Manifest | None:
        """The current manifest, or ``None`` if nothing was ever published."""
        try:
            got = self.client.get_object(Bucket=self.bucket, Key=self.manifest_key)
        except Exception as exc:
            if _code(exc) in _MISSING_CODES:
                return None
            raise
        return Manifest.from_json(got["Body"].read(), got["ETag"])

    def key_of(self, name: str, manifest: Manifest) -> str:
        """The S3 key of object ``name`` in ``manifest``'s version."""
        return f"{self.prefix}/versions/{manifest.version}/{name}"

    def read(self, name: str) -> bytes:
        """Object ``name`` of the current version.

        Raises:
            KeyError: nothing is published, or the current version has no such object.
        """
        manifest = self.current()
        if manifest is None or name not in manifest.objects:
            raise KeyError(f"{self.prefix!r} has no current object {name!r}")
        got = self.client.get_object(Bucket=self.bucket, Key=self.key_of(name, manifest))
        return bytes(got["Body"].read())

    def publish(self, lease: object, files: Mapping[str, bytes], *, writer: str = "") -> Manifest:
        """Upload ``files`` as a new version and make it current, if ``lease``'s token is still the newest.

        ``lease`` is any form :func:`~volcano_locks.fencing.fence_of` takes. Returns the new manifest.

        Raises:
            StaleFencingToken: a newer token (or another lock) published here; this publish's objects are
                deleted again and the current version is untouched.
            SwapContended: the manifest changed ``max_swaps`` times in a row under this publish (same-token
                writers racing); its objects are deleted again.
        """
        fence = fence_of(lease)
        names = _check_names(files)
        seen = self.current()
        self._refuse_if_stale(seen, fence)
        version = f"{fence.fencing_token:020d}-{secrets.token_hex(8)}"
        uploaded: list[str] = []
        try:
            for name in names:
                key = f"{self.prefix}/versions/{version}/{name}"
                self.client.put_object(Bucket=self.bucket, Key=key, Body=files[name])
                uploaded.append(key)
            for _ in range(self.max_swaps):
                new = Manifest(
                    lock_key=fence.lock_key,
                    fencing_token=fence.fencing_token,
                    version=version,
                    objects=tuple(names),
                    generation=(seen.generation if seen else 0) + 1,
                    writer=writer,
                )
                condition = {"IfMatch": seen.etag} if seen else {"IfNoneMatch": "*"}
                try:
                    put = self.client.put_object(
                        Bucket=self.bucket,
                        Key=self.manifest_key,
                        Body=new.to_json(),
                        ContentType="application/json",
                        **condition,
                    )
                except Exception as exc:
                    raced = _code(exc) in _RACE_CODES
                    try:
                        seen = self.current()  # judge again against what is there now
                    except Exception:
                        uploaded.clear()  # the swap may have landed: never delete what may be current
                        raise exc from None
                    if seen is not None and seen.version == version:
                        uploaded.clear()  # it did land (a retried request, a lost response)
                        return seen
                    if not raced:
                        raise
                    self._refuse_if_stale(seen, fence)
                    continue
                uploaded.clear()  # current now: these objects are the prefix's data
                return replace(new, etag=put["ETag"])
            raise SwapContended(
                f"publish to {self.prefix!r} lost the manifest swap {self.max_swaps} times in a row"
            )
        finally:
            if uploaded:
                self._delete(uploaded)

    def _refuse_if_stale(self, seen: Manifest | None, fence: Fence) -> None:
        if seen is not None and (seen.lock_key != fence.lock_key or seen.fencing_token > fence.fencing_token):
            raise StaleFencingToken(self.prefix, fence.fencing_token, seen, lock_key=fence.lock_key)

    def _delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):  # DeleteObjects takes at most 1,000 keys
            batch = keys[start : start + 1000]
            self.client.delete_objects(
                Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
            )


def _check_names(files: Mapping[str, bytes]) -> list[str]:
    if not isinstance(files, Mapping) or not files:
        raise ValueError("files must be a non-empty mapping of object names to bytes")
    names = sorted(files)
    for name in names:
        parts = name.split("/") if isinstance(name, str) else []
        if not parts or any(p in ("", ".", "..") for p in parts):
            raise ValueError(
                f"object name must be a relative path without '.', '..' or empty parts: {name!r}"
            )
        if not isinstance(files[name], bytes | bytearray):
            raise TypeError(f"object {name!r} must be bytes, got {type(files[name]).__name__}")
    return names


def _code(exc: BaseException) -> str:
    """The S3 error code of a botocore ``ClientError`` (empty for anything else)."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return ""
    error = response.get("Error", {})
    code = str(error.get("Code", "")) if isinstance(error, dict) else ""
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code or str(status or "")
