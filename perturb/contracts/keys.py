"""Keys: every random quantity derives from (seed, sample key, op, severity, variant).

``derive_key`` hashes the canonical string ``seed|sample_key|op|severity|variant`` with BLAKE2b
into an unsigned 64-bit key; ``sub_key`` derives an independent key for a named stream of a key.
Python's ``hash()`` and global RNG state are never used. Records store keys as 16 hex digits.
The NumPy / torch streams drawn from these keys are in :mod:`perturb.rng`.
"""

from __future__ import annotations

import hashlib


def canonical(seed: int, sample_key: str, op: str, severity: int, variant: int) -> str:
    """The canonical string that a key is the hash of."""
    return f"{int(seed)}|{sample_key}|{op}|{int(severity)}|{int(variant)}"


def derive_key(seed: int, sample_key: str, op: str, severity: int, variant: int = 0) -> int:
    """Stable unsigned 64-bit key of (seed, sample key, op, severity, variant).

    The engine draws with ``severity=0`` (see ``perturb.engine.make_record``): the five
    severities of a sample share their random numbers and differ only in the table's ranges."""
    text = canonical(seed, sample_key, op, severity, variant)
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def sub_key(key: int, stream: str) -> int:
    """Independent 64-bit key for a named stream (e.g. ``"noise"``) of a key."""
    data = key.to_bytes(8, "little") + stream.encode("utf-8")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def key_to_hex(key: int) -> str:
    """A key as records store it: 16 lower-case hex digits."""
    return f"{key:016x}"


def key_from_hex(text: str) -> int:
    """The key of a record's hex string."""
    return int(text, 16)
