"""Safe file names for img_ids, and paths that cannot leave the output folder.

An img_id is used as a file stem as is when it is a plain name: ASCII letters, digits, ``.``,
``_`` and ``-``, not starting with ``.``, at most ``MAX_STEM`` characters. Anything else is
percent-encoded byte by byte (UTF-8; ``%`` itself included), so ``../x`` becomes ``%2E%2E%2Fx``
and ``a/b`` becomes ``a%2Fb``; the encoding is injective, so two ids never share a file. Encoded
stems longer than ``MAX_STEM`` keep a prefix and end in ``~`` plus a hash of the id (``~`` is
never produced by the encoding). The manifest records both the img_id and the stem.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from perturb.errors import InputError

MAX_STEM = 120
_PLAIN = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
_SAFE_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


class UnsafePathError(InputError):
    """A path that would leave the output folder."""


def safe_stem(img_id: str) -> str:
    """A file stem for ``img_id`` that is a single, portable path component."""
    if _PLAIN.fullmatch(img_id) and len(img_id) <= MAX_STEM:
        return img_id
    if img_id == "":
        return "%empty"
    data = img_id.encode("utf-8", errors="surrogatepass")
    encoded = "".join(
        chr(b) if chr(b) in _SAFE_CHARS and not (i == 0 and b == 0x2E) else f"%{b:02X}"
        for i, b in enumerate(data)
    )
    if len(encoded) <= MAX_STEM:
        return encoded
    digest = hashlib.blake2b(data, digest_size=8).hexdigest()
    prefix = encoded[: MAX_STEM - len(digest) - 1]
    cut = prefix.rfind("%", len(prefix) - 2)  # do not end inside a %XX escape
    if cut != -1:
        prefix = prefix[:cut]
    return f"{prefix}~{digest}"


def is_encoded(img_id: str) -> bool:
    return safe_stem(img_id) != img_id


def resolve_inside(root: Path, relative: str) -> Path:
    """``root / relative`` after checking that it stays inside ``root`` (no absolute path, no
    ``..``, no symlink pointing out)."""
    parts = relative.split("/")
    if any(part in ("", ".", "..") for part in parts) or "\\" in relative or "\x00" in relative:
        raise UnsafePathError(f"output path {relative!r} is not a plain relative path")
    root_resolved = root.resolve()
    target = (root_resolved / Path(*parts)).resolve()
    if root_resolved != target and root_resolved not in target.parents:
        raise UnsafePathError(f"output path {relative!r} resolves outside {root}")
    return target
