"""Shared pytest configuration: the ONNX backend node-suite count at the end of a run, the fast tier's guard (no
torch or IREE compiler imported by a test outside the `slow` marker), and module-level generators reseeded per
test (a test's data does not depend on the order tests run in), and epctx's user cache folder (``EPCTX_CACHE_DIR``:
IREE's probe records, trust records) a fresh one per test, so that no test reads what another, or a user, kept."""

from __future__ import annotations

import sys
import zlib
from collections.abc import Iterator
from typing import Any

import pytest

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


@pytest.fixture(autouse=True)
def _user_cache_per_test(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path_factory.getbasetemp() / "user-cache" / f"{zlib.crc32(request.node.nodeid.encode()):08x}"
    monkeypatch.setenv("EPCTX_CACHE_DIR", str(folder))  # created when something is kept there


# `make test-fast` (-m "not slow") runs the tests that need no IREE compile and no torch: a test that imports either
# into the test process without the `slow` marker fails there, naming itself (IREE's compiles run in worker
# processes, which this does not see: the tests that compile with IREE carry the marker themselves).
_SLOW_MODULES = ("torch", "iree.compiler")


@pytest.fixture(autouse=True)
def _fast_tier_stays_fast(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.config.getoption("markexpr", "") != "not slow":
        yield
        return
    before = {m for m in _SLOW_MODULES if m in sys.modules}
    yield
    found = [m for m in _SLOW_MODULES if m in sys.modules and m not in before]
    if found:
        pytest.fail(
            f"{request.node.nodeid} imports {', '.join(found)} (compiles with IREE or uses torch): mark it slow"
        )


# Test modules that draw data from a module-level generator (RNG, _RNG, rng) would see data that depends on which
# tests ran before in the same worker (pytest-xdist's scheduling, -k, -p no:randomly ...): each test starts the
# generator afresh from its own id, so a test's inputs are the same in every order and on every worker.
_MODULE_GENERATORS = ("RNG", "_RNG", "rng")


@pytest.fixture(autouse=True)
def _module_generators_seeded_per_test(request: pytest.FixtureRequest) -> None:
    import numpy as np

    module = getattr(request, "module", None)
    for name in _MODULE_GENERATORS:
        generator = getattr(module, name, None)
        if isinstance(generator, np.random.Generator):
            seed = zlib.crc32(request.node.nodeid.encode())
            generator.bit_generator.state = np.random.default_rng(seed).bit_generator.state
