"""``epctx run -o FILE.npz`` / ``--output-dir DIR``: the outputs saved, equal to onnxruntime's; names that are not
safe file names sanitized without collisions; what went where said; nothing run when a file cannot be written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from epctx.cli.run_outputs import safe_file_names
from epctx.testing import no_compile
from tests.cli.helpers import Cli, assert_one_error_line
from tests.epcontext.models import EXAMPLE, feed, two_partition_model
from tests.oracle import run_ort

# Output names a file system refuses or that collide once made safe (and one named like np.savez's parameter).
NAMES = ["a/b", "a:b", "A_b", "..hidden", "file", "two words"]


@pytest.fixture
def odd_names(tmp_path: Path) -> Path:
    """x -> x + k for each name of NAMES."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    nodes = [helper.make_node("Add", ["x", f"c{k}"], [name]) for k, name in enumerate(NAMES)]
    consts = [helper.make_tensor(f"c{k}", TensorProto.FLOAT, [], [float(k)]) for k in range(len(NAMES))]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 3]) for name in NAMES]
    graph = helper.make_graph(nodes, "odd_names", [x], outputs, initializer=consts)
    path = tmp_path / "odd.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_output_npz_holds_each_output_by_name(cli: Cli, model: Path, tmp_path: Path) -> None:
    x = feed()["x"]
    np.save(tmp_path / "x.npy", x)
    target = tmp_path / "y.npz"
    result = cli("run", model, "--input", f"x={tmp_path / 'x.npy'}", "-o", target)
    assert result.status == 0, result.err
    assert f"-> {target}" in result.out and f"saved 1 output(s) in {target}" in result.out
    with np.load(target) as saved:
        assert saved.files == ["y"]
        np.testing.assert_allclose(saved["y"], run_ort(two_partition_model(), {"x": x})[0], atol=1e-5)
    before = target.read_bytes()
    assert_one_error_line(cli("run", model, "--random", "--dim", "N=2", "-o", target), 1, "exists", "--force")
    assert target.read_bytes() == before
    assert cli("run", model, "--random", "--dim", "N=2", "-o", target, "--force").status == 0
    assert np.load(target)["y"].shape == (2, 4)


def test_output_dir_sanitizes_names_and_says_where_each_went(
    cli: Cli, odd_names: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.save(tmp_path / "x.npy", x)
    result = cli("run", odd_names, "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", out, "--json")
    assert result.status == 0, result.err
    saved = result.json()["saved"]
    assert list(saved) == NAMES
    files = [Path(saved[n]) for n in NAMES]
    assert [f.name for f in files] == [
        "a_b.npy",
        "a_b_2.npy",
        "A_b_3.npy",
        "hidden.npy",
        "file.npy",
        "two_words.npy",
    ]
    assert sorted(p.name for p in out.iterdir()) == sorted(f.name for f in files)
    for k, path in enumerate(files):
        np.testing.assert_array_equal(np.load(path), x + k)
    text = cli("run", odd_names, "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", out, "--force").out
    assert f"  a:b: float32[2, 3]  mean=3.5  -> {out / 'a_b_2.npy'}" in text
    assert f"saved 6 .npy file(s) in {out}" in text
    npz = tmp_path / "odd.npz"
    assert cli("run", odd_names, "--input", f"x={tmp_path / 'x.npy'}", "-o", npz).status == 0
    with np.load(npz) as archive:
        assert archive.files == NAMES
        np.testing.assert_array_equal(archive["a/b"], x)


def test_where_outputs_go_is_checked_before_running(cli: Cli, model: Path, tmp_path: Path) -> None:
    run = ("run", model, "--random", "--dim", "N=2")
    missing = tmp_path / "nope"
    assert_one_error_line(cli(*run, "--output-dir", missing), 1, "does not exist", "mkdir")
    assert_one_error_line(cli(*run, "-o", missing / "y.npz"), 1, "does not exist")
    assert_one_error_line(cli(*run, "-o", tmp_path / "y.npy"), 2, ".npz")
    assert_one_error_line(cli(*run, "-o", tmp_path / "y.npz", "--output-dir", tmp_path), 2, "give one")
    (tmp_path / "y.npy").write_bytes(b"keep")
    assert_one_error_line(cli(*run, "--output-dir", tmp_path), 1, "y.npy", "--force")
    assert (tmp_path / "y.npy").read_bytes() == b"keep"
    assert not missing.exists()


def test_safe_file_names() -> None:
    assert safe_file_names(["logits", "x y", "con", "X_Y", "é"]) == ["logits", "x_y", "con", "X_Y_2", "_"]


def test_output_flags_are_checked_before_the_session_is_made(cli: Cli, model: Path, tmp_path: Path) -> None:
    with no_compile():  # a model that would need compiling: refused before that
        result = cli("run", model, "-p", EXAMPLE, "--random", "--dim", "N=2", "-o", tmp_path / "y.txt")
    assert_one_error_line(result, 2, ".npz")
