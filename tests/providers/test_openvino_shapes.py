"""OpenVINO specializes per input shape (``static_shapes_help``): its CPU plugin runs a model compiled for static
shapes faster than one with dynamic dimensions, so a session over a dynamic model makes, for a signature seen
twice, a session OpenVINO compiled for those shapes; the results equal onnxruntime's on every shape."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("openvino")
pytest.importorskip("onnxruntime")

import epctx
from epctx import options as opt
from epctx.providers.openvino import OpenVINOExecutionProvider
from tests.oracle import run_ort
from tests.test_shape_specialization import _model  # x[batch, 8] -> Relu(x @ W + b)

EP = "OpenVINOExecutionProvider"
RNG = np.random.default_rng(3)


def test_openvino_says_static_shapes_help_it() -> None:
    assert OpenVINOExecutionProvider.static_shapes_help


def test_a_signature_seen_twice_runs_on_a_model_openvino_compiled_for_it(tmp_path: Path) -> None:
    so = epctx.SessionOptions()
    so.add_session_config_entry(opt.CONTEXT_CACHE, str(tmp_path / "cache"))
    so.add_session_config_entry(opt.SPECIALIZE_SHAPES, "sync")
    session = epctx.InferenceSession(_model(), so, providers=[EP])
    assert session._shapes is not None  # x has a dynamic batch
    feed = {"x": RNG.standard_normal((3, 8)).astype(np.float32)}
    first = session.run(None, feed)[0]
    got = session.run(None, feed)[0]  # made in this run, which runs on it
    (text, made), *_ = session.get_shape_specializations().items()
    assert text == "x[3,8]" and made.state == "ready", made
    assert dict(made.nodes) == {EP: 3}
    special = session._shapes._ready[((3, 8),)]
    assert [list(value.shape) for value in special.model.graph.inputs] == [
        [3, 8]
    ]  # compiled for static shapes
    expected = run_ort(_model(), feed)[0]
    np.testing.assert_allclose(first, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    other = {"x": RNG.standard_normal((5, 8)).astype(np.float32)}  # another batch: the session's own plan
    np.testing.assert_allclose(session.run(None, other)[0], run_ort(_model(), other)[0], rtol=1e-5, atol=1e-5)
    assert list(session.get_shape_specializations()) == ["x[3,8]"]


def test_the_process_exits_cleanly_while_a_specialization_compiles(tmp_path: Path) -> None:
    """A process that ends right after a shape's second run, its OpenVINO compile in flight in the background:
    the compile is waited for at exit (specialize._drain_at_exit). Before, the daemon thread was frozen inside
    OpenVINO's compile as the process tore down, which aborted it (exit status 134, "terminate called without an
    active exception") where onnxruntime was loaded too, as in `epctx demo`."""
    script = textwrap.dedent(
        f"""
        import numpy as np
        import epctx
        from epctx.cli.demo import build_demo_model
        path = {str(tmp_path / "m.onnx")!r}
        build_demo_model(path)
        session = epctx.InferenceSession(path, providers=["OpenVINOExecutionProvider"])
        x = np.ones((2, 3, 64, 64), np.float32)
        for _ in range(3):
            session.run(None, {{"x": x}})
        import onnxruntime  # as epctx demo's cross-check does: the abort needed both runtimes in the process
        onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {{"x": x}})
        print(sorted(s.state for s in session.get_shape_specializations().values()))
        """
    )
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and "terminate" not in done.stderr, done.stderr[-2000:]
        assert done.stdout.strip() in ("['pending']", "['ready']")
