"""IREE leaves the root logger as the user set it: ``iree.runtime`` logs through ``logging.debug`` (which calls
``logging.basicConfig()`` when the root logger has no handler) when a function without reflection data is bound,
as each IREE context is on loading. Fresh processes: the root logger of a pytest process has pytest's handlers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from tests.requires import requires

# Compiles with IREE: `make test-fast` leaves it out.
pytestmark = [pytest.mark.slow, requires("iree.runtime", "iree.compiler")]
IREE = "IREEExecutionProvider"
SRC = Path(__file__).resolve().parents[2] / "src"


def _python(code: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run(
        [sys.executable, *(["-c", textwrap.dedent(code)] if code else []), *args],
        capture_output=True, text=True, timeout=300, cwd=cwd, env=env,
    )  # fmt: skip


@pytest.fixture(scope="module")
def iree_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """y = relu(x) + relu(x), all of it on IREE (a compile of about a second)."""
    folder = tmp_path_factory.mktemp("iree_logging")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    nodes = [helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Add", ["t", "t"], ["y"])]
    graph = helper.make_graph(nodes, "relu_add", [x], [y])
    path = folder / "relu_add.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_compile_prints_each_progress_line_once(iree_model: Path) -> None:
    """The capability check and the compile load IREE modules in this process: no ``INFO:epctx:`` copies."""
    done = _python(
        "", iree_model.parent, "-m", "epctx.cli", "compile", iree_model.name, "-p", IREE, "--force"
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert any(line.startswith("epctx: compiled partition 1/1") for line in lines), done.stderr
    assert all(line.startswith("epctx: ") for line in lines), done.stderr
    assert len(lines) == len(set(lines)), done.stderr
    assert (iree_model.parent / "relu_add_ctx.onnx").is_file()


def test_loading_an_iree_context_leaves_the_root_logger_alone(iree_model: Path) -> None:
    ctx = iree_model.with_name("relu_add_kept_ctx.onnx")
    # The measured rule off: this toy runs faster on the CPU EP, and the test is about loading an IREE context.
    generate = f"""
        import epctx
        so = epctx.SessionOptions()
        so.add_session_config_entry("epctx.partition.measured_rule", "0")
        so.add_session_config_entry("ep.context_enable", "1")
        so.add_session_config_entry("ep.context_file_path", {str(ctx)!r})
        epctx.InferenceSession({str(iree_model)!r}, so, providers=[{IREE!r}])
        """
    done = _python(generate, iree_model.parent)
    assert done.returncode == 0, done.stderr
    code = f"""
        import logging, sys
        import numpy as np
        import epctx

        root = logging.getLogger()
        before = list(root.handlers)
        sess = epctx.InferenceSession({str(ctx)!r}, providers=[{IREE!r}])
        y = sess.run(None, {{"x": np.full((2, 4), -1.0, np.float32)}})[0]
        assert sess.get_partitions()[0][0] == {IREE!r}, sess.get_partitions()
        assert "iree.runtime" in sys.modules
        print("handlers equal:", root.handlers == before, root.handlers)
        logging.basicConfig(level=logging.INFO, format="USER %(name)s %(message)s")
        logging.getLogger("app").info("configured")
        print("after basicConfig:", [type(h).__name__ for h in root.handlers])
        """
    done = _python(code, iree_model.parent)
    assert done.returncode == 0, done.stderr
    assert "handlers equal: True []" in done.stdout, done.stdout
    assert "after basicConfig: ['StreamHandler']" in done.stdout
    assert "USER app configured" in done.stderr
    assert "DEBUG:root" not in done.stderr and "lacks reflection" not in done.stderr
