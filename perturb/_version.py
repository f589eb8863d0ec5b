"""The package version: the one place it is written (pyproject reads it from here at build time).

Ground floor: this module imports nothing, so any module may import it.
"""

__version__ = "0.1.0"
