"""The probe VQA model: image + question -> answer text, from pixels only."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from perturb.probe.questions import classify, join_answers, split_question
from perturb.probe.vision import Observation, observe

UNKNOWN = "unknown"
NAME = "probe-cv"


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def _polyp_answer(obs: Observation, what: Callable[[Observation], str]) -> str:
    return what(obs) if obs.polyp_count else "none"


# class -> answer from an observation. Procedure and landmarks: the probe has no detector for
# them and answers with its prior (every phantom is a colonoscopy frame without landmarks).
ANSWERS: dict[str, Callable[[Observation], str]] = {
    "polyp_count": lambda o: str(o.polyp_count),
    "finding_count": lambda o: str(o.polyp_count),
    "abnormality_presence": lambda o: "polyp" if o.polyp_count else "none",
    "finding_presence": lambda o: _yes_no(o.polyp_count > 0),
    "box_artifact_presence": lambda o: _yes_no(o.box),
    "text_presence": lambda o: _yes_no(o.text),
    "instrument_presence": lambda o: "instrument" if o.instruments else "none",
    "instrument_count": lambda o: str(o.instruments),
    "instrument_location": lambda o: "none",
    "procedure_type": lambda o: "colonoscopy",
    "landmark_presence": lambda o: "none",
    "landmark_location": lambda o: "none",
    "landmark_color": lambda o: "none",
    "abnormality_color": lambda o: _polyp_answer(o, lambda x: str(x.color)),
    "abnormality_location": lambda o: _polyp_answer(o, lambda x: ", ".join(x.locations)),
    "polyp_type": lambda o: _polyp_answer(o, lambda x: str(x.polyp_type)),
    "polyp_size": lambda o: _polyp_answer(o, lambda x: ", ".join(x.sizes)),
    "polyp_removal_status": lambda o: "no" if o.polyp_count else "yes",
}


class ProbeModel:
    """A small classic-vision VQA model for endoscopy phantoms (no weights, no network).

    >>> from perturb.datasets.phantoms.endoscopy import render
    >>> ProbeModel().answer(render("phantom_0000").image, "Is there text?") in ("yes", "no")
    True
    """

    name = NAME

    def observe(self, image: np.ndarray) -> Observation:
        """What the probe measures in ``image`` (HWC RGB array)."""
        return observe(image)

    def answer_observation(self, obs: Observation, question: str) -> str:
        """Answer ``question`` from an observation."""
        parts = split_question(question)
        answers = []
        for part in parts:
            cls = classify(part)
            answers.append(ANSWERS[cls](obs) if cls is not None else UNKNOWN)
        return join_answers(parts, answers)

    def answer(self, image: np.ndarray, question: str) -> str:
        """Answer one question about one image."""
        return self.answer_observation(self.observe(image), question)

    def answer_file(self, path: str | os.PathLike[str], questions: Iterable[str]) -> list[str]:
        """Answers to several questions about one image file."""
        from perturb.io.images import read_image

        obs = self.observe(read_image(Path(path)))
        return [self.answer_observation(obs, q) for q in questions]
