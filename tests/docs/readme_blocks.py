"""The README's generated blocks: the op table (from the catalog) and the layout (from the
package's import graph, read by grimp).

Each block sits between ``<!-- BEGIN generated: NAME -->`` and ``<!-- END generated: NAME -->``
in README.md; ``test_readme_blocks.py`` fails when a block differs from what this module makes
(CI runs it). Refresh after adding an op or a module:

    python -m tests.docs.readme_blocks --write
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PACKAGE = "perturb"
# The import package's own __init__ is the public facade (lazy re-exports of apply, replay,
# Augment, ...): it is drawn as the entry, not as a room.
FACADE = PACKAGE


def room_of(module: str) -> str:
    """The room of a module: its first-level sub-package or module under perturb."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else FACADE


def room_graph() -> dict[str, set[str]]:
    """Room -> rooms it imports (any import statement, lazy and type-checking ones included)."""
    import grimp

    graph = grimp.build_graph(PACKAGE)
    edges: dict[str, set[str]] = defaultdict(set)
    for module in graph.modules:
        edges[room_of(module)]
        for imported in graph.find_modules_directly_imported_by(module):
            a, b = room_of(module), room_of(imported)
            if a != b and FACADE not in (a, b):
                edges[a].add(b)
    edges.pop(FACADE, None)
    return dict(edges)


def module_cycles() -> list[list[str]]:
    """Strongly connected groups of more than one module in the module-level import graph."""
    import grimp

    graph = grimp.build_graph(PACKAGE)
    succ = {m: set(graph.find_modules_directly_imported_by(m)) - {FACADE} for m in graph.modules}
    return _components(succ)


def room_cycles() -> list[list[str]]:
    return _components(room_graph())


def _components(succ: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one member, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(succ.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(succ):
        if node not in index:
            visit(node)
    return sorted(found)


def _summary(path: Path) -> str:
    """First sentence of a module's (or package __init__'s) docstring."""
    target = path / "__init__.py" if path.is_dir() else path
    doc = ast.get_docstring(ast.parse(target.read_text())) or ""
    text = " ".join(doc.strip().split("\n\n")[0].split())
    depth, end = 0, len(text)
    for i, ch in enumerate(text):  # the first sentence: a stop outside parentheses
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and ch in ".:;" and (i + 1 == len(text) or text[i + 1] == " "):
            end = i
            break
    first = text[:end]
    return first[:90] + ("..." if len(first) > 90 else "")


def _layers(edges: dict[str, set[str]]) -> list[list[str]]:
    """Rooms by level: level 0 imports no room, level k imports only rooms below k."""
    level: dict[str, int] = {}

    def depth(room: str, seen: frozenset[str] = frozenset()) -> int:
        if room in level:
            return level[room]
        if room in seen:  # a cycle: the package-graph test reports it
            return 0
        below = [depth(b, seen | {room}) for b in edges.get(room, ())]
        level[room] = 1 + max(below) if below else 0
        return level[room]

    for room in edges:
        depth(room)
    rows: list[list[str]] = [[] for _ in range(max(level.values(), default=0) + 1)]
    for room, k in level.items():
        rows[k].append(room)
    return [sorted(r) for r in reversed(rows)]


def _reaches(edges: dict[str, set[str]], start: str, goal: str, skip: tuple[str, str]) -> bool:
    todo, seen = [start], {start}
    while todo:
        node = todo.pop()
        for nxt in edges.get(node, ()):
            if (node, nxt) == skip or nxt in seen:
                continue
            if nxt == goal:
                return True
            seen.add(nxt)
            todo.append(nxt)
    return False


def _reduced_edges(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The arrows worth drawing: an import implied by a longer path is left out (the table
    below lists every import)."""
    return [
        (a, b)
        for a in sorted(edges)
        for b in sorted(edges[a])
        if not _reaches(edges, a, b, skip=(a, b))
    ]


def layout_block() -> str:
    edges = room_graph()
    base = ROOT / PACKAGE
    lines = [
        "Rooms of `perturb/`, top to bottom: a room imports only rooms below it "
        "(`tests/docs/test_package_graph.py` fails on any import cycle). The arrows leave out "
        "imports implied by a longer path; the table lists them all.",
        "",
        "```mermaid",
        "flowchart TD",
    ]
    for room, target in _reduced_edges(edges):
        lines.append(f"  {room} --> {target}")
    lines += [
        "```",
        "",
        "| level | room | files | what it is | imports |",
        "|---:|---|---:|---|---|",
    ]
    layers = _layers(edges)
    for depth, rooms in enumerate(layers):
        for room in rooms:
            path = base / room if (base / room).is_dir() else base / f"{room}.py"
            files = len(list(path.rglob("*.py"))) if path.is_dir() else 1
            shown = f"`{room}/`" if path.is_dir() else f"`{room}.py`"
            deps = ", ".join(sorted(edges[room])) or "-"
            lines.append(
                f"| {len(layers) - 1 - depth} | {shown} | {files} | {_summary(path)} | {deps} |"
            )
    total = len(list(base.rglob("*.py")))
    lines += [
        "",
        f"{total} Python files in `perturb/`; `benchmarks/`, `tests/`, `notebooks/` beside it.",
    ]
    return "\n".join(lines)


def ops_block() -> str:
    from perturb.catalog.specs import load_specs

    specs = load_specs()
    lines = [
        f"{sum(not s.retired for s in specs.values())} ops (`perturb catalog` lists them with their "
        f"severity tables), and {sum(bool(s.retired) for s in specs.values())} retired, kept to replay "
        "older records (`perturb catalog --retired`; marked below).",
        "",
        "| op | family | modalities | what it models | parameters | label risks |",
        "|---|---|---|---|---|---|",
    ]
    for name in sorted(specs, key=lambda n: (specs[n].modalities[0], specs[n].family, n)):
        spec = specs[name]
        params = ", ".join(f"{p} ({t.unit})" for p, t in spec.params.items()) or "-"
        mods = ", ".join(m for m in spec.modalities if m != "any") or "any"
        risks = ", ".join(spec.risk_tags) or "-"
        desc = " ".join(spec.description.split()).replace("|", "\\|")
        shown = f"`{name}` (retired)" if spec.retired else f"`{name}`"
        lines.append(f"| {shown} | {spec.family} | {mods} | {desc} | {params} | {risks} |")
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[], str]] = {"ops": ops_block, "layout": layout_block}


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(
        rf"(<!-- BEGIN generated: {name} [^>]*-->\n)(.*?)(<!-- END generated: {name} -->)", re.S
    )


def current(text: str, name: str) -> str | None:
    found = _pattern(name).search(text)
    return found.group(2).rstrip("\n") if found else None


def render(text: str) -> str:
    for name, make in BLOCKS.items():
        if current(text, name) is None:
            raise SystemExit(f"README.md has no generated block {name!r}")
        block = make()
        text = _pattern(name).sub(lambda m, b=block: m.group(1) + b + "\n" + m.group(3), text)
    return text


def main() -> None:
    if "--write" not in sys.argv[1:]:
        sys.exit("usage: python -m tests.docs.readme_blocks --write")
    README.write_text(render(README.read_text()))
    print(f"refreshed {', '.join(BLOCKS)} in {README}")


if __name__ == "__main__":
    main()
