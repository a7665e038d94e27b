"""Shared pytest configuration: prints the ONNX backend node-suite count at the end of a run."""

from __future__ import annotations

from typing import Any

_NODE_SUITE = "OnnxBackendNodeModelTest"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    counts = {}
    for outcome in ("passed", "failed", "skipped", "error"):
        reports = terminalreporter.stats.get(outcome, [])
        counts[outcome] = sum(
            1
            for r in reports
            if _NODE_SUITE in getattr(r, "nodeid", "")
            and not r.nodeid.endswith("_cuda")
            and getattr(r, "when", "call") in ("call", "setup")
        )
    total = sum(counts.values())
    if total:
        from onnx.backend.test.loader import load_model_tests

        known = len(load_model_tests(kind="node"))
        terminalreporter.write_sep(
            "=",
            f"ONNX backend node suite on epctx: {counts['passed']} of {known} cases passed "
            f"({counts['failed'] + counts['error']} failed, {known - counts['passed'] - counts['failed']} skipped)",
        )
