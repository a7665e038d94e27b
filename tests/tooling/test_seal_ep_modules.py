"""scripts/seal_ep_modules.py: the mechanical rename that makes epctx.ep's modules private (issue 17), kept
applied once every branch was merged. Its rewrite is checked here on the reference forms it must turn
(dotted names, paths, ``from epctx.ep import <module>``) and those it must leave alone."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "seal_ep_modules.py"


def _script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("seal_ep_modules", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rewrite_points_references_at_the_private_modules() -> None:
    rewrite = _script().rewrite
    names = ["blas", "compiling", "options"]
    before = (
        "from epctx.ep.compiling import CompileGuard\n"
        "import epctx.ep.blas as blas\n"
        "    from epctx.ep import blas\n"
        '_LAZY = {"backend_import": "epctx.ep.blas"}\n'
        "see src/epctx/ep/options.py\n"
        "from epctx.options import SessionConfig\n"  # not epctx.ep's
        "from epctx.ep import backend_import, Option\n"  # the face's names
        "epctx.ep.options_table epctx.ep.compiling_x\n"  # other names that merely start alike
    )
    assert rewrite(before, names) == (
        "from epctx.ep._compiling import CompileGuard\n"
        "import epctx.ep._blas as blas\n"
        "    from epctx.ep import _blas as blas\n"
        '_LAZY = {"backend_import": "epctx.ep._blas"}\n'
        "see src/epctx/ep/_options.py\n"
        "from epctx.options import SessionConfig\n"
        "from epctx.ep import backend_import, Option\n"
        "epctx.ep.options_table epctx.ep.compiling_x\n"
    )
    assert rewrite(rewrite(before, names), names) == rewrite(before, names)  # idempotent


def test_epctx_ep_is_sealed() -> None:
    """The rename has been applied: every module behind ``epctx.ep`` is private, and a new public one fails
    here (run the script, or name it ``_x.py``)."""
    assert _script().public_modules() == []
    names = {p.stem for p in (SCRIPT.parents[1] / "src" / "epctx" / "ep").glob("*.py")}
    assert {"_contract", "_compiling", "_factory", "_devices"} <= names


def test_rewrite_keeps_the_blank_line_after_a_module_import() -> None:
    text = "    from epctx.ep import blas\n\n    def f():\n"
    assert _script().rewrite(text, ["blas"]) == "    from epctx.ep import _blas as blas\n\n    def f():\n"
