"""The EP conformance suite: one set of EP context cache cases, run on any compiling EP.

In the spirit of ExecuTorch's backend test flows: every case builds its models with ``onnx.helper``, runs them
through the EP under test, compares every output with onnxruntime (CPU) as the oracle, and reports which nodes
the EP took (``delegated_nodes`` of ``total_nodes``) and the largest absolute error. A case never raises: a
failure is a :class:`CaseResult` with ``passed=False`` and the reason in ``detail``.

From pytest (an EP author's own test module)::

    from epctx.testing.conformance import CASES, run_conformance

    @pytest.mark.parametrize("case", CASES)
    def test_conformance(tmp_path, case):
        (result,) = run_conformance("MyExecutionProvider", tmp_dir=tmp_path, cases=[case])
        assert result.passed, result.detail

From a shell: ``epctx conformance -p MyExecutionProvider [--json]`` (or ``python -m epctx.cli conformance``).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from epctx.errors import EPCtxError
from epctx.testing.conformance.cases import CASE_BODIES
from epctx.testing.conformance.results import CASES, CaseResult, format_table
from epctx.testing.conformance.suite import Suite

__all__ = ["CASES", "CaseResult", "compiling_providers", "format_table", "run_conformance"]


def compiling_providers() -> list[str]:
    """The compiling EPs usable here (built-in, entry-point or registered), in precedence order."""
    from epctx.providers.registry import available_providers, create_provider

    found = []
    for name in available_providers():
        try:
            if create_provider(name).compiles:
                found.append(name)
        except EPCtxError:  # listed but not usable here (e.g. no device): nothing to test
            continue
    return found


def run_conformance(
    ep_name: str,
    ep_options: Mapping[str, str] | None = None,
    *,
    tmp_dir: str | os.PathLike[str] | None = None,
    cases: Iterable[str] | None = None,
    atol: float = 1e-4,
    rtol: float = 1e-4,
    case_options: Mapping[str, Mapping[str, str]] | None = None,
    fresh_process_setup: str = "",
) -> list[CaseResult]:
    """Run the conformance cases (all of ``CASES`` by default, in that order) on ``ep_name``.

    ``ep_options`` go to the EP in every session; ``case_options`` adds options for one case (e.g. OpenVINO's
    ``{"partial_model": {"disabled_ops": "LayerNormalization"}}``, since OpenVINO takes LayerNormalization
    itself). Outputs match onnxruntime when ``|ours - ort| <= atol + rtol * |ort|``. ``tmp_dir`` (a fresh
    temporary folder by default) receives one folder per case, left in place for inspection.
    ``fresh_process_setup``: Python code run first in the fresh processes the round-trip cases start (for an
    EP that a fresh process only finds once registered, e.g. a plugin library registered by path)."""
    chosen = list(CASES if cases is None else cases)
    unknown = [c for c in chosen if c not in CASES]
    if unknown:
        raise ValueError(f"unknown conformance case(s) {unknown}; known: {list(CASES)}")
    with contextlib.ExitStack() as stack:
        if tmp_dir is None:
            tmp_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="epctx-conformance-"))
        suite = Suite(
            ep_name,
            dict(ep_options or {}),
            Path(tmp_dir),
            atol,
            rtol,
            case_options or {},
            fresh_process_setup,
        )
        return [suite.run_case(case, CASE_BODIES[case]) for case in chosen]
