"""Deterministic shards of a run: ``--shard I/N`` keeps the images whose stable hash falls in
part I of N (I = 0..N-1), so N independent jobs (a Slurm array, N machines) together make
exactly the outputs of one run; ``perturb merge-manifests`` joins their folders.

The partition is a pure function of the img_id (BLAKE2b, never Python's ``hash()``): it does
not depend on the input's order, the engine, ``--batch-size`` or ``--workers``. ``--limit``
applies before sharding, so the shards of a limited run cover the same first N images.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from perturb.errors import InputError

_SPEC = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")


class ShardError(InputError):
    """A ``--shard`` value that cannot be used; the message shows the expected form."""


@dataclass(frozen=True)
class Shard:
    """Part ``index`` of ``count`` (0-based)."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ShardError(
                f"--shard {self.index}/{self.count}: expected I/N with I in 0..N-1 and N at least 1 "
                "(e.g. --shard 0/4 ... --shard 3/4)"
            )

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def holds(self, img_id: str) -> bool:
        """Whether ``img_id`` belongs to this shard."""
        return shard_of(img_id, self.count) == self.index


def shard_of(img_id: str, count: int) -> int:
    """The shard (0..count-1) of ``img_id``: a 64-bit BLAKE2b of its UTF-8 bytes, modulo count."""
    digest = hashlib.blake2b(
        img_id.encode("utf-8", errors="surrogatepass"), digest_size=8, person=b"perturb-shard"
    ).digest()
    return int.from_bytes(digest, "little") % count


def parse_shard(text: str | None) -> Shard | None:
    """``"I/N"`` -> Shard; None stays None."""
    if text is None:
        return None
    m = _SPEC.fullmatch(text)
    if not m:
        raise ShardError(f"--shard {text!r}: expected I/N with 0 <= I < N, e.g. --shard 0/4")
    return Shard(int(m.group(1)), int(m.group(2)))
