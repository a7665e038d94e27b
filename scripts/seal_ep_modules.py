"""Make the modules behind ``epctx.ep`` private, onnx-ir's pattern: ``src/epctx/ep/<name>.py`` becomes
``_<name>.py`` (``git mv``) and every reference to ``epctx.ep.<name>`` / ``epctx/ep/<name>.py`` in src, tests,
benchmarks, scripts, docs and README is rewritten; ``epctx.ep``'s ``__init__`` stays the only face.

Mechanical and idempotent: run it once every branch that adds imports of ``epctx.ep.<name>`` (or a new public
module there) is merged, then lint, type-check and run the tests. It was not applied in the branch that wrote
it (issue 17) because branches in flight still import the public module names.

    python scripts/seal_ep_modules.py [--dry-run]
"""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EP = ROOT / "src" / "epctx" / "ep"
TREES = ("src", "tests", "benchmarks", "scripts", "docs")
SUFFIXES = {".py", ".md", ".toml", ".txt", ".cfg", ".ini"}


def public_modules() -> list[str]:
    """The modules of src/epctx/ep that are still public (not ``__init__``, not already ``_x``)."""
    return sorted(p.stem for p in EP.glob("*.py") if not p.stem.startswith("_"))


def rewrite(text: str, names: list[str]) -> str:
    """``text`` with ``epctx.ep.<name>``, ``epctx/ep/<name>.py`` and ``from epctx.ep import <name>`` (a
    module) pointing at ``_<name>``."""
    alternatives = "|".join(map(re.escape, names))
    text = re.sub(rf"\bepctx\.ep\.({alternatives})\b", r"epctx.ep._\1", text)
    text = re.sub(rf"\bepctx/ep/({alternatives})\.py\b", r"epctx/ep/_\1.py", text)
    return re.sub(
        rf"^([ \t]*)from epctx\.ep import ({alternatives})[ \t]*$",
        r"\1from epctx.ep import _\2 as \2",
        text,
        flags=re.M,
    )


def files() -> list[Path]:
    found = [ROOT / "README.md"]
    for tree in TREES:
        found += [p for p in (ROOT / tree).rglob("*") if p.suffix in SUFFIXES and p.is_file()]
    return [p for p in found if p.is_file() and p.resolve() != Path(__file__).resolve()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="list what would change, change nothing")
    args = parser.parse_args()
    names = public_modules()
    if not names:
        print("epctx.ep has no public module left")
        return 0
    changed = []
    for path in files():
        text = path.read_text(encoding="utf-8")
        new = rewrite(text, names)
        if new != text:
            changed.append(path.relative_to(ROOT))
            if not args.dry_run:
                path.write_text(new, encoding="utf-8")
    for name in names:
        print(f"git mv src/epctx/ep/{name}.py src/epctx/ep/_{name}.py")
        if not args.dry_run:
            subprocess.run(
                ["git", "mv", str(EP / f"{name}.py"), str(EP / f"_{name}.py")], cwd=ROOT, check=True
            )
    print(f"{len(names)} modules, {len(changed)} files rewritten" + (" (dry run)" if args.dry_run else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
