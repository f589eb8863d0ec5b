"""The blinded check's scorer: one reviewer, and several pooled."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCORE = Path(__file__).resolve().parents[2] / "benchmarks" / "realism" / "score.py"


@pytest.fixture(scope="module")
def scorer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("realism_score", SCORE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


KEY = {
    "pairs": {
        "pair_01": {"id": "a_1", "op": "a", "real": "A"},
        "pair_02": {"id": "a_2", "op": "a", "real": "B"},
        "pair_03": {"id": "b_1", "op": "b", "real": "A"},
    }
}


def test_one_reviewer(scorer: ModuleType) -> None:
    res = scorer.score_reviewers(KEY, [{"pair_01": "A", "pair_02": "A", "pair_03": "b"}])
    assert (res["ops"]["a"]["n"], res["ops"]["a"]["correct"]) == (2, 1)
    assert res["ops"]["b"]["correct"] == 0
    assert res["ops"]["a"]["meets_target"] and "reviewers" not in res


def test_reviewers_are_pooled_with_their_own_figures_and_agreement(scorer: ModuleType) -> None:
    first = {"pair_01": "A", "pair_02": "B", "pair_03": "A"}  # all real
    second = {"pair_01": "B", "pair_02": "B", "pair_03": ""}  # one right, one unanswered
    res = scorer.score_reviewers(KEY, [first, second])
    assert (res["ops"]["a"]["n"], res["ops"]["a"]["correct"]) == (4, 3)
    assert (res["overall"]["n"], res["overall"]["correct"]) == (5, 4)
    assert res["unanswered"] == ["pair_03/r2"]
    assert [r["overall"]["correct"] for r in res["reviewers"]] == [3, 1]
    assert res["agreement"] == pytest.approx(0.5)  # pair_01 differs, pair_02 agrees
    table = scorer.to_markdown(res)
    assert "| a | 4 | 3 | 75% |" in table and "2/2, 1/2" in table


def test_sessions_never_show_a_frame_twice() -> None:
    spec = importlib.util.spec_from_file_location("realism_pairs", SCORE.parent / "make_pairs.py")
    assert spec is not None and spec.loader is not None
    pairs = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = pairs  # its dataclasses resolve their annotations there
    spec.loader.exec_module(pairs)
    key = {
        "pairs": {
            "pair_01": {"real_source": "f1", "synthetic_source": "f2"},
            "pair_02": {"real_source": "f1", "synthetic_source": "f3"},  # f1 again
            "pair_03": {"real_source": "f4", "synthetic_source": "f5"},
            "pair_04": {"real_source": "f6", "synthetic_source": "f2"},  # f2 again
            "pair_05": {"real_source": "f3", "synthetic_source": "f1"},  # f1, f3 again
        }
    }
    sessions = pairs.split_sessions(key)
    assert sorted(n for s in sessions for n in s) == sorted(key["pairs"])
    for names in sessions:
        frames = [key["pairs"][n][side] for n in names for side in ("real_source", "synthetic_source")]
        assert len(frames) == len(set(frames)), names
    assert sessions[0] == ["pair_01", "pair_03"]
