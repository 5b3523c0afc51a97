"""Fenced publishes to an S3 prefix: data goes under a fresh version, a conditional manifest makes it current.

Layout under ``prefix``::

    <prefix>/_manifest.json                         the pointer: lock key, token, version, objects, lineage
    <prefix>/versions/<token>-<id>/<name>           the data of one publish, never overwritten
    <prefix>/_symlink_format_manifest/manifest      (opt-in) the current version's object URLs, one a line

Publishing. :meth:`FencedS3Prefix.publish` reads the manifest (refusing at once if its token is newer),
uploads the files under a version nobody else uses, then replaces the manifest with a conditional
``PutObject``: ``If-Match`` the ETag it read (``If-None-Match: *`` when there was none). The manifest's
token therefore never goes backwards, and a stale holder's upload never becomes current.

Retried and lost responses. When the swap's outcome is not known (botocore retried it and got 412 because
the first attempt had landed; the response was lost; a 5xx), the publish reads the manifest again and
decides on what it finds, never on the error: its version current, or in the manifest's lineage (the
versions it replaced), means the publish landed, and it returns; the condition still holding (the manifest
it swapped from is still there) means it has not landed yet, and a copy of the request may still land, so
its objects are kept; only a manifest that moved on without it proves it never became current and never
can. Only then are its objects deleted (a refusal) or the swap retried (a race between holders of one
token). So a version that was current is never deleted by a publish, and a reader holding it never meets
``NoSuchKey`` because of one.

Reading. :meth:`snapshot` reads the manifest once and reads every object from the version it names: many
files, one publication. :meth:`read` reads one object of whatever is current at the call.

Query engines that list the prefix (an Athena, Trino, Spark or DuckDB table whose location is the prefix)
see every version folder at once: all publications, including a stale holder's refused upload until it is
deleted. Point them at one publication instead: a ``snapshot()``'s ``urls()`` for a query you run, or the
symlink manifest (``symlink_manifest=True``): a text file of the current version's ``s3://`` URLs, the
format Athena's, Trino's and Spark's ``SymlinkTextInputFormat`` tables read, moved forward only (its
generation is in its metadata, replaced conditionally) after each swap; it may lag behind a publisher that
died right after its swap, never ahead, and :meth:`refresh_symlink_manifest` catches it up.

Old versions. A publish never deletes a version that was current. :meth:`prune` deletes versions replaced
longer ago than a grace a reader needs (from the lineage), and leftovers that can never become current. An
S3 lifecycle rule that expires ``versions/`` by age would also delete the current version's data once no
publish came for that long: use ``prune`` instead.

The same idea works on any store with compare-and-swap on one object (GCS generation preconditions, Azure
ETags). It relies on S3 conditional writes (``If-Match`` / ``If-None-Match`` on ``PutObject``), which AWS S3
enforces since 2024; check that your S3-compatible store does too.

Cost per publish of N files: N + 2 requests (read the manifest, N uploads, the conditional swap), so fencing
adds two; each lost swap race adds two more (a read and a swap); the symlink manifest adds two (a HEAD and
a conditional PUT). A refusal costs one request when the manifest already shows the newer token, else the
uploads plus one ``DeleteObjects`` to remove them.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from volcano_locks.errors import VolcanoError
from volcano_locks.fencing._fence import Fence, fence_of, refusal, validate_resource
from volcano_locks.fencing._s3_manifest import LINEAGE, Manifest, Superseded
from volcano_locks.once._record import OnceRecord, already_done

__all__ = ["LINEAGE", "FencedS3Prefix", "Manifest", "Snapshot", "Superseded", "SwapContended", "is_race"]

logger = logging.getLogger("volcano_locks.fencing")


def _utc_now() -> datetime:
    return datetime.now(UTC)


_RACE_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "412", "409"})
_MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound"})


class SwapContended(VolcanoError):
    """The manifest kept changing under the publish (``max_swaps`` lost races); nothing was published."""


class Snapshot:
    """One publication of a fenced prefix, read as a whole: every object from the version one manifest names.

    Taken by :meth:`FencedS3Prefix.snapshot`. Its objects stay readable while the version is current and,
    once replaced, for as long as :meth:`FencedS3Prefix.prune`'s grace (a publish never deletes it).
    """

    def __init__(self, prefix: FencedS3Prefix, manifest: Manifest) -> None:
        self.prefix = prefix
        self.manifest = manifest

    def __repr__(self) -> str:
        m = self.manifest
        return f"Snapshot({self.prefix.prefix!r}, generation={m.generation}, fencing_token={m.fencing_token})"

    @property
    def names(self) -> tuple[str, ...]:
        """The objects of this publication."""
        return self.manifest.objects

    def key(self, name: str) -> str:
        """The S3 key of object ``name`` (``KeyError`` if this publication has no such object)."""
        if name not in self.manifest.objects:
            raise KeyError(
                f"{self.prefix.prefix!r} generation {self.manifest.generation} has no object {name!r}"
            )
        return self.prefix.key_of(name, self.manifest)

    def url(self, name: str) -> str:
        """The ``s3://bucket/key`` URL of object ``name``."""
        return f"s3://{self.prefix.bucket}/{self.key(name)}"

    def urls(self) -> list[str]:
        """Every object's URL: what to hand a query engine (``read_parquet(urls)``, ``spark.read``...)."""
        return [self.url(name) for name in self.names]

    def read(self, name: str) -> bytes:
        """Object ``name`` of this publication."""
        got = self.prefix.client.get_object(Bucket=self.prefix.bucket, Key=self.key(name))
        return bytes(got["Body"].read())


class FencedS3Prefix:
    """An S3 prefix whose current version only a holder of the newest fencing token can publish.

    Args:
        client: a boto3 S3 client (``boto3.client("s3", ...)``); it is used, never closed.
        bucket: the bucket.
        prefix: the prefix (no leading or trailing ``/``); also the resource name in refusals.
        max_swaps: how many lost manifest races a publish retries before :class:`SwapContended`.
        symlink_manifest: also keep ``<prefix>/_symlink_format_manifest/manifest`` (the current version's
            object URLs) for query engines' symlink tables.
        clock: the wall clock (aware UTC) a manifest's times and :meth:`prune`'s cutoff are read from.

    Example:
        >>> prefix = FencedS3Prefix(boto3.client("s3"), "lake", "marts/orders")  # doctest: +SKIP
        >>> with client.with_lock("orders", ttl=60) as guard:  # doctest: +SKIP
        ...     prefix.publish(guard, {"part-0.parquet": data})
        >>> snapshot = prefix.snapshot()  # doctest: +SKIP
        >>> rows = [snapshot.read(name) for name in snapshot.names]  # one publication  # doctest: +SKIP
    """

    def __init__(
        self,
        client: Any,
        bucket: str,
        prefix: str,
        *,
        max_swaps: int = 10,
        symlink_manifest: bool = False,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
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
        self.symlink_manifest = bool(symlink_manifest)
        self.clock = clock
        self.manifest_key = f"{prefix}/_manifest.json"
        self.symlink_key = f"{prefix}/_symlink_format_manifest/manifest"

    def __repr__(self) -> str:
        return f"FencedS3Prefix(bucket={self.bucket!r}, prefix={self.prefix!r})"

    # -- reading ------------------------------------------------------------------------------------------

    def current(self) -> Manifest | None:
        """The current manifest, or ``None`` if nothing was ever published."""
        try:
            got = self.client.get_object(Bucket=self.bucket, Key=self.manifest_key)
        except Exception as exc:
            if _code(exc) in _MISSING_CODES:
                return None
            raise
        return Manifest.from_json(got["Body"].read(), got["ETag"])

    def snapshot(self) -> Snapshot | None:
        """The current publication, to read many objects of one version (``None``: nothing published)."""
        manifest = self.current()
        return None if manifest is None else Snapshot(self, manifest)

    def key_of(self, name: str, manifest: Manifest) -> str:
        """The S3 key of object ``name`` in ``manifest``'s version."""
        return f"{self.prefix}/versions/{manifest.version}/{name}"

    def read(self, name: str) -> bytes:
        """Object ``name`` of whatever is current now; two calls may read two publications (use a snapshot).

        Raises:
            KeyError: nothing is published, or the current version has no such object.
        """
        snapshot = self.snapshot()
        if snapshot is None:
            raise KeyError(f"{self.prefix!r} has no current object {name!r}")
        return snapshot.read(name)

    # -- publishing ------------------------------------------------------------------------------------

    def publish(
        self, lease: object, files: Mapping[str, bytes], *, writer: str = "", once: OnceRecord | None = None
    ) -> Manifest:
        """Upload ``files`` as a new version and make it current, if ``lease``'s token is still the newest.

        ``lease`` is any form :func:`~volcano_locks.fencing.fence_of` takes. Returns the manifest published:
        the current one, or (when a lost response hid a swap that landed and a newer publish already
        replaced it) the one that was current.

        Raises:
            StaleFencingToken: a newer token (or another lock) published here; this publish's objects are
                deleted again (they were never current) and the current version is untouched.
            SwapContended: the manifest changed ``max_swaps`` times in a row under this publish (same-token
                writers racing); its objects are deleted again.
            AlreadyDone: ``once`` (a run-once record, ``volcano_locks.once.S3Ledger``) names a business key
                the manifest already records; nothing is published (objects uploaded are deleted again).
            Exception: S3's own error when the swap's outcome could not be known; this publish's objects
                are then kept (its manifest may yet land; :meth:`prune` removes them if it never does).
        """
        fence = fence_of(lease)
        names = _check_names(files)
        seen = self.current()
        self._refuse_if_stale(seen, fence, once)
        version = f"{fence.fencing_token:020d}-{secrets.token_hex(8)}"
        uploaded: list[str] = []
        keep = False  # from the moment a swap is sent this version may be current: its objects stay
        try:
            for name in names:
                key = f"{self.prefix}/versions/{version}/{name}"
                self.client.put_object(Bucket=self.bucket, Key=key, Body=files[name])
                uploaded.append(key)
            for _ in range(self.max_swaps):
                new = Manifest(
                    fence.lock_key,
                    fence.fencing_token,
                    version,
                    tuple(names),
                    1,
                    writer,
                    self.clock(),
                    once={} if once is None else {once.business_key: once.to_dict()},
                )
                new = new.replacing(seen)
                # Kept before the request goes out, not after its answer: whatever ends the publish from
                # here on (a lost answer, a loss raised into this thread between two bytecodes, a
                # KeyboardInterrupt) leaves the objects alone, until the manifest read back proves
                # this version was never current.
                keep = True
                try:
                    put = self._swap(new, seen)
                except Exception as exc:
                    now, landed, keep = self._judge_failed_swap(exc, new, seen)
                    if landed is not None:
                        return landed
                    self._refuse_if_stale(now, fence, once)
                    seen = now
                    continue
                published = replace(new, etag=put["ETag"])
                if self.symlink_manifest:
                    self._point_engines(published)
                return published
            raise SwapContended(
                f"publish to {self.prefix!r} lost the manifest swap {self.max_swaps} times in a row"
            )
        finally:
            if uploaded and not keep:
                self._delete(uploaded)

    def _swap(self, new: Manifest, seen: Manifest | None) -> Any:
        condition = {"IfMatch": seen.etag} if seen else {"IfNoneMatch": "*"}
        return self.client.put_object(
            Bucket=self.bucket,
            Key=self.manifest_key,
            Body=new.to_json(),
            ContentType="application/json",
            **condition,
        )

    def _judge_failed_swap(
        self, exc: Exception, new: Manifest, seen: Manifest | None
    ) -> tuple[Manifest | None, Manifest | None, bool]:
        """After a swap that raised: (the manifest now, ours if it landed, whether to keep our objects).

        Decided on the manifest read back, never on the error: a 412 may be a retried swap that had landed,
        and a transport error or 5xx says nothing either way. Re-raises ``exc`` (the caller keeps our
        objects) when our manifest has not landed but still may (the condition it was sent under holds)
        and the error was not a race, or when the manifest cannot be read back.
        """
        try:
            now = self.current()
        except Exception:
            raise exc from None  # cannot tell: its objects stay (the caller's finally sees keep unchanged)
        if now is not None and now.knows(new.version):
            landed = now if now.version == new.version else replace(new, etag="")
            logger.info(
                "publish to %r: the swap's answer was lost, its manifest landed (generation %d)",
                self.prefix,
                new.generation,
            )
            return now, landed, True
        condition_holds = now is None if seen is None else now is not None and now.etag == seen.etag
        if condition_holds:
            if _code(exc) in _RACE_CODES:  # 409: another conditional write was in flight; try again
                return now, None, False
            raise exc  # not landed yet, and a copy of the request may still land: keep its objects
        # The manifest moved on without it: this swap can never land. Kept only if it may have been
        # current before the lineage this manifest remembers.
        return now, None, now is not None and not now.remembers(new.generation)

    def _refuse_if_stale(self, seen: Manifest | None, fence: Fence, once: OnceRecord | None) -> None:
        if seen is not None and (seen.lock_key != fence.lock_key or seen.fencing_token > fence.fencing_token):
            raise refusal("s3", self.prefix, fence, seen)
        if seen is not None and once is not None and once.business_key in seen.once:
            raise already_done(OnceRecord.from_dict(seen.once[once.business_key]))

    # -- query engines' symlink manifest --------------------------------------------------------------

    def refresh_symlink_manifest(self) -> Manifest | None:
        """Bring the symlink manifest up to the current version (after a publisher died past its swap)."""
        manifest = self.current()
        if manifest is not None:
            self._point_engines(manifest)
        return manifest

    def _point_engines(self, manifest: Manifest) -> None:
        """Make the symlink manifest name ``manifest``'s objects, unless it names a later generation."""
        body = "".join(f"s3://{self.bucket}/{self.key_of(name, manifest)}\n" for name in manifest.objects)
        for _ in range(self.max_swaps):
            pointed = self._pointed()
            if pointed is not None and pointed[0] >= manifest.generation:
                return
            condition = {"IfMatch": pointed[2]} if pointed else {"IfNoneMatch": "*"}
            try:
                self.client.put_object(
                    Bucket=self.bucket,
                    Key=self.symlink_key,
                    Body=body.encode(),
                    ContentType="text/plain",
                    Metadata={"generation": str(manifest.generation), "version": manifest.version},
                    **condition,
                )
                return
            except Exception as exc:
                if _code(exc) not in _RACE_CODES:
                    raise
        raise SwapContended(f"the symlink manifest of {self.prefix!r} kept changing under its update")

    def _pointed(self) -> tuple[int, str, str] | None:
        """(generation, version, ETag) the symlink manifest names, or ``None`` if there is none."""
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.symlink_key)
        except Exception as exc:
            if _code(exc) in _MISSING_CODES:
                return None
            raise
        meta = head.get("Metadata", {})
        return int(meta.get("generation", 0)), str(meta.get("version", "")), str(head["ETag"])

    # -- old versions -------------------------------------------------------------------------------------

    def prune(self, older_than: timedelta) -> list[str]:
        """Delete versions no reader needs any more; return the versions deleted, sorted.

        Kept: the current version, the one the symlink manifest names, every version replaced less than
        ``older_than`` ago (a snapshot taken while it was current stays readable that long), and uploads
        of a token not older than the current one (a publish may be in flight). Deleted: versions replaced
        longer ago, and uploads of an older token that never became current (refused, or cut off).
        """
        if not isinstance(older_than, timedelta) or older_than < timedelta(0):
            raise ValueError(f"older_than must be a non-negative timedelta, got {older_than!r}")
        manifest = self.current()
        if manifest is None:
            return []
        cutoff = self.clock() - older_than
        keep = {manifest.version}
        if self.symlink_manifest and (pointed := self._pointed()) is not None:
            keep.add(pointed[1])
        keep.update(p.version for p in manifest.previous if p.until > cutoff)
        remembered = {p.version for p in manifest.previous}
        # A version missing from the lineage was never current, or stopped being current before the oldest
        # remembered one became current.
        forgotten_before = manifest.previous[-1].since if manifest.previous else manifest.written_at
        complete = manifest.remembers(1)
        doomed: dict[str, list[str]] = {}
        for version, keys in self._versions().items():
            if version in keep:
                continue
            token = _token_of(version)
            if version in remembered or (
                token is not None
                and token < manifest.fencing_token
                and (complete or forgotten_before <= cutoff)
            ):
                doomed[version] = keys
        self._delete([key for keys in doomed.values() for key in keys])
        return sorted(doomed)

    def _versions(self) -> dict[str, list[str]]:
        """Every version folder under the prefix, with its keys (one listing, no delimiter)."""
        root = f"{self.prefix}/versions/"
        found: dict[str, list[str]] = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=root):
            for o in page.get("Contents", []):
                found.setdefault(o["Key"][len(root) :].split("/", 1)[0], []).append(o["Key"])
        return found

    def _delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):  # DeleteObjects takes at most 1,000 keys
            batch = keys[start : start + 1000]
            self.client.delete_objects(
                Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
            )


def is_race(exc: BaseException) -> bool:
    """Whether ``exc`` is S3 refusing a conditional write because another one won (retry on a fresh read)."""
    return _code(exc) in _RACE_CODES


def _token_of(version: str) -> int | None:
    """The fencing token a version folder was uploaded under (``None``: not a folder of this adapter)."""
    head, _, rest = version.partition("-")
    return int(head) if head.isdigit() and len(head) == 20 and rest else None


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
