"""Keys: every random quantity derives from (seed, sample key, op, severity, variant).

``derive_key`` hashes the canonical string ``seed|sample_key|op|severity|variant`` with BLAKE2b
into an unsigned 64-bit key; ``sub_key`` derives an independent key for a named stream of a key.
Python's ``hash()`` and global RNG state are never used. Records store keys as 16 hex digits.
The NumPy / torch streams drawn from these keys are in :mod:`perturb.rng`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from perturb.errors import InputError


def canonical(seed: int, sample_key: str, op: str, severity: int, variant: int) -> str:
    """The canonical string that a key is the hash of."""
    return f"{int(seed)}|{sample_key}|{op}|{int(severity)}|{int(variant)}"


def derive_key(seed: int, sample_key: str, op: str, severity: int, variant: int = 0) -> int:
    """Stable unsigned 64-bit key of (seed, sample key, op, severity, variant).

    The engine draws with ``severity=0`` (see ``perturb.engine.run.make_record``): the five
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


def check_sample_keys(
    keys: Any, n: int, severities: Sequence[int], variants: Sequence[int], name: str = "sample_keys"
) -> list[str]:
    """``keys`` as the strings keys are derived from: one per image (``n``), each a non-empty
    string or an integer (not a bool, not None: ``str(None)`` would give every such image the key
    "None"), and no two images with one (key, severity, variant), which would get the same random
    numbers. Raises InputError naming the entry and the fix."""
    if isinstance(keys, str | bytes) or not isinstance(keys, Sequence) or len(keys) != n:
        raise InputError(
            f"{name} must be a sequence with one stable id per image ({n}), got {keys!r:.80}"
        )
    out: list[str] = []
    seen: dict[tuple[str, int, int], int] = {}
    for i, key in enumerate(keys):
        if isinstance(key, bool) or not isinstance(key, str | int) or key == "":
            raise InputError(
                f"{name}[{i}] is {key!r:.40}: each image needs a non-empty string or integer id "
                "(e.g. its file name or dataset index)"
            )
        text = str(key)
        twin = seen.setdefault((text, severities[i], variants[i]), i)
        if twin != i:
            raise InputError(
                f"{name}[{twin}] and {name}[{i}] are both {text!r:.40} at one severity and variant: "
                "the two images would get the same random numbers; give each image its own id "
                "(use param_keys to share parameters on purpose)"
            )
        out.append(text)
    return out
