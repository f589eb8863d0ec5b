"""Vectorised paired cluster bootstrap.

Every statistic the scorer reports is a smooth function of column totals over the pairs of a
*cell* (e.g. one perturbation x severity): sums of clean and perturbed metric values, counts,
flip counts, corpus-metric sufficient statistics. Resampling img_id clusters with replacement is
the same as giving cluster ``j`` the weight ``w_bj`` = number of times it was drawn in resample
``b``; a resample's totals are then ``W @ S`` with ``S`` the per-cluster sums of the cell. So:

1. per cell, sum the value columns per cluster once (sort + ``np.add.reduceat``);
2. draw the count matrix ``W`` (B x clusters) once, seeded; resample ``b`` comes from its own
   ``SeedSequence([seed, b])`` stream, so it does not depend on chunking or on other resamples;
3. multiply ``W`` by the stacked per-cluster sums of many cells in blocks (one BLAS GEMM per
   block), giving every cell's B resampled totals;
4. compute each statistic (means, differences, ratios, corpus BLEU/chrF from summed statistics)
   from point and resampled totals; the CI is the percentile interval.

All cells share the same resamples, so differences between cells (severity curves, CE, effective
robustness across models) are bootstrapped jointly.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from scipy import sparse

_DENSE_BUDGET = 1 << 24  # entries of one stacked per-cluster block (128 MiB in float64)
_W_CHUNK = 128


MEMORY_BUDGET = 2 << 30  # bytes the resamples may take (PERTURB_BOOTSTRAP_MAX_BYTES overrides)


def memory_estimate(n_boot: int, n_clusters: int, width: int) -> int:
    """Bytes the bootstrap holds at its peak: the draw counts (uint16, then a uint8 copy), the
    resampled totals of every cell (float64) and one dense block."""
    block = min(width, max(_DENSE_BUDGET // max(n_clusters, 1), 1))
    return n_boot * (3 * n_clusters + 8 * width + 8 * block)


def check_memory(n_boot: int, n_clusters: int, width: int) -> None:
    """InputError when the resamples would take more than the budget, with the estimate."""
    import os

    from perturb.errors import InputError

    budget = int(os.environ.get("PERTURB_BOOTSTRAP_MAX_BYTES", MEMORY_BUDGET))
    need = memory_estimate(n_boot, n_clusters, width)
    if need > budget:
        fit = max(budget // max(need // n_boot, 1), 1)
        raise InputError(
            f"--bootstrap {n_boot} over {n_clusters} image clusters and {width} statistics needs "
            f"about {need / 2**30:.1f} GiB (budget {budget / 2**30:.1f} GiB); use --bootstrap "
            f"{min(fit, 10000)} or fewer (or raise PERTURB_BOOTSTRAP_MAX_BYTES)"
        )


@lru_cache(maxsize=2)
def resample_counts(n_clusters: int, n_boot: int, seed: int) -> np.ndarray:
    """Cluster draw counts of each resample, shape (n_boot, n_clusters), uint8 or uint16.

    Resample ``b`` draws ``n_clusters`` clusters uniformly with replacement from the stream
    ``SeedSequence([seed, b])``. The (read-only) result is cached for repeated calls.
    """
    out = np.zeros((n_boot, n_clusters), dtype=np.uint16)
    for b in range(n_boot):
        g = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), b])))
        out[b] = np.bincount(g.integers(0, n_clusters, n_clusters), minlength=n_clusters)
    res = out.astype(np.uint8) if out.max(initial=0) < 256 else out
    res.flags.writeable = False
    return res


@dataclass
class Cell:
    """One group of pairs: point totals, resampled totals (None for a cell of one image),
    sizes, and per column the sum over clusters of the squared cluster totals (``cluster_sq``:
    the clustered McNemar's variance)."""

    key: tuple[Hashable, ...]
    point: np.ndarray
    n_rows: int
    n_clusters: int
    boot: np.ndarray | None = None
    cluster_sq: np.ndarray | None = None


@dataclass
class CellEngine:
    """Collects cells (per-cluster sums) and bootstraps all of them with shared resamples."""

    n_clusters: int
    n_boot: int
    seed: int
    cells: dict[tuple[Hashable, ...], Cell] = field(default_factory=dict)
    _sums: dict[tuple[Hashable, ...], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def add(
        self,
        keys: Sequence[tuple[Hashable, ...]],
        cell_code: np.ndarray,
        cluster: np.ndarray,
        values: np.ndarray,
    ) -> None:
        """Add one cell per entry of ``keys``; row ``i`` belongs to cell ``cell_code[i]``.

        Rows with a negative code belong to no cell. ``values`` is (rows x k) float64.
        """
        sel = np.flatnonzero(cell_code >= 0)
        if sel.size == 0:
            return
        combo = cell_code[sel].astype(np.int64) * self.n_clusters + cluster[sel].astype(np.int64)
        groups, inv = np.unique(combo, return_inverse=True)
        inv = inv.reshape(-1)
        # per-(cell, cluster) sums as one sparse-dense product (cheaper than sort + reduceat)
        G = sparse.csr_matrix((np.ones(sel.size), (inv, sel)), shape=(groups.size, len(values)))
        sums = np.asarray(G @ values)
        rows_per = np.bincount(inv, minlength=groups.size)
        g_cell = groups // self.n_clusters
        g_clus = groups % self.n_clusters
        cstarts = np.flatnonzero(np.r_[True, g_cell[1:] != g_cell[:-1]])
        cends = np.r_[cstarts[1:], len(g_cell)]
        for s, e in zip(cstarts, cends, strict=True):
            key = keys[int(g_cell[s])]
            cell_sums = sums[s:e]
            self.cells[key] = Cell(
                key=key,
                point=cell_sums.sum(axis=0),
                n_rows=int(rows_per[s:e].sum()),
                n_clusters=int(e - s),
                cluster_sq=np.einsum("ij,ij->j", cell_sums, cell_sums),
            )
            self._sums[key] = (g_clus[s:e], cell_sums)

    def run(self) -> None:
        """Compute every cell's resampled totals (B x k)."""
        if self.n_boot <= 0 or not self.cells:
            return
        check_memory(self.n_boot, self.n_clusters, sum(s.shape[1] for _, s in self._sums.values()))
        W = resample_counts(self.n_clusters, self.n_boot, self.seed)
        keys = list(self._sums)
        block: list[tuple[Hashable, ...]] = []
        width = 0
        budget = max(_DENSE_BUDGET // max(self.n_clusters, 1), 1)
        for key in keys:
            k = self._sums[key][1].shape[1]
            if block and width + k > budget:
                self._run_block(W, block)
                block, width = [], 0
            block.append(key)
            width += k
        if block:
            self._run_block(W, block)
        self._sums.clear()

    def _run_block(self, W: np.ndarray, block: list[tuple[Hashable, ...]]) -> None:
        widths = [self._sums[k][1].shape[1] for k in block]
        offsets = np.r_[0, np.cumsum(widths)]
        D = np.zeros((self.n_clusters, int(offsets[-1])), dtype=np.float64)
        for key, o, w in zip(block, offsets[:-1], widths, strict=True):
            clus, sums = self._sums[key]
            D[clus, o : o + w] = sums
        out = np.empty((self.n_boot, D.shape[1]), dtype=np.float64)
        step = max(_W_CHUNK, _DENSE_BUDGET // max(self.n_clusters, 1))
        for start in range(0, self.n_boot, step):
            out[start : start + step] = W[start : start + step].astype(np.float64) @ D
        for key, o, w in zip(block, offsets[:-1], widths, strict=True):
            # a cell of one image resamples to itself: a zero-width interval that would read
            # as certainty, so it gets none
            if self.cells[key].n_clusters >= 2:
                self.cells[key].boot = out[:, o : o + w].copy()
