"""External data is confined to the model folder as onnxruntime confines it: symlinks followed, the file must
resolve inside the model's folder (as given, or the model file's own once resolved). onnxruntime is the oracle
for plain models; a context model's CPU-fallback initializers go through the same check."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from onnx.external_data_helper import set_external_data

import epctx
from tests.epcontext.models import EXAMPLE, feed, two_partition_model

W = np.arange(6, dtype=np.float32).reshape(2, 3)
SECRET = np.full((2, 3), 100.0, np.float32)


def _model(location: str) -> onnx.ModelProto:
    tensor = numpy_helper.from_array(W, "W")
    set_external_data(tensor, location)
    tensor.ClearField("raw_data")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "W"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])],
        [tensor],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _abs_link_out(root: Path) -> str:
    (root / "m" / "data.bin").symlink_to(root / "outside" / "secret.bin")
    return "data.bin"


def _rel_link_out(root: Path) -> str:
    (root / "m" / "data.bin").symlink_to("../outside/secret.bin")
    return "data.bin"


def _dotdot(root: Path) -> str:
    return "../outside/secret.bin"


def _absolute(root: Path) -> str:
    return str(root / "outside" / "secret.bin")


def _link_in(root: Path) -> str:
    W.tofile(root / "m" / "real.bin")
    (root / "m" / "data.bin").symlink_to("real.bin")
    return "data.bin"


def _dotdot_inside(root: Path) -> str:
    (root / "m" / "sub").mkdir()
    W.tofile(root / "m" / "sub" / "d.bin")
    return "sub/../sub/d.bin"


def _hf_cache(root: Path) -> str:
    """Hugging Face's cache: model.onnx and its data are both links into blobs/ (onnxruntime loads it)."""
    (root / "blobs").mkdir()
    W.tofile(root / "blobs" / "g2")
    (root / "m" / "data.bin").symlink_to("../blobs/g2")
    return "data.bin"


def _model_linked_data_real(root: Path) -> str:
    W.tofile(root / "m" / "data.bin")
    (root / "blobs").mkdir()
    return "data.bin"


CASES: dict[str, tuple[Callable[[Path], str], bool, bool]] = {
    # name: (layout, model.onnx is a link into blobs/, loads)
    "absolute symlink leaving the folder": (_abs_link_out, False, False),
    "relative symlink leaving the folder": (_rel_link_out, False, False),
    "'..' leaving the folder": (_dotdot, False, False),
    "absolute location": (_absolute, False, False),
    "symlink inside the folder": (_link_in, False, True),
    "'..' staying inside": (_dotdot_inside, False, True),
    "hugging face cache layout": (_hf_cache, True, True),
    "model linked, data beside the link": (_model_linked_data_real, True, True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_plain_model_external_data_as_onnxruntime(tmp_path: Path, case: str) -> None:
    layout, model_linked, loads = CASES[case]
    (tmp_path / "m").mkdir()
    (tmp_path / "outside").mkdir()
    SECRET.tofile(tmp_path / "outside" / "secret.bin")
    location = layout(tmp_path)
    if model_linked:
        onnx.save(_model(location), tmp_path / "blobs" / "g1")
        (tmp_path / "m" / "model.onnx").symlink_to("../blobs/g1")
    else:
        onnx.save(_model(location), tmp_path / "m" / "model.onnx")
    path = str(tmp_path / "m" / "model.onnx")
    x = {"x": np.zeros((2, 3), np.float32)}
    try:
        expected = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, x)[0]
    except Exception as exc:
        assert not loads, f"onnxruntime refused a layout the test expects to load: {exc}"
        expected = None
    assert (expected is not None) == loads, "onnxruntime's verdict changed: update the table"
    if loads:
        np.testing.assert_array_equal(epctx.InferenceSession(path).run(None, x)[0], expected)
        return
    with pytest.raises(epctx.Fail, match="initializer 'W'") as info:
        epctx.InferenceSession(path).run(None, x)
    message = str(info.value)
    assert "absolute path not allowed" in message or "External data path escapes model directory" in message


def test_context_model_fallback_initializers_cannot_leave_the_folder(tmp_path: Path) -> None:
    """A context model's CPU-fallback initializers stored as external data, the file a link to outside."""
    onnx.save(two_partition_model(), tmp_path / "model.onnx")
    so = epctx.SessionOptions()
    so.add_provider(EXAMPLE, {})
    epctx.ModelCompiler(so, str(tmp_path / "model.onnx")).compile_to_file(str(tmp_path / "model_ctx.onnx"))
    ctx = onnx.load(tmp_path / "model_ctx.onnx")
    fallback = [t for t in ctx.graph.initializer if t.name.startswith("ln_")]
    assert fallback, "the CPU fallback keeps LayerNormalization's initializers in the context model"
    blob = b"".join(t.raw_data for t in fallback)
    offset = 0
    for tensor in fallback:
        size = len(tensor.raw_data)
        set_external_data(tensor, "fallback.data", offset=offset, length=size)
        tensor.ClearField("raw_data")
        offset += size
    onnx.save(ctx, tmp_path / "model_ctx.onnx")
    (tmp_path / "fallback.data").write_bytes(blob)
    expected = epctx.InferenceSession(str(tmp_path / "model_ctx.onnx"), providers=[EXAMPLE]).run(None, feed())

    outside = tmp_path.parent / f"{tmp_path.name}_outside.data"
    outside.write_bytes(bytes(len(blob)))  # zeros: a run would silently change the outputs
    os.remove(tmp_path / "fallback.data")
    (tmp_path / "fallback.data").symlink_to(outside)
    with pytest.raises(epctx.Fail, match="External data path escapes model directory.*fallback.data"):
        epctx.InferenceSession(str(tmp_path / "model_ctx.onnx"), providers=[EXAMPLE])
    os.remove(tmp_path / "fallback.data")
    shutil.copyfile(outside, tmp_path / "fallback.data")  # the same bytes inside the folder load
    got = epctx.InferenceSession(str(tmp_path / "model_ctx.onnx"), providers=[EXAMPLE]).run(None, feed())
    assert not np.allclose(got[0], expected[0])
    outside.unlink()


def test_missing_external_file_is_no_such_file_naming_it(tmp_path: Path) -> None:
    onnx.save(_model("gone.bin"), tmp_path / "model.onnx")
    with pytest.raises(epctx.NoSuchFile, match="gone.bin"):
        epctx.InferenceSession(str(tmp_path / "model.onnx"))
