"""The layers of docs/architecture.md, read from the imports (type-only and function-level imports count): a
lower layer never imports a higher one; no import cycle of any length, between modules or between folders;
every EP folder under providers/ (found by listing the folder, not named here) imports the framework only
through ``epctx.ep`` and ``epctx.errors``. No exceptions are listed: what breaks a rule is fixed."""

from __future__ import annotations

import ast
from collections.abc import Mapping, Set
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "epctx"

ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"

# Lowest first (docs/architecture.md, "Layers"). A module's layer is that of its first path component under epctx/.
LAYERS = [
    {"_version", "_warnings", "errors", "config", "options"},
    {"capi"},  # onnxruntime's exception-module path (epctx.capi.onnxruntime_pybind11_state) over errors
    {"model"},
    {"ep", "optimize"},
    {"partition"},
    {"trust"},  # signing, verification and the load policy (imports only errors / options)
    {"epcontext"},
    {"providers"},
    # inspect and payload recognition (they ask the providers' registry); compatibility verdicts over every EP and
    # the transparent cache (epcontext's files, providers' EPs)
    {"tools", "cache"},
    {"package"},  # model packages: the format, shared binaries, selection by verdicts (a session opens them)
    {"session"},
    {"compiler", "backend"},
    {"farm"},  # the catalogue build: jobs compile (local pool or Ray) and are assembled into a package
    {"__init__"},  # the public face
    {"testing"},  # tools for tests (no_compile, the EP conformance suite)
    {"cli"},  # the command line, built on the public face (``epctx conformance`` on epctx.testing)
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


def _cycles(graph: Mapping[str, Set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative): each is one
    or more import cycles, of any length."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _folder(module: str) -> str:
    """The package folder a module is in (a package's ``__init__`` is its own folder's)."""
    path = SRC.parent.joinpath(*module.split("."))
    return module if path.is_dir() or module.count(".") == 1 else module.rpartition(".")[0]


def test_the_cycle_finder_finds_long_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"d"}, "d": {"a"}, "e": {"a"}}) == [["a", "b", "c", "d"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_cycle_between_modules():
    cycles = _cycles(_graph())
    assert not cycles, "modules in an import cycle:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_import_cycle_between_folders():
    """Folders (packages) as units: a folder imports another only if that one does not import it back, by any
    path (e.g. testing/conformance running the command line that runs it)."""
    folders: dict[str, set[str]] = {}
    for module, targets in _graph().items():
        mine = _folder(module)
        folders.setdefault(mine, set()).update(_folder(t) for t in targets if _folder(t) != mine)
    cycles = _cycles(folders)
    assert not cycles, "folders in an import cycle:\n" + "\n".join(" -> ".join(c) for c in cycles)


def _ep_folders() -> list[str]:
    """Every EP folder under providers/: each package there (a folder with ``__init__.py``) is one EP."""
    return sorted(p.name for p in (SRC / "providers").iterdir() if (p / "__init__.py").is_file())


def test_the_ep_folders_are_found_by_listing():
    assert {"cpu", "example", "openvino", "iree"} <= set(_ep_folders())


def test_ep_authors_need_only_epctx_ep():
    """Every EP folder imports from the framework only the face ``epctx.ep`` and ``epctx.errors``; anything
    else it imports is inside its own folder (docs/architecture.md, "What an EP may import")."""
    graph = _graph()
    leaks = []
    for folder in _ep_folders():
        own = f"epctx.providers.{folder}"
        for module, targets in graph.items():
            if module == own or module.startswith(f"{own}."):
                leaks += [
                    f"{module} -> {target}"
                    for target in targets
                    if target not in ("epctx.ep", "epctx.errors")
                    and target != own
                    and not target.startswith(f"{own}.")
                ]
    assert not leaks, "EPs reaching past epctx.ep:\n" + "\n".join(sorted(leaks))


def test_the_architecture_document_names_every_layer():
    text = ARCHITECTURE.read_text()
    missing = sorted(name for names in LAYERS for name in names if f"`{name}`" not in text)
    assert not missing, f"{ARCHITECTURE.name} does not name these layers: {missing}"


def test_nothing_imports_epctx_testing():
    """epctx.testing sits above the library: the library never depends on its test tools (the command line's
    ``epctx conformance`` may)."""
    graph = _graph()
    users = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if _layer(module) not in ("testing", "cli")
        for target in targets
        if _layer(target) == "testing"
    )
    assert not users, "modules importing epctx.testing:\n" + "\n".join(users)


PLUGIN_FIXTURES = Path(__file__).resolve().parent / "fixtures"


def test_plugin_libraries_need_only_epctx_ep():
    """A plugin library (any file under tests/fixtures defining ``create_ep_factories``, the way one outside
    epctx is written) imports from epctx only ``epctx.ep`` and ``epctx.errors``, as an EP folder does."""
    leaks = []
    libraries = [p for p in PLUGIN_FIXTURES.rglob("*.py") if "create_ep_factories" in p.read_text()]
    assert libraries, "no plugin library found under tests/fixtures"
    for path in libraries:
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            leaks += [
                f"{path.name} -> {name}"
                for name in names
                if name.split(".")[0] == "epctx" and name not in ("epctx", "epctx.ep", "epctx.errors")
            ]
    assert not leaks, "plugin libraries reaching past epctx.ep:\n" + "\n".join(sorted(leaks))
