"""Augment on radiographs: an X-ray op's records never carry an endoscopy scene; the engine
analyses the film's annotation layer on the image the op gets and each annotation-protecting
record stores that layer (issue 29 item 4), and the chain replays bit for bit from the records."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import perturb
from perturb import Augment
from perturb.engine.run import scene_kind
from perturb.io.images import decode_image, to_tensor
from tests.helpers import XRAY, require_samples


def test_xray_records_carry_their_annotation_layer_and_replay() -> None:
    require_samples()
    films = [to_tensor(decode_image(p.read_bytes())) for p in XRAY[:3]]
    batch = torch.stack([F.interpolate(f[None].float(), size=(192, 192))[0] for f in films])
    module = Augment("augment-xray", seed=3, return_records=True)
    seen = 0
    for epoch in range(4):
        result = module(batch, [0, 1, 2], epoch=epoch)
        for row, records in enumerate(result.records):
            for record in records:
                if record.protect_border and scene_kind(record.op) == "radiograph":
                    scene = record.extra.get("scene")
                    assert scene is not None and scene["kind"] == "radiograph", record.op
                    assert "annotations" in scene, scene
                    seen += 1
            if records:
                again = perturb.replay([r.to_dict() for r in records], batch[row])
                assert torch.equal(again, result.images[row]), [r.op for r in records]
    assert seen > 0  # the policy ran annotation-protecting X-ray ops
