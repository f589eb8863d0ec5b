"""Vectorised longest-common-subsequence and multiset-overlap lengths for many token pairs.

Bit-parallel LCS (Allison & Dix 1986; Hyyrö 2004): the shorter sequence of each pair becomes a
64-bit match mask per token of the longer one, and all pairs advance together in numpy:
``U = V & M; V = (V + U) | (V - U)``; the LCS length is the number of zero bits of ``V``. The
same masks give the multiset intersection size (each match claims the lowest free position of
the shorter sequence), which is what ROUGE-N and token F1 count. Pairs whose shorter side
exceeds 64 tokens use an exact pure-Python fallback. Results equal the dynamic-programming
definitions exactly.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from perturb.score.text import TokenTable

WORD = 64
_CHUNK = 1 << 15
_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)


def lcs_dp(a: Sequence[int], b: Sequence[int]) -> int:
    """LCS length by dynamic programming (reference implementation)."""
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b, start=1):
            cur.append(prev[j - 1] + 1 if x == y else max(prev[j], cur[j - 1]))
        prev = cur
    return prev[-1]


def overlap_counter(a: Sequence[int], b: Sequence[int]) -> int:
    """Multiset intersection size (reference implementation)."""
    ca, cb = Counter(a), Counter(b)
    return sum(min(n, cb[k]) for k, n in ca.items())


def pair_stats(
    table: TokenTable, a: np.ndarray, b: np.ndarray, want_lcs: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """LCS length and multiset overlap of token rows ``a[i]`` and ``b[i]`` of ``table``."""
    n = len(a)
    lcs = np.zeros(n, dtype=np.int64)
    ovl = np.zeros(n, dtype=np.int64)
    if n == 0:
        return lcs, ovl
    lens = table.lengths
    la, lb = lens[a], lens[b]
    a_short = la <= lb
    s_rows = np.where(a_short, a, b)
    l_rows = np.where(a_short, b, a)
    ls = np.minimum(la, lb)
    ll = np.maximum(la, lb)
    for i in np.flatnonzero(ls > WORD):
        x, y = table.tokens(int(a[i])), table.tokens(int(b[i]))
        lcs[i] = lcs_dp(x, y) if want_lcs else 0
        ovl[i] = overlap_counter(x, y)
    idx = np.flatnonzero((ls > 0) & (ls <= WORD))
    if idx.size == 0:
        return lcs, ovl
    idx = idx[np.argsort(ll[idx], kind="stable")]  # similar scan lengths together
    one = np.uint64(1)
    for start in range(0, idx.size, _CHUNK):
        sel = idx[start : start + _CHUNK]
        S = table.padded(s_rows[sel], -1)
        L = table.padded(l_rows[sel], -2)
        m, ws = S.shape
        wl = int(ll[sel].max())
        V: np.ndarray = np.full(m, _ONES)
        used = np.zeros(m, dtype=np.uint64)
        cnt = np.zeros(m, dtype=np.int64)
        nbytes = (ws + 7) // 8
        buf = np.zeros((m, 8), dtype=np.uint8)
        for j in range(wl):
            eq = L[:, j : j + 1] == S
            buf[:, :nbytes] = np.packbits(eq, axis=1, bitorder="little")
            M = buf.view(np.uint64).reshape(m)
            if want_lcs:
                U = V & M
                V = (V + U) | (V - U)
            avail = M & ~used
            low = avail & (~avail + one)
            used |= low
            cnt += avail != 0
        if want_lcs:
            k = ls[sel].astype(np.uint64)
            mask = np.where(k >= WORD, _ONES, (one << np.minimum(k, np.uint64(63))) - one)
            lcs[sel] = np.bitwise_count(~V & mask).astype(np.int64)
        ovl[sel] = cnt
    return lcs, ovl
