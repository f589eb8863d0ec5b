"""A small classic-vision probe VQA model shipped with perturb (no weights, no network).

It answers the phantom questions (Kvasir-VQA-x1 classes: polyp count / colour / 3x3 location /
type / size, presence of findings, the green box, text and instruments) from pixels only,
with colour segmentation, connected components, radial profiles and edge density; it is
mostly right on clean phantoms and breaks under strong blur, noise, colour shifts and glare,
which is what ``perturb demo`` measures.

    from perturb.probe import ProbeModel
    ProbeModel().answer(image, "How many polyps are in the image?")   # -> "2"
"""

from __future__ import annotations

from perturb.probe.model import ANSWERS, NAME, ProbeModel
from perturb.probe.questions import classify, join_answers, split_question
from perturb.probe.vision import Blob, Observation, observe

__all__ = [
    "ANSWERS",
    "NAME",
    "Blob",
    "Observation",
    "ProbeModel",
    "classify",
    "join_answers",
    "observe",
    "split_question",
]
