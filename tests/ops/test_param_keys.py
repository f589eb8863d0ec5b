"""``apply(..., param_keys=...)``: images of one group (the views of a study) share scalar
parameters while their per-pixel fields follow their own sample keys; records replay exactly."""

from __future__ import annotations

import pytest
import torch

from perturb.engine.run import apply, replay
from perturb.errors import InputError


def test_group_shares_parameters_not_fields() -> None:
    x = torch.full((3, 1, 32, 40), 0.5)
    out, recs = apply(
        x, "gaussian_noise", 3, ["s1-v0", "s1-v1", "s2-v0"], seed=4, param_keys=["s1", "s1", "s2"]
    )
    assert recs[0].params == recs[1].params and recs[0].key != recs[1].key
    assert recs[0].extra["param_key"] == "s1" and set(recs[0].extra) == {"param_key", "scene"}
    assert not torch.equal(out[0], out[1])  # same image, same sigma, other noise field
    _, solo = apply(x[:1], "gaussian_noise", 3, ["s1"], seed=4)
    assert solo[0].params == recs[0].params  # the group's draw is the draw of its key
    assert torch.equal(replay(recs, x), out)
    plain, plain_recs = apply(x[:1], "gaussian_noise", 3, ["s1-v0"], seed=4)
    same, same_recs = apply(x[:1], "gaussian_noise", 3, ["s1-v0"], seed=4, param_keys=["s1-v0"])
    assert torch.equal(plain, same) and plain_recs == same_recs and set(same_recs[0].extra) == {"scene"}


def test_param_keys_length_is_checked() -> None:
    with pytest.raises(InputError, match="param_keys must be a sequence with one key per image"):
        apply(torch.rand(2, 1, 8, 8), "gaussian_noise", 1, ["a", "b"], param_keys=["a"])
