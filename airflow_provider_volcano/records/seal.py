"""Seals: an HMAC-SHA256 over a record's facts, keyed by a key derived from the service key.

Airflow Variables and XCom are writable by REST users and by every task's code, so a record stored
there is a claim until its seal verifies. Each record type has its own sealing key, derived from the
service key and the type's name (domain separation: a seal of one record type never verifies as
another), and the seal names which service key made it by a public fingerprint (``key_id``), so a
record sealed under a rotated-out key is told apart from one whose facts were changed.

A seal reads ``v1.<key id>.<mac>``; nothing in it helps to compute another (the MAC is keyed).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["ROTATED", "Keyring", "SealKey", "canonical"]

_VERSION = "v1"
_KEY_DOMAIN = b"volcano-locks/airflow/record-key/v1\x00"
_ID_DOMAIN = b"volcano-locks/airflow/key-id/v1"
ROTATED = "sealed under another key (was the service key rotated? add the old key to previous_service_keys)"
"""The refusal of a seal made under a service key the connection no longer lists."""


def canonical(facts: Mapping[str, object]) -> bytes:
    """The one byte form of a record's facts that seals are computed over (sorted, compact JSON)."""
    return json.dumps(dict(facts), sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class SealKey:
    """One service key as a sealing key: the secret (never in a repr) and its public fingerprint.

    :param secret: the service key.
    :param key_id: 16 hex digits that name the key in seals (an HMAC of a constant: reveals nothing).
    """

    secret: str = field(repr=False)
    key_id: str

    @classmethod
    def of(cls, service_key: str) -> SealKey:
        """The sealing key of ``service_key``."""
        if not isinstance(service_key, str) or not service_key:
            raise ValueError("a service key must be a non-empty string")
        key_id = hmac.new(service_key.encode(), _ID_DOMAIN, hashlib.sha256).hexdigest()[:16]
        return cls(service_key, key_id)

    def mac(self, record_type: str, facts: Mapping[str, object]) -> str:
        """The MAC (hex) of ``facts`` as a ``record_type`` record, under this key's key for that type."""
        type_key = hmac.new(self.secret.encode(), _KEY_DOMAIN + record_type.encode(), hashlib.sha256).digest()
        return hmac.new(type_key, canonical(facts), hashlib.sha256).hexdigest()

    def seal(self, record_type: str, facts: Mapping[str, object]) -> str:
        """The seal of ``facts`` as a ``record_type`` record (``v1.<key id>.<mac>``)."""
        return f"{_VERSION}.{self.key_id}.{self.mac(record_type, facts)}"


@dataclass(frozen=True)
class Keyring:
    """The connection's service key, and the previous ones still honoured during a rotation.

    Records are sealed under the current key; a seal made under a listed previous key verifies too,
    so records written before a rotation keep working while the old key stays listed.

    :param current: the key new seals are made under.
    :param previous: keys whose seals are still honoured (``previous_service_keys``).
    """

    current: SealKey
    previous: tuple[SealKey, ...] = ()

    @classmethod
    def of(cls, service_key: str, previous: Iterable[str] = ()) -> Keyring:
        """The keyring of a service key and the previous keys still honoured."""
        current = SealKey.of(service_key)
        older = tuple(SealKey.of(k) for k in dict.fromkeys(previous) if k != service_key)
        return cls(current, older)

    def find(self, key_id: object) -> SealKey | None:
        """The listed key whose fingerprint is ``key_id`` (``None``: not listed, e.g. rotated out)."""
        return next((k for k in (self.current, *self.previous) if k.key_id == key_id), None)

    def seal(self, record_type: str, facts: Mapping[str, object]) -> str:
        """Seal ``facts`` as a ``record_type`` record under the current key."""
        return self.current.seal(record_type, facts)

    def verify(self, record_type: str, facts: Mapping[str, object], seal: object) -> SealKey | str:
        """The key that made ``seal`` over ``facts`` as a ``record_type`` record, or why none did.

        The reason never names a key nor the seal; a record sealed under a key no longer listed is
        :data:`ROTATED`, never called a forgery (nobody can tell the two apart, and rotation is the
        common case).
        """
        if not isinstance(seal, str) or not seal:
            return "it carries no seal (written by an older provider, or not by the provider)"
        parts = seal.split(".")
        if len(parts) != 3 or parts[0] != _VERSION:
            return "its seal is not in a form this provider makes"
        _version, key_id, mac = parts
        for key in (self.current, *self.previous):
            if key.key_id == key_id:
                if hmac.compare_digest(mac, key.mac(record_type, facts)):
                    return key
                return (
                    "its seal does not match its facts (changed after it was sealed, or not sealed by "
                    "the provider)"
                )
        return ROTATED
