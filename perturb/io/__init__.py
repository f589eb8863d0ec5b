"""Image and dataset input/output."""
