"""``python -m perturb.cli``: the ``perturb`` command."""

from perturb.cli import main

main()
