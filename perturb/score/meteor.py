"""METEOR through nltk's implementation, with WordNet 3.0 shipped in the package (offline).

The Kvasir-VQA-x1 evaluation (and the ``evaluate`` "meteor" metric it uses) scores each item with
``nltk.translate.meteor_score.single_meteor_score(word_tokenize(ref), word_tokenize(pred))``
(alpha 0.9, beta 3, gamma 0.5; exact, Porter-stem and WordNet-synonym matches) and reports the
mean. This module calls that same nltk function; only two inputs differ from a stock install:

* WordNet: nltk's own ``WordNetCorpusReader`` reads ``data/wordnet_meteor.zip``, WordNet 3.0
  (Princeton licence in the zip's LICENSE, redistribution permitted) stripped to what METEOR
  looks up (words of every synset; no glosses or pointers). ``synsets(w)`` and ``lemma_names()``
  equal those of the full database (tested). Nothing is downloaded.
* Tokens: nltk's Treebank word tokenizer on the whole answer (``word_tokenize(...,
  preserve_line=True)``), because the punkt sentence model that plain ``word_tokenize`` needs is
  data nltk does not ship. The two differ only where a full stop ends a sentence inside an answer
  ("polyp. It" -> ``polyp.`` instead of ``polyp`` ``.``); single-sentence answers tokenise alike.
"""

from __future__ import annotations

import threading
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

DATA = Path(__file__).parent / "data" / "wordnet_meteor.zip"
ALPHA, BETA, GAMMA = 0.9, 3.0, 0.5
_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def wordnet() -> Any:
    """nltk ``WordNetCorpusReader`` over the packaged WordNet 3.0 (loaded once, about 1 s)."""
    import nltk.data
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    from perturb.errors import InputError

    class _Reader(WordNetCorpusReader):
        def map_wn(self, version: str = "wordnet") -> None:
            # the data is WordNet 3.0 itself: no mapping to 3.0 (for multilingual data) needed,
            # and building one would look for nltk's downloadable copy
            return None

    if not DATA.is_file():  # pragma: no cover - broken install
        raise InputError(f"METEOR needs {DATA} (package data); reinstall perturb")
    root = str(DATA.parent)
    with _LOCK:
        if root not in nltk.data.path:
            # nltk only opens files under its data paths; allow the package's own data folder
            nltk.data.path.append(root)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "multilingual functions are not available"
            return _Reader(nltk.data.ZipFilePathPointer(str(DATA), "wordnet/"), None)


def tokens(text: str) -> list[str]:
    """nltk's Treebank word tokens of ``text`` (no punkt sentence split, see module doc)."""
    from nltk.tokenize import word_tokenize

    return list(word_tokenize(text, preserve_line=True))


class _CachedStemmer:
    """A stemmer whose ``stem`` is memoised (nltk's METEOR stems every word of every pair)."""

    def __init__(self, stemmer: Any) -> None:
        self._stem = lru_cache(maxsize=1 << 16)(stemmer.stem)

    def stem(self, word: str) -> str:
        return str(self._stem(word))


class _Name:
    """A lemma stand-in: nltk's METEOR only calls ``name()``."""

    __slots__ = ("_n",)

    def __init__(self, name: str) -> None:
        self._n = name

    def name(self) -> str:
        return self._n


class _Synonyms:
    """One synset stand-in holding every distinct lemma name of a word's synsets."""

    __slots__ = ("_lemmas",)

    def __init__(self, names: list[str]) -> None:
        self._lemmas = [_Name(n) for n in names]

    def lemmas(self) -> list[_Name]:
        return self._lemmas


class _CachedWordNet:
    """The WordNet reader as nltk's METEOR uses it, memoised per word.

    METEOR builds, per hypothesis word, the set of lemma names (without ``_``) of the word's
    synsets. ``synsets(word)`` here returns one stand-in synset with those names, each once, so
    the set is the same and is built from a short list (a word's synsets repeat names).
    """

    def __init__(self, reader: Any) -> None:
        def names(word: str) -> list[_Synonyms]:
            seen = dict.fromkeys(
                lemma.name()
                for synset in reader.synsets(word)
                for lemma in synset.lemmas()
                if "_" not in lemma.name()
            )
            return [_Synonyms(list(seen))] if seen else []

        self._synsets = lru_cache(maxsize=1 << 17)(names)

    def synsets(self, word: str) -> list[_Synonyms]:
        return self._synsets(word)


def meteor_scores(pred: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per-row METEOR of ``pred[i]`` vs ``ref[i]`` (NaN where the reference is missing).

    Computed once per distinct (prediction, reference) pair with nltk's
    ``single_meteor_score`` and the packaged WordNet.
    """
    from nltk.stem.porter import PorterStemmer
    from nltk.translate.meteor_score import single_meteor_score

    n = len(pred)
    out = np.full(n, np.nan)
    wn: _CachedWordNet | None = None
    stemmer = _CachedStemmer(PorterStemmer())
    cache: dict[tuple[str, str], float] = {}
    tok: dict[str, list[str]] = {}
    for i in range(n):
        r, p = ref[i], pred[i]
        if not isinstance(r, str):
            continue
        p = p if isinstance(p, str) else ""
        key = (p, r)
        v = cache.get(key)
        if v is None:
            if wn is None:
                wn = _CachedWordNet(wordnet())
            tp = tok.get(p)
            if tp is None:
                tp = tok[p] = tokens(p)
            tr = tok.get(r)
            if tr is None:
                tr = tok[r] = tokens(r)
            v = float(
                single_meteor_score(
                    tr, tp, stemmer=stemmer, wordnet=wn, alpha=ALPHA, beta=BETA, gamma=GAMMA
                )
            )
            cache[key] = v
        out[i] = v
    return out
