"""The contracts that generation, augmentation and scoring share, in one torch-free place.

* :mod:`~perturb.contracts.keys`: the canonical key string and key derivation (BLAKE2b), the
  torch-free half of :mod:`perturb.rng`.
* :mod:`~perturb.contracts.record`: :class:`Record`, what was applied to one sample.
* :mod:`~perturb.contracts.manifest`: the manifest's column names and types.
* :mod:`~perturb.contracts.suite`: the suite model (jobs, output settings, tasks), validated
  against an op catalog the caller passes in.

Nothing here imports torch, NumPy or OpenCV, nor any room above (catalog, ops, engine,
generate): only :mod:`perturb.errors` (and pydantic for the suite model; pyarrow only inside
``manifest.arrow_schema``). A test imports each module in a fresh interpreter and checks that
torch stays unloaded.
"""
