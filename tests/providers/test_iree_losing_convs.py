"""IREE is not given a model whose convolutions have dynamic spatial sizes (``capability.losing_conv``): its code
for them lost to the CPU EP on every corpus model measured, after a 15-45 s compile. Nothing is compiled, every
candidate is declined (the convolutions with their own reason, the others naming the one that forces it), with
the ``--dim`` sizes to state; a model whose only dynamic dimension is the batch compiles as before, and so does
one whose sizes are stated. IREE's compiles are stood in for (``test_iree_capability._check``)."""

from __future__ import annotations

import logging

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from epctx.providers.iree import probing
from epctx.providers.iree.capability import DYNAMIC_CONVS_ENV, losing_conv
from tests.providers.test_iree_capability import LAYOUT, _check


def _conv_net(dims: list[int | str]) -> ir.Graph:
    """x[dims] -> Conv -> Relu -> Conv -> y, shapes inferred as a session does."""
    import onnx

    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    w2 = numpy_helper.from_array(np.ones((2, 4, 1, 1), np.float32), "w2")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["a"], pads=[1, 1, 1, 1], name="c0"),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node("Conv", ["b", "w2"], ["y"], name="c1"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = helper.make_model(
        helper.make_graph(nodes, "convs", [x], [y], [w, w2]), opset_imports=[helper.make_opsetid("", 17)]
    )
    return ir.serde.deserialize_model(onnx.shape_inference.infer_shapes(model)).graph


def test_a_conv_net_with_dynamic_spatial_sizes_is_not_compiled(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(DYNAMIC_CONVS_ENV, raising=False)
    graph = _conv_net(["batch", 3, "height", "width"])
    with caplog.at_level(logging.WARNING, logger="epctx"):
        verdict, asked = _check(monkeypatch, graph, lambda names: True)
    assert asked == []  # no compile at all
    assert verdict.claimed == [] and verdict.groups == []
    reasons = {n.name: why for n, why in verdict.declined.items()}
    assert set(reasons) == {"c0", "relu", "c1"}
    assert reasons["c0"].startswith("not compiled: a convolution with dynamic spatial sizes")
    assert reasons["c0"] == reasons["c1"]  # one reason (epctx compile's summary groups by reason)
    assert "slower than the CPU EP's" in reasons["c1"]
    # the others name the convolution that forces it, and every reason the sizes to state
    assert "('c0' first, its input 'x' [batch,3,height,width])" in reasons["relu"], reasons["relu"]
    assert all("--dim batch=1 --dim height=N --dim width=N" in why for why in reasons.values()), reasons
    assert all(
        "epctx.specialize_shapes" in why for why in reasons.values()
    )  # and that a session does it itself
    assert "does not compile this model: 2 of its convolutions" in caplog.text
    assert "'c0' first, its input 'x' [batch,3,height,width]" in caplog.text
    assert DYNAMIC_CONVS_ENV in caplog.text


def test_a_conv_net_with_a_dynamic_batch_only_is_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    verdict, asked = _check(monkeypatch, _conv_net(["batch", 3, 8, 8]), lambda names: True)
    assert asked == [{"c0", "relu", "c1"}]
    assert [n.name for n in verdict.claimed] == ["c0", "relu", "c1"] and not verdict.declined


def test_stated_sizes_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    verdict, asked = _check(monkeypatch, _conv_net([1, 3, 8, 8]), lambda names: True)
    assert asked == [{"c0", "relu", "c1"}] and not verdict.declined


def test_the_environment_compiles_them_anyway(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DYNAMIC_CONVS_ENV, "1")
    verdict, asked = _check(monkeypatch, _conv_net(["batch", 3, "height", "width"]), lambda names: True)
    assert asked == [{"c0", "relu", "c1"}]
    assert len(verdict.claimed) == 3


def test_which_convolutions_lose() -> None:
    graph = _conv_net(["N", 3, "H", 8])  # one spatial axis dynamic is enough
    conv = next(n for n in graph if n.name == "c0")
    assert losing_conv(conv) is not None
    assert losing_conv(next(n for n in graph if n.name == "relu")) is None
    batch_only = next(n for n in _conv_net(["N", 3, 8, 8]) if n.name == "c0")
    assert losing_conv(batch_only) is None
    unknown = next(n for n in _conv_net(["N", 3, "H", "W"]) if n.name == "c1")
    unknown.inputs[0].shape = None  # type: ignore[union-attr]
    assert losing_conv(unknown) is None  # a shape not known: compiled as before


def test_stated_sizes_compile_though_the_inferred_shapes_are_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    """Free-dimension overrides state the graph inputs' sizes and leave the shapes inferred at load as they were
    (nudenet's convolutions still read ``[batch,16,?,?]`` with its sizes stated): compiled."""
    graph = _conv_net(["batch", 3, "height", "width"])
    graph.inputs[0].shape = ir.Shape([1, 3, 8, 8])  # as apply_dimension_overrides does
    assert (
        losing_conv(next(n for n in graph if n.name == "c1")) is not None
    )  # stale: still [batch,4,height,width]
    verdict, asked = _check(monkeypatch, graph, lambda names: True)
    assert asked == [{"c0", "relu", "c1"}] and not verdict.declined


def test_the_first_compile_is_announced_with_the_sizes_to_state(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before the first compile (seconds to a minute), the progress line ``epctx compile`` shows says what IREE is
    about to compile and, the model's dimensions being dynamic, which ``--dim`` would make its code faster."""
    with caplog.at_level(logging.INFO, logger="epctx"):
        _check(monkeypatch, _conv_net(["batch", 3, 8, 8]), lambda names: True)
    line = next(r.getMessage() for r in caplog.records if "to see what it takes" in r.getMessage())
    assert "compiling the model's 3 node(s) IREE may take whole with IREE" in line, line
    assert (
        "its dimensions are dynamic: State the sizes for faster code: epctx compile --dim batch=1" in line
    ), line
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="epctx"):
        _check(monkeypatch, _conv_net([1, 3, 8, 8]), lambda names: True)
    assert "to see what it takes" in caplog.text and "dynamic" not in caplog.text


def _pooled_net(dims: list[int | str]) -> ir.Graph:
    """x[dims] -> Conv -> MaxPool -> y, shapes inferred."""
    import onnx

    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["a"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node(
            "MaxPool", ["a"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], name="pool"
        ),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = helper.make_model(
        helper.make_graph(nodes, "pooled", [x], [y], [w]), opset_imports=[helper.make_opsetid("", 17)]
    )
    return ir.serde.deserialize_model(onnx.shape_inference.infer_shapes(model)).graph


@pytest.mark.parametrize(
    ("dims", "version", "channels_last_tried"),
    [
        (["batch", 3, 8, 8], "3.13.0", False),
        ([1, 3, 8, 8], "3.13.0", True),
        (["batch", 3, 8, 8], "3.14.0", True),
    ],
    ids=["dynamic batch", "static", "another IREE"],
)
def test_a_dynamic_maxpool_is_not_compiled_channels_last(
    monkeypatch: pytest.MonkeyPatch, dims: list[int | str], version: str, channels_last_tried: bool
) -> None:
    """IREE 3.13's channels-last conversion fails on a MaxPool with dynamic sizes (ResNet-18 and nudenet as
    shipped, 1.6-1.8 s a try, twice with compile.py's retry): not tried; compiled in ONNX's layout at once. Another
    IREE's is tried."""
    monkeypatch.setattr(probing, "compiler_version", lambda: version)
    tried: list[tuple[str, ...]] = []

    def full_only(names: set[str], flags: object) -> bool:
        tried.append(tuple(flags))  # type: ignore[arg-type]
        return LAYOUT not in tried[-1]  # the conversion fails, as IREE's does

    verdict, _ = _check(
        monkeypatch, _pooled_net(dims), lambda names: True, flags=[LAYOUT], full_only=full_only
    )
    assert [n.name for n in verdict.claimed] == ["conv", "pool"]
    assert LAYOUT not in verdict.probes.flags
    assert tried == ([(LAYOUT,), ()] if channels_last_tried else [()])


def test_a_model_without_maxpool_is_compiled_channels_last(monkeypatch: pytest.MonkeyPatch) -> None:
    tried: list[tuple[str, ...]] = []

    def full_only(names: set[str], flags: object) -> bool:
        tried.append(tuple(flags))  # type: ignore[arg-type]
        return True

    verdict, _ = _check(
        monkeypatch, _conv_net(["batch", 3, 8, 8]), lambda names: True, flags=[LAYOUT], full_only=full_only
    )
    assert tried == [(LAYOUT,)] and verdict.probes.flags == (LAYOUT,)
