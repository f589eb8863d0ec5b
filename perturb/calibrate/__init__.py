"""``perturb calibrate``: measure each op's severities on real images against the catalog's
declared calibration targets (perturb.catalog.specs.Calibration)."""
