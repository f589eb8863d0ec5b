"""Tests of the catalog: severity tables and the catalog/preview commands."""
