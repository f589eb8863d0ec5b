"""Image and dataset input/output."""

DEFAULT_MAX_PIXELS = 64_000_000  # decode limit (here so the CLI can show it without cv2)
