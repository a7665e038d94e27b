"""Two compiling EPs in one model, merging prefixed context models, and the CLI over both."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import epctx
from epctx.cli import main as cli_main
from epctx.providers.example import ExampleExecutionProvider
from epctx.session.compile_guard import no_compile
from tests.epcontext.models import EXAMPLE, feed, two_partition_model
from tests.fusing_ep import registered
from tests.oracle import run_ort


class SecondExampleExecutionProvider(ExampleExecutionProvider):
    """The example EP under another name: a second compiling EP with its own binary."""

    name = "SecondExampleExecutionProvider"


SECOND = SecondExampleExecutionProvider.name


def _config(**entries: str) -> epctx.SessionOptions:
    so = epctx.SessionOptions()
    for key, value in entries.items():
        so.add_session_config_entry(key.replace("__", "."), value)
    return so


def test_two_compiling_eps_write_one_binary_each(tmp_path):
    src = tmp_path / "model.onnx"
    onnx.save(two_partition_model(), src)
    providers = [(EXAMPLE, {"ops": "MatMul,Relu"}), SECOND]
    with registered(SecondExampleExecutionProvider):
        sess = epctx.InferenceSession(str(src), _config(ep__context_enable="1"), providers=providers)
        expected = sess.run(None, feed())[0]
        ctx = onnx.load(tmp_path / "model_ctx.onnx")
        sources = [
            next(a.s for a in n.attribute if a.name == "source")
            for n in ctx.graph.node
            if n.op_type == "EPContext"
        ]
        assert set(sources) == {EXAMPLE.encode(), SECOND.encode()}
        assert (tmp_path / f"model_{EXAMPLE}.bin").is_file() and (tmp_path / f"model_{SECOND}.bin").is_file()
        meta = {p.key for p in ctx.metadata_props}
        assert {f"ep_compatibility_info.{EXAMPLE}", f"ep_compatibility_info.{SECOND}"} <= meta
        with no_compile():
            loaded = epctx.InferenceSession(str(tmp_path / "model_ctx.onnx"), providers=[EXAMPLE, SECOND])
        np.testing.assert_allclose(loaded.run(None, feed())[0], expected, atol=1e-5)
    np.testing.assert_allclose(expected, run_ort(two_partition_model(), feed())[0], atol=1e-5)


def _second_stage() -> onnx.ModelProto:
    """Reads 'y' (the first model's output): MatMul -> Softmax | LayerNormalization (CPU)."""
    rng = np.random.default_rng(5)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["y", "V"], ["p"], name="stage2_mm"),
            helper.make_node("Softmax", ["p"], ["q"], axis=-1, name="stage2_softmax"),
            helper.make_node("LayerNormalization", ["q", "g", "h"], ["z"], axis=-1, name="stage2_ln"),
        ],
        "stage2",
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 6])],
        [
            numpy_helper.from_array(rng.standard_normal((4, 6)).astype(np.float32), "V"),
            numpy_helper.from_array(np.ones(6, np.float32), "g"),
            numpy_helper.from_array(np.zeros(6, np.float32), "h"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_merge_prefixed_context_models_loads_and_runs(tmp_path, capsys):
    first, second = tmp_path / "first.onnx", tmp_path / "second.onnx"
    onnx.save(two_partition_model(), first)
    onnx.save(_second_stage(), second)
    assert cli_main(["compile", str(first), "-p", EXAMPLE, "--prefix", "a_", "-q"]) == 0
    capsys.readouterr()
    assert cli_main(["compile", str(second), "-p", EXAMPLE, "--prefix", "b_", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {Path(p).name for p in report["files"]} == {"second_ctx.onnx", f"second_{EXAMPLE}.bin"}
    merged = tmp_path / "merged.onnx"
    args = [
        "merge",
        str(tmp_path / "first_ctx.onnx"),
        str(tmp_path / "second_ctx.onnx"),
        "-o",
        str(merged),
        "--json",
    ]
    assert cli_main(args) == 0
    assert json.loads(capsys.readouterr().out)["ep_context_nodes"] == 3  # two partitions + one
    with no_compile():
        sess = epctx.InferenceSession(str(merged), providers=[EXAMPLE])
    assert [i.name for i in sess.get_inputs()] == ["x"] and [o.name for o in sess.get_outputs()] == ["z"]
    (z,) = sess.run(None, feed())
    y = run_ort(two_partition_model(), feed())[0]
    np.testing.assert_allclose(z, run_ort(_second_stage(), {"y": y})[0], atol=1e-5)


@pytest.mark.slow
def test_cli_run_prints_outputs_and_timing(tmp_path):
    src = tmp_path / "model.onnx"
    onnx.save(two_partition_model(), src)
    np.save(tmp_path / "x.npy", feed()["x"])
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "epctx.cli",
            "run",
            str(src),
            "-p",
            EXAMPLE,
            "--input",
            f"x={tmp_path / 'x.npy'}",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert "y: float32[3, 4]" in result.stdout and "session creation" in result.stdout


def _ctx_model(node: str, inp: str, out: str, *, opset: int = 17, init: float = 1.0) -> onnx.ModelProto:
    """A stand-in context model (merge reads protos only): one EPContext node ``inp`` -> ``out``."""
    graph = helper.make_graph(
        [helper.make_node("EPContext", [inp, "w"], [out], name=node, domain="com.microsoft")],
        node,
        [helper.make_tensor_value_info(inp, TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1])],
        [numpy_helper.from_array(np.array([init], np.float32), "w")],
    )
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


@pytest.mark.parametrize(
    ("second", "message"),
    [
        (_ctx_model("a", "y", "z"), "node name 'a' is in"),
        (_ctx_model("b", "x", "y"), "value 'y' is produced in"),
        (_ctx_model("b", "y", "z", opset=18), "imports opset ai.onnx:18, another model 17"),
        (_ctx_model("b", "y", "z", init=2.0), "initializer 'w' differs between"),
    ],
)
def test_merge_refuses_models_that_do_not_fit_together(tmp_path, second, message):
    from epctx.epcontext.merge import merge_context_models
    from epctx.errors import InvalidGraph

    onnx.save(_ctx_model("a", "x", "y"), tmp_path / "one.onnx")
    onnx.save(second, tmp_path / "two.onnx")
    with pytest.raises(InvalidGraph, match=message):
        merge_context_models([tmp_path / "one.onnx", tmp_path / "two.onnx"], tmp_path / "merged.onnx")
    assert not (tmp_path / "merged.onnx").exists()


def test_merge_joins_stand_in_models_and_refuses_inputs_elsewhere(tmp_path):
    from epctx.epcontext.merge import merge_context_models
    from epctx.errors import InvalidArgument

    onnx.save(_ctx_model("a", "x", "y"), tmp_path / "one.onnx")
    onnx.save(_ctx_model("b", "y", "z"), tmp_path / "two.onnx")
    merged = merge_context_models([tmp_path / "one.onnx", tmp_path / "two.onnx"], tmp_path / "m.onnx")
    assert [v.name for v in merged.graph.input] == ["x"] and [v.name for v in merged.graph.output] == ["z"]
    assert [i.name for i in merged.graph.initializer] == ["w"]  # the same bytes in both: kept once
    (tmp_path / "sub").mkdir()
    with pytest.raises(InvalidArgument, match="is not in the output's folder"):
        merge_context_models([tmp_path / "one.onnx", tmp_path / "two.onnx"], tmp_path / "sub" / "m.onnx")
