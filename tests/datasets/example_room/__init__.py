"""A worked example of a fifth dataset: one room, one registry line.

"Example capsule" is a made-up capsule-endoscopy VQA set: a ``questions.json`` list of
``{"qid", "image", "question", "answer", "question_class"}`` beside its frames. Everything the
library needs to know of it is here: the schema and input adapter (:mod:`.adapter`), its
question classes and what each risk tag may change, its sample-key rule, a prediction format of
its own (:mod:`.predictions`) and a composite (:mod:`.composite`, a keyed mirror and gain).

Registering it is the one line ``DATASETS.add(DATASET.name, DATASET)`` (a dataset inside the
package adds its room to the tuple in ``perturb/datasets/__init__.py`` instead); from then on
suites may name ``input.adapter: example-capsule`` and ``composite: example_mirror``,
generation and replay run it, augmentation policies can hold it out and the scorer finds its
prediction format, with no other file of the package changed
(tests/datasets/test_example_room.py).
"""

from __future__ import annotations

from perturb.datasets import DatasetEntry

ROOM = __name__
QUESTION_CLASSES = ("lesion_presence", "lesion_color", "lesion_location")

DATASET = DatasetEntry(
    name="example-capsule",
    title="Example capsule",
    modality="endoscopy",
    hub_id=None,
    opener=f"{ROOM}.adapter:open_example",
    question_classes=QUESTION_CLASSES,
    label_risk={
        "alters_color": ("*_color",),
        "moves_geometry": ("*_location",),
        "alters_intensity": ("*_color",),
        "occludes": ("*_presence",),
    },
    adapter=True,
    sample_key="img_id (one frame per sample)",
    composites={"example_mirror": f"{ROOM}.composite"},
    prediction_readers={"example-capsule-jsonl": f"{ROOM}.predictions:read_predictions"},
)
