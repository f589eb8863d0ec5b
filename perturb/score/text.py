"""Batch tokenisation of many strings into flat integer token tables.

Two tokenisations are produced together:

* ``rouge``: rouge-score's default tokenizer without stemming (lower-case, every run of
  characters outside ``[a-z0-9]`` becomes a space, split);
* ``tolerant``: NFKC, lower case, every character that is not a letter or digit becomes a space,
  split, the articles a/an/the dropped and the number words zero..twenty written as digits.

ASCII strings (nearly all VQA answers) go through pyarrow compute kernels in C; for them both
tokenisations split identically. Other strings use the exact Python definitions. A table holds
the token ids of all strings in one flat array plus offsets, which the vectorised overlap / LCS
code (:mod:`perturb.score.bitseq`) pads chunk by chunk.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

NUMBER_WORDS = {
    w: str(i)
    for i, w in enumerate(
        [
            "zero",
            "one",
            "two",
            "three",
            "four",
            "five",
            "six",
            "seven",
            "eight",
            "nine",
            "ten",
            "eleven",
            "twelve",
            "thirteen",
            "fourteen",
            "fifteen",
            "sixteen",
            "seventeen",
            "eighteen",
            "nineteen",
            "twenty",
        ]
    )
}
ARTICLES = frozenset({"a", "an", "the"})
_NON_WORD = re.compile(r"[\W_]+")
_ROUGE_NON_ALNUM = re.compile(r"[^a-z0-9]+")


def tolerant_split(s: str) -> list[str]:
    """Tolerant tokens before article / number-word mapping."""
    return _NON_WORD.sub(" ", unicodedata.normalize("NFKC", s).lower()).split()


def tolerant_tokens(s: str) -> tuple[str, ...]:
    """Tolerant tokens of one string (articles dropped, number words as digits)."""
    return tuple(NUMBER_WORDS.get(t, t) for t in tolerant_split(s) if t not in ARTICLES)


def rouge_split(s: str) -> list[str]:
    """rouge-score's tokenizer (no stemmer): lower, non-[a-z0-9] runs to spaces, split."""
    return _ROUGE_NON_ALNUM.sub(" ", s.lower()).split()


@dataclass
class TokenTable:
    """Token ids of n strings: ``ids[offsets[i]:offsets[i+1]]`` are string i's tokens."""

    ids: np.ndarray
    offsets: np.ndarray
    vocab: list[str]

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per string."""
        return np.diff(self.offsets)

    def tokens(self, i: int) -> list[int]:
        """Token ids of string ``i``."""
        return self.ids[self.offsets[i] : self.offsets[i + 1]].tolist()  # type: ignore[no-any-return,unused-ignore]

    def padded(self, rows: np.ndarray, pad: int, width: int | None = None) -> np.ndarray:
        """Token ids of ``rows`` as a (len(rows) x width) matrix padded with ``pad``."""
        lens = self.lengths[rows]
        w = int(lens.max(initial=0)) if width is None else width
        out = np.full((len(rows), max(w, 1)), pad, dtype=np.int64)
        if w == 0:
            return out
        j = np.arange(w)
        mask = j[None, :] < lens[:, None]
        out[:, :w][mask] = self.ids[(self.offsets[rows][:, None] + j[None, :])[mask]]
        return out

    def bigrams(self) -> TokenTable:
        """Table of adjacent token pairs (id = first * |vocab| + second)."""
        n = len(self.offsets) - 1
        lens = self.lengths
        v = max(len(self.vocab), 1)
        if self.ids.size < 2:
            return TokenTable(np.zeros(0, np.int64), np.zeros(n + 1, np.int64), [])
        keep = np.ones(self.ids.size - 1, dtype=bool)
        ends = self.offsets[1:][lens > 0] - 1  # last token of each non-empty row
        keep[ends[ends < keep.size]] = False
        pos = np.flatnonzero(keep)
        ids = self.ids[pos] * v + self.ids[pos + 1]
        new_lens = np.maximum(lens - 1, 0)
        return TokenTable(ids, np.r_[0, np.cumsum(new_lens)].astype(np.int64), [])


def _from_lists(lists: pa.ListArray, n: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    lens = pc.list_value_length(lists).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = pc.list_flatten(lists)
    nonempty = pc.greater(pc.utf8_length(flat), 0)
    row = np.repeat(np.arange(n), lens)
    keep = nonempty.to_numpy(zero_copy_only=False)
    flat = flat.filter(nonempty)
    lens = np.bincount(row[keep], minlength=n).astype(np.int64)
    enc = flat.dictionary_encode()
    ids = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    vocab = enc.dictionary.to_pylist()
    return ids, np.r_[0, np.cumsum(lens)].astype(np.int64), vocab


def _tolerant_map(ids: np.ndarray, offsets: np.ndarray, vocab: list[str]) -> TokenTable:
    """Apply article dropping and number-word mapping at the vocabulary level."""
    vocab = list(vocab)
    index = {t: i for i, t in enumerate(vocab)}
    remap = np.arange(len(vocab), dtype=np.int64)
    for i, t in enumerate(list(vocab)):
        if t in ARTICLES:
            remap[i] = -1
        elif t in NUMBER_WORDS:
            d = NUMBER_WORDS[t]
            if d not in index:
                index[d] = len(vocab)
                vocab.append(d)
                remap = np.r_[remap, len(vocab) - 1]
            remap[i] = index[d]
    new = remap[ids] if ids.size else ids
    keep = new >= 0
    n = len(offsets) - 1
    row = np.repeat(np.arange(n), np.diff(offsets))
    lens = np.bincount(row[keep], minlength=n).astype(np.int64)
    return TokenTable(new[keep], np.r_[0, np.cumsum(lens)].astype(np.int64), vocab)


_ASCII_MAP = np.array(
    [
        c if (48 <= c <= 57 or 97 <= c <= 122) else (c + 32 if 65 <= c <= 90 else 32)
        for c in range(256)
    ],
    dtype=np.uint8,
)


def _ascii_words(arr: pa.Array) -> pa.Array:
    """Lower-case and blank every byte outside [a-z0-9] (a byte table over the value buffer),
    then split on whitespace. Exact for ASCII strings."""
    arr = pa.concat_arrays([arr]) if arr.offset else arr
    _, offsets, data = arr.buffers()
    if data is None:
        mapped = data
    else:
        raw = np.frombuffer(data, dtype=np.uint8)
        mapped = pa.py_buffer(_ASCII_MAP[raw].tobytes())
    clean = pa.Array.from_buffers(arr.type, len(arr), [None, offsets, mapped])
    return pc.ascii_split_whitespace(clean)


def tokenize(strings: np.ndarray) -> tuple[TokenTable, TokenTable]:
    """(rouge, tolerant) token tables of ``strings`` (an object array of str)."""
    n = len(strings)
    arr = pa.array(strings, type=pa.large_string())
    ascii_mask = pc.string_is_ascii(arr).to_numpy(zero_copy_only=False)
    lists_ascii = _ascii_words(arr)
    other = np.flatnonzero(~ascii_mask)
    if other.size == 0:
        ids, off, vocab = _from_lists(lists_ascii, n)
        return TokenTable(ids, off, vocab), _tolerant_map(ids, off, vocab)
    order = np.r_[np.flatnonzero(ascii_mask), other]
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = np.arange(n)
    base = lists_ascii.filter(pa.array(ascii_mask))
    out = []
    for split in (rouge_split, tolerant_split):
        extra = pa.array([split(strings[i]) for i in other], type=lists_ascii.type)
        merged = pa.concat_arrays([base, extra]).take(pa.array(inverse))
        out.append(_from_lists(merged, n))
    (ri, ro, rv), (ti, to, tv) = out
    return TokenTable(ri, ro, rv), _tolerant_map(ti, to, tv)


def sequences_equal(
    table: TokenTable, a: np.ndarray, b: np.ndarray, chunk: int = 1 << 16
) -> np.ndarray:
    """Whether string rows ``a[i]`` and ``b[i]`` have identical token sequences."""
    out = np.zeros(len(a), dtype=bool)
    lens = table.lengths
    same_len = np.flatnonzero(lens[a] == lens[b])
    for s in range(0, same_len.size, chunk):
        idx = same_len[s : s + chunk]
        w = int(lens[a[idx]].max(initial=0))
        A = table.padded(a[idx], -1, w)
        B = table.padded(b[idx], -1, w)
        out[idx] = (A == B).all(axis=1)
    return out
