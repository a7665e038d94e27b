"""No function in src/ over 60 lines but those docs/architecture.md keeps, with its reason ("Long functions
kept, and why"); cyclomatic complexity is ruff's C901 (pyproject.toml)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 60


def _long_functions() -> set[tuple[str, str]]:
    found = set()
    for path in sorted((ROOT / "src").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
                assert node.end_lineno is not None
                if node.end_lineno - start + 1 > LIMIT:
                    found.add((path.relative_to(ROOT / "src" / "epctx").as_posix(), node.name))
    return found


def _kept() -> set[tuple[str, str]]:
    """The (file, function) pairs of the architecture note's table."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## Long functions kept, and why", 1)[1].split("\n## ", 1)[0]
    kept = set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 2 and "` `" in cells[1]:  # | `path` `function` (and its `nested`) | lines | why |
            path, rest = cells[1].split("` `", 1)
            kept.add((path.strip("`"), rest.split("`", 1)[0]))
            if "(and its `" in rest:
                kept.add((path.strip("`"), rest.split("(and its `", 1)[1].split("`", 1)[0]))
    return kept


def test_long_functions_are_those_the_note_keeps() -> None:
    long, kept = _long_functions(), _kept()
    assert kept, "the note's table was not found"
    assert long <= kept, (
        f"over {LIMIT} lines and not justified in docs/architecture.md: {sorted(long - kept)}"
    )
    assert kept <= long, f"justified in docs/architecture.md but no longer long: {sorted(kept - long)}"
