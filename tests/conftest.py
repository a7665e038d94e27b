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


# The measured rule (epctx.partition.measured_rule) is on by default: it times each compiled partition against the
# CPU EP and hands back the slower ones. Tests that run a toy model on IREE / OpenVINO / the Example EP test the EP
# itself (what it compiles, where its nodes run), and a 4x4 toy is often faster on numpy kernels, by a margin that
# depends on the machine's load: in this process the default is off (for module-scoped fixtures too), as if
# every such test set the key to "0". The rule's own tests set it to "1"; a test marked `measured_rule_default`
# sees the shipped default. Tests that start other processes (the command line) get the shipped default there.
_SHIPPED: list[Any] = []


@pytest.fixture(scope="session", autouse=True)
def _measured_rule_off_in_tests() -> Iterator[None]:
    from epctx import config

    key = config.PARTITION_MEASURED_RULE
    shipped = config._CONFIG_KEYS[key]
    _SHIPPED[:] = [shipped]
    config._CONFIG_KEYS[key] = (shipped[0], shipped[1], False)
    try:
        yield
    finally:
        config._CONFIG_KEYS[key] = shipped


@pytest.fixture(autouse=True)
def _measured_rule_default(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("measured_rule_default") is not None:
        from epctx import config

        monkeypatch.setitem(config._CONFIG_KEYS, config.PARTITION_MEASURED_RULE, _SHIPPED[0])


KERNEL_EP_DELAY_S = 0.002  # what ``kernel_ep_delayed`` adds to each run of the kernel EP's side


@pytest.fixture
def kernel_ep_delayed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The measured rule's kernel-EP side of each measurement 2 ms slower, for tests whose test EP runs the same
    numpy kernels as the CPU EP: "not slower" is then a verdict the load cannot flip (the two sides were equal to
    a few microseconds, and the rule's margin is 10 %), while a test EP that sleeps 20 ms stays slower."""
    import time

    from epctx.session import measured_rule

    real = measured_rule.kernel_runner

    def kernel_runner(builder: Any) -> Any:
        make = real(builder)

        def runner(partition: Any) -> Any:
            run = make(partition)

            def delayed(*inputs: Any) -> Any:
                time.sleep(KERNEL_EP_DELAY_S)
                return run(*inputs)

            return delayed

        return runner

    monkeypatch.setattr(measured_rule, "kernel_runner", kernel_runner)
