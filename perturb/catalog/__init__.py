"""The catalog: every op's metadata and 5-level severity table, as validated data (YAML).

``perturb.catalog.specs`` is pure Python (no torch): the scorer reads risk tags from it.
"""
