"""An EP's run scope (the CPU EP's BLAS thread limit under ``intra_op_num_threads``) is entered around a run only
when that EP runs a step of the session's plan (issue 21: with every node on IREE, the CPU EP's limit cost 17 us
of a 70 us LLM decode run, where onnxruntime's whole run takes 53 us)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest

import epctx
from epctx.providers.cpu.provider import CPUExecutionProvider
from tests.epcontext.models import EXAMPLE, feed, two_partition_model, whole_model
from tests.requires import requires


@pytest.fixture
def entered(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times the CPU EP's run scope was entered."""
    count = [0]
    original = CPUExecutionProvider.run_scope

    @contextlib.contextmanager
    def counted(inner: contextlib.AbstractContextManager[object]) -> Iterator[None]:
        count[0] += 1
        with inner:
            yield

    def run_scope(self: CPUExecutionProvider) -> contextlib.AbstractContextManager[object] | None:
        inner = original(self)
        return None if inner is None else counted(inner)

    monkeypatch.setattr(CPUExecutionProvider, "run_scope", run_scope)
    return count


def _session(model: onnx.ModelProto, tmp_path: Path, providers: list[str]) -> epctx.InferenceSession:
    onnx.save(model, tmp_path / "m.onnx")
    so = epctx.SessionOptions()
    so.intra_op_num_threads = 1
    return epctx.InferenceSession(str(tmp_path / "m.onnx"), so, providers=providers)


def test_the_cpu_eps_limit_is_left_out_when_another_ep_runs_every_node(
    tmp_path: Path, entered: list[int]
) -> None:
    session = _session(whole_model(), tmp_path, [EXAMPLE])
    assert {ep for ep, _ in session.get_partitions()} == {EXAMPLE}
    session.run(None, feed())
    assert entered[0] == 0


def test_the_cpu_eps_limit_is_entered_when_it_runs_a_node(tmp_path: Path, entered: list[int]) -> None:
    session = _session(two_partition_model(), tmp_path, [EXAMPLE])  # its LayerNormalization on the CPU EP
    assert "CPUExecutionProvider" in {ep for ep, _ in session.get_partitions()}
    got = session.run(None, feed())
    session.run(None, feed())
    assert entered[0] == 2
    plain = _session(two_partition_model(), tmp_path, ["CPUExecutionProvider"]).run(None, feed())
    np.testing.assert_allclose(got[0], plain[0], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@requires("iree.runtime", "iree.compiler")
def test_an_iree_session_runs_without_the_cpu_eps_limit(tmp_path: Path, entered: list[int]) -> None:
    session = _session(whole_model(), tmp_path, ["IREEExecutionProvider"])
    assert {ep for ep, _ in session.get_partitions()} == {"IREEExecutionProvider"}
    got = session.run(None, feed())
    assert entered[0] == 0
    expected = _session(whole_model(), tmp_path, ["CPUExecutionProvider"]).run(None, feed())
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-5, atol=1e-6)
