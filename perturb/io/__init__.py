"""Dataset-agnostic image and table input/output (the datasets themselves: perturb.datasets)."""

DEFAULT_MAX_PIXELS = 64_000_000  # decode limit (here so the CLI can show it without cv2)
