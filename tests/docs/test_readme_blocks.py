"""The README's op table and layout are generated (tests/docs/readme_blocks.py) and kept fresh."""

from __future__ import annotations

from tests.docs.readme_blocks import BLOCKS, README, current


def test_generated_readme_blocks_are_fresh() -> None:
    text = README.read_text()
    stale = [name for name, make in BLOCKS.items() if current(text, name) != make()]
    assert not stale, (
        f"README.md's generated blocks {stale} are stale: run `python -m tests.docs.readme_blocks --write`"
    )


def test_op_table_lists_every_op() -> None:
    from perturb.catalog.specs import load_specs

    table = current(README.read_text(), "ops") or ""
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert sorted(r.split("`")[1] for r in rows) == sorted(load_specs())
