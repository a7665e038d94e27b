"""The layer order of DESIGN.md, read from the imports (type-only and function-level imports count): a lower
layer never imports a higher one, and no two modules import each other."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "epctx"

# Lowest first. A module's layer is that of its first path component under epctx/.
LAYERS = [
    {"_version", "_hooks", "_warnings", "errors", "options"},
    {"capi"},  # onnxruntime's exception-module path (epctx.capi.onnxruntime_pybind11_state) over errors
    {"model"},
    {"ep", "optimize"},
    {"partition"},
    {"trust"},  # signing, verification and the load policy (imports only errors / options)
    {"epcontext"},
    {"providers"},
    {"session"},
    {"compiler", "backend"},
    {"__init__"},  # the public face; the command line is built on it
    {"cli", "testing"},  # epctx.testing: tools for tests (no_compile, the EP conformance suite)
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


MODULES = {_module_name(p) for p in SRC.rglob("*.py")}


def _imports(path: Path, module: str) -> set[str]:
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:  # ``from pkg import module`` imports the module, not the package's face
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {name for name in found if name in MODULES and name != module}


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p, _module_name(p)) for p in SRC.rglob("*.py")}


def test_lower_layers_never_import_higher_ones():
    graph = _graph()
    unknown = sorted({_layer(m) for m in graph} - set(RANK))
    assert not unknown, f"modules outside the layer table: {unknown}"
    upward = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if RANK[_layer(target)] > RANK[_layer(module)]
    )
    assert not upward, "imports up the layers:\n" + "\n".join(upward)


def test_no_two_modules_import_each_other():
    graph = _graph()
    mutual = sorted(
        f"{a} <-> {b}"
        for a, targets in graph.items()
        for b in targets
        if a < b and a in graph.get(b, set()) and not b.startswith(f"{a}.") and not a.startswith(f"{b}.")
    )
    assert not mutual, "modules that import each other:\n" + "\n".join(mutual)


def test_ep_authors_need_only_epctx_ep():
    """The EPs shipped in providers/ import the framework only through epctx.ep (and the error classes)."""
    graph = _graph()
    allowed = {"epctx.ep", "epctx.errors", "epctx._version"}
    leaks = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module.startswith(("epctx.providers.openvino", "epctx.providers.example"))
        for target in targets
        if not target.startswith(("epctx.providers.",)) and target not in allowed
        and not target.startswith("epctx.errors")
    )  # fmt: skip
    assert not leaks, "EPs reaching past epctx.ep:\n" + "\n".join(leaks)


def test_nothing_imports_epctx_testing():
    """epctx.testing sits at the top beside cli: the library never depends on its test tools (the command
    line's ``epctx conformance`` may)."""
    graph = _graph()
    users = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if _layer(module) not in ("testing", "cli")
        for target in targets
        if _layer(target) == "testing"
    )
    assert not users, "modules importing epctx.testing:\n" + "\n".join(users)
