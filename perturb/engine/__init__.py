"""The engine: ``apply`` and ``replay`` of catalog ops on batches, with their records.

:mod:`perturb.engine.run` draws each sample's parameters from its key, runs the op's kernel
(or its CPU path), composites the result with the sample's scene (``perturb.ops.composite``)
and writes one :class:`~perturb.contracts.record.Record` per sample; ``replay`` reproduces the
outputs from the records bit for bit. :mod:`perturb.engine.annotations` moves boxes and
``<loc>`` tags (:mod:`perturb.contracts.boxes`) through the geometric ops a record says were
applied. The package top re-exports ``perturb.apply`` and ``perturb.replay``.
"""
