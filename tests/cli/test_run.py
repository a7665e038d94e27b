"""``epctx run``: every input from --input or --random (dynamic dimensions from --dim or --shape), nothing guessed; a context
model runs on the EPs its EPContext nodes name; -p takes options with commas."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from epctx.testing import no_compile
from tests.cli.helpers import Cli, assert_one_error_line
from tests.epcontext.models import EXAMPLE, feed, two_partition_model
from tests.oracle import run_ort


def _expected_mean(x: np.ndarray) -> float:
    return float(np.mean(run_ort(two_partition_model(), {"x": x})[0]))


def test_inputs_from_files_match_onnxruntime(cli: Cli, model: Path, tmp_path: Path) -> None:
    x = feed()["x"]
    np.save(tmp_path / "x.npy", x)
    result = cli("run", model, "--input", f"x={tmp_path / 'x.npy'}", "--json")
    assert result.status == 0, result.err
    out = result.json()
    assert out["providers"] == ["CPUExecutionProvider"] and out["providers_from"] == "default"
    (y,) = out["outputs"]
    assert y["shape"] == [3, 4] and y["mean"] == pytest.approx(_expected_mean(x), abs=1e-6)


def test_unknown_input_name_is_an_error(cli: Cli, model: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", feed()["x"])
    result = cli("run", model, "--input", f"x={tmp_path / 'x.npy'}", "--input", f"z={tmp_path / 'x.npy'}")
    assert_one_error_line(result, 1, "'z'", "its inputs: x")


def test_missing_input_is_an_error_unless_random(cli: Cli, model: Path) -> None:
    assert_one_error_line(cli("run", model), 1, "x", "--input", "--random")


def test_random_needs_a_size_for_each_dynamic_dimension(cli: Cli, model: Path) -> None:
    assert_one_error_line(cli("run", model, "--random"), 1, "'N'", "--dim N=")
    for dim in ("N=5", "x:0=5"):
        result = cli("run", model, "--random", "--dim", dim, "--json")
        assert result.status == 0, result.err
        out = result.json()
        assert out["inputs"] == {"x": {"shape": [5, 8], "dtype": "float32"}}
        assert out["outputs"][0]["shape"] == [5, 4]


def test_random_takes_whole_shapes(cli: Cli, model: Path) -> None:
    result = cli("run", model, "--random", "--shape", "x[6,8]", "--json")
    assert result.status == 0, result.err
    out = result.json()
    assert out["inputs"] == {"x": {"shape": [6, 8], "dtype": "float32"}}
    assert out["outputs"][0]["shape"] == [6, 4]
    x = np.random.default_rng(0).standard_normal((6, 8)).astype(np.float32)
    assert out["outputs"][0]["mean"] == pytest.approx(_expected_mean(x), abs=1e-6)


def test_shape_errors(cli: Cli, model: Path) -> None:
    assert_one_error_line(cli("run", model, "--shape", "x[2,8]"), 2, "--shape", "--random")
    assert_one_error_line(cli("run", model, "--random", "--shape", "x[2,9]"), 1, "axis 1", "fixed at 8")
    assert_one_error_line(cli("run", model, "--random", "--shape", "x[2,8,1]"), 1, "rank 2")
    assert_one_error_line(cli("run", model, "--random", "--shape", "y[2,8]", "--dim", "N=1"), 1, "'y'", "x")
    assert_one_error_line(cli("run", model, "--random", "--shape", "x[2,-8]"), 2, "negative")
    assert_one_error_line(cli("run", model, "--random", "--shape", "x[2,8]", "--shape", "x[3,8]"), 2, "twice")


def test_random_is_seeded(cli: Cli, model: Path) -> None:
    means = [cli("run", model, "--random", "--dim", "N=2", "--seed", s, "--json").json() for s in (0, 0, 1)]
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    assert means[0]["outputs"][0]["mean"] == pytest.approx(_expected_mean(x), abs=1e-6)
    assert means[0]["outputs"] == means[1]["outputs"] != means[2]["outputs"]


def test_dim_errors(cli: Cli, model: Path) -> None:
    assert_one_error_line(cli("run", model, "--random", "--dim", "N=2", "--dim", "batch=2"), 1, "batch")
    assert_one_error_line(cli("run", model, "--dim", "N=2"), 2, "--random")
    assert_one_error_line(cli("run", model, "--random", "--dim", "N=two"), 2, "N=two", "integer")
    assert_one_error_line(cli("run", model, "--random", "--dim", "N"), 2, "NAME=N")
    assert_one_error_line(cli("run", model, "--input", "x.npy"), 2, "NAME=FILE.npy")
    assert_one_error_line(cli("run", model, "--random", "--dim", "N=1", "--dim", "N=2"), 2, "twice")


def test_random_refuses_types_it_cannot_make(cli: Cli, tmp_path: Path) -> None:
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["s"], ["t"])],
        "g",
        [onnx.helper.make_tensor_value_info("s", onnx.TensorProto.STRING, [2])],
        [onnx.helper.make_tensor_value_info("t", onnx.TensorProto.STRING, [2])],
    )
    path = tmp_path / "strings.onnx"
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), path)
    assert_one_error_line(cli("run", path, "--random"), 1, "tensor(string)", "--input s=")


def test_context_model_runs_on_the_eps_its_nodes_name(cli: Cli, ctx_model: Path) -> None:
    with no_compile():
        result = cli("run", ctx_model, "--random", "--dim", "N=3", "--json")
    assert result.status == 0, result.err
    out = result.json()
    assert out["providers"] == [EXAMPLE, "CPUExecutionProvider"]
    assert out["providers_from"] == "the model's EPContext nodes"
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    assert out["outputs"][0]["mean"] == pytest.approx(_expected_mean(x), abs=1e-5)


def test_context_model_of_an_ep_that_is_not_here(cli: Cli, ctx_model: Path) -> None:
    model = onnx.load(ctx_model, load_external_data=False)
    for node in model.graph.node:
        for attr in node.attribute:
            if node.op_type == "EPContext" and attr.name == "source":
                attr.s = b"QNNExecutionProvider"
    onnx.save(model, ctx_model)
    assert_one_error_line(cli("run", ctx_model, "--random", "--dim", "N=1"), 1, "QNNExecutionProvider", "-p")


def test_provider_option_values_with_commas(cli: Cli, model: Path) -> None:
    """Quoted in -p, or whole in --option: the Example EP checks every name in ``ops``."""
    for args in (["-p", f'{EXAMPLE}:ops="MatMul,Nope"'], ["-p", EXAMPLE, "--option", "ops=MatMul,Nope"]):
        assert_one_error_line(cli("run", model, "--random", "--dim", "N=1", *args), 1, "Nope")
    for args in (["-p", f"{EXAMPLE}:ops='MatMul,Relu'"], ["-p", EXAMPLE, "-O", "ops=MatMul,Relu"]):
        result = cli("run", model, "--random", "--dim", "N=1", "--json", *args)
        assert result.status == 0, result.err
        assert result.json()["providers"] == [EXAMPLE, "CPUExecutionProvider"]
