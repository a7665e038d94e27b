"""Channels-last hand-off (providers/cpu/layout.py): a depthwise conv returns its result as an NCHW view of
channels-last memory when every reader takes it (1x1 convs, GlobalAveragePool, the Mul of a squeeze-excitation
block into 1x1 convs, all on the CPU EP); checked against onnxruntime, with the cases where it must not happen."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import epctx
from epctx.providers.cpu import layout
from tests.oracle import run_ort

RNG = np.random.default_rng(21)
C = 32


def _init(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array((RNG.standard_normal(shape) * 0.3).astype(np.float32), name)


def _dw(
    out: str, *, stride: int = 1, mult: int = 1, k: int = 3, act: str | None = None
) -> list[onnx.NodeProto]:
    y = out if act is None else out + "_pre"
    nodes = [
        helper.make_node(
            "Conv", ["x", "dw_w", "dw_b"], [y], group=C, pads=[k // 2] * 4, strides=[stride] * 2, name="dw"
        )
    ]
    if act is not None:
        nodes.append(helper.make_node(act, [y], [out]))
    return nodes


def _pw(src: str, out: str, name: str, m: int = 24, stride: int = 1) -> onnx.NodeProto:
    return helper.make_node("Conv", [src, f"{name}_w", f"{name}_b"], [out], strides=[stride] * 2, name=name)


def _model(nodes: list[onnx.NodeProto], outputs: list[str], n: int = 1, mult: int = 1, k: int = 3) -> bytes:
    inits = [_init("dw_w", C * mult, 1, k, k), _init("dw_b", C * mult)]
    for node in nodes:
        if node.op_type == "Conv" and node.name != "dw":
            cin = C * mult
            inits += [_init(f"{node.name}_w", 24 if node.name != "se1" else cin, cin, 1, 1)]
            inits += [_init(f"{node.name}_b", 24 if node.name != "se1" else cin)]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [n, C, 14, 18])],
        [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in outputs],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _se(src: str) -> list[onnx.NodeProto]:
    """A squeeze-excitation block as MobileNetV3 has it, ending in the 1x1 conv 'pw'."""
    return [
        helper.make_node("GlobalAveragePool", [src], ["g"]),
        _pw("g", "s1", "se1"),
        helper.make_node("HardSigmoid", ["s1"], ["s"]),
        helper.make_node("Mul", [src, "s"], ["m"]),
        _pw("m", "z", "pw"),
    ]


CASES: dict[str, tuple[list[onnx.NodeProto], dict[str, Any]]] = {
    "into_pointwise": ([*_dw("y"), _pw("y", "z", "pw")], {}),
    "hard_swish_into_pointwise": ([*_dw("y", act="HardSwish"), _pw("y", "z", "pw")], {}),
    "relu_stride2_into_pointwise": ([*_dw("y", act="Relu", stride=2), _pw("y", "z", "pw")], {}),
    "two_pointwise_readers": ([*_dw("y", act="Relu"), _pw("y", "z", "pw"), _pw("y", "z2", "pw2")], {}),
    "multiplier_two": ([*_dw("y", mult=2), _pw("y", "z", "pw")], {"mult": 2}),
    "batch_of_two": ([*_dw("y", act="Relu"), _pw("y", "z", "pw")], {"n": 2}),
    "squeeze_excitation": ([*_dw("y", act="Relu"), *_se("y")], {}),
    "squeeze_excitation_5x5": ([*_dw("y", act="HardSwish", k=5), *_se("y")], {"k": 5}),
}


def _check(data: bytes, n: int = 1, **kwargs: Any) -> Any:
    """Two runs against onnxruntime: the first makes each conv's route, the second takes the kept one."""
    sess = epctx.InferenceSession(data, **kwargs)
    for _ in range(2):
        x = RNG.standard_normal((n, C, 14, 18)).astype(np.float32)
        ours = sess.run(None, {"x": x})
        for a, b in zip(ours, run_ort(data, {"x": x}), strict=True):
            assert a.shape == b.shape and a.flags.c_contiguous
            np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)
    return sess


def _handoffs(sess: Any) -> list[layout.Handoff]:
    """The hand-offs of the depthwise conv's result 'y' (a squeeze-excitation's 1x1 conv may have one too)."""
    graph = sess.model.graph
    values = [v for node in graph for v in node.outputs if v.name == "y"]
    return [h for v in values if (h := layout.HANDOFFS.get(v)) is not None]


@pytest.mark.parametrize("case", list(CASES))
def test_handoff_matches_onnxruntime(case: str) -> None:
    nodes, shape = CASES[case]
    outputs = ["z", "z2"] if case == "two_pointwise_readers" else ["z"]
    data = _model(nodes, outputs, **shape)
    sess = _check(data, n=shape.get("n", 1))
    (handoff,) = _handoffs(sess)
    assert handoff.active()


def test_no_handoff_to_another_reader_or_a_graph_output() -> None:
    nodes = [*_dw("y", act="Relu"), _pw("y", "z", "pw"), helper.make_node("Neg", ["y"], ["n"])]
    assert _handoffs(_check(_model(nodes, ["z", "n"]))) == []
    nodes = [*_dw("y", act="Relu"), _pw("y", "z", "pw")]
    assert _handoffs(_check(_model(nodes, ["z", "y"]))) == []
    # a 1x1 conv of stride 2 reads its input through a strided slice: not a reader that takes channels-last
    nodes = [*_dw("y"), _pw("y", "z", "pw", stride=2)]
    assert _handoffs(_check(_model(nodes, ["z"]))) == []
    # a Mul whose product another node reads too
    nodes = [*_dw("y", act="Relu"), *_se("y"), helper.make_node("Neg", ["m"], ["n"])]
    assert _handoffs(_check(_model(nodes, ["z", "n"]))) == []


def test_a_reader_on_another_ep_gets_nchw() -> None:
    """The Mul of the squeeze-excitation block on the Example EP: the depthwise conv keeps its NCHW result."""
    data = _model([*_dw("y", act="Relu"), *_se("y")], ["z"])
    providers = [("ExampleExecutionProvider", {"ops": "Mul"}), "CPUExecutionProvider"]
    sess = _check(data, providers=providers)
    placed = {node: ep for ep, nodes in sess.get_partitions() for node in nodes}
    assert placed["dw"] == "CPUExecutionProvider" and "ExampleExecutionProvider" in placed.values()
    (handoff,) = _handoffs(sess)
    assert not handoff.active()


def test_global_average_pool_of_channels_last_memory() -> None:
    from epctx.providers.cpu.kernels import pool  # noqa: F401  (registers the kernel)
    from epctx.providers.cpu.registry import find_factory

    x = RNG.standard_normal((2, 5, 7, 16)).astype(np.float32)
    view = x.transpose(0, 3, 1, 2)  # (2, 16, 5, 7), channels-last memory
    factory = find_factory("", "GlobalAveragePool", 17)
    assert factory is not None
    graph = helper.make_graph(
        [helper.make_node("GlobalAveragePool", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, view.shape)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    expected = run_ort(model, {"x": np.ascontiguousarray(view)})[0]
    sess = epctx.InferenceSession(model.SerializeToString())
    np.testing.assert_allclose(sess.run(None, {"x": view})[0], expected, atol=1e-6)


def test_pointwise_conv_on_a_large_map_hands_over_to_a_depthwise_conv() -> None:
    """An expansion 1x1 conv (64x72 pixels, one image) writes channels-last for the depthwise conv after it;
    the same graph with a batch of two keeps NCHW there (the GEMM x^T W^T is for one image)."""
    for n in (1, 2):
        nodes = [
            helper.make_node("Conv", ["x", "e_w", "e_b"], ["e_pre"], name="expand"),
            helper.make_node("Relu", ["e_pre"], ["e"]),
            helper.make_node("Conv", ["e", "dw_w", "dw_b"], ["y"], group=C, pads=[1] * 4, name="dw"),
            _pw("y", "z", "pw"),
        ]
        inits = [_init("e_w", C, 16, 1, 1), _init("e_b", C), _init("dw_w", C, 1, 3, 3), _init("dw_b", C)]
        inits += [_init("pw_w", 24, C, 1, 1), _init("pw_b", 24)]
        graph = helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [n, 16, 64, 72])],
            [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, None)],
            inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        sess = epctx.InferenceSession(model.SerializeToString())
        x = RNG.standard_normal((n, 16, 64, 72)).astype(np.float32)
        ours = sess.run(None, {"x": x})[0]
        np.testing.assert_allclose(ours, run_ort(model, {"x": x})[0], atol=1e-4, rtol=1e-4)
        (expand,) = [v for node in sess.model.graph for v in node.outputs if v.name == "e"]
        assert layout.HANDOFFS[expand].active()
        plans = [p for p in _conv_plans(sess) if p.w_shape[0] == C and p.w_shape[1] == 16]
        assert [p.nhwc for p in plans] == ["pointwise" if n == 1 else ""]


def _conv_plans(sess: Any) -> list[Any]:
    """The Conv kernels' shape plans, from their closures (the kernels are plain functions)."""
    from epctx.providers.cpu.kernels.conv import _ConvPlan

    found = []
    for fn, *_ in sess._plan.steps:
        for cell in _closure_cells(fn):
            if isinstance(cell, dict):
                found += [p for p in cell.values() if isinstance(p, _ConvPlan)]
    return found


def _closure_cells(fn: Any) -> list[Any]:
    cells = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ())]
    inner = [c for c in cells if callable(c) and getattr(c, "__closure__", None)]
    return cells + [x for f in inner for x in _closure_cells(f)]


@pytest.mark.parametrize("act", ["HardSwish", None])
def test_first_conv_hands_over_to_a_depthwise_conv(act: str | None) -> None:
    """A network's first conv (3 channels, 3x3, stride 2, im2col) writes channels-last for the depthwise conv
    after it (cols^T W^T)."""
    first = [
        helper.make_node("Conv", ["x", "f_w", "f_b"], ["f_pre" if act else "f"], pads=[1] * 4, strides=[2, 2])
    ]
    if act:
        first.append(helper.make_node(act, ["f_pre"], ["f"]))
    nodes = [
        *first,
        helper.make_node("Conv", ["f", "dw_w", "dw_b"], ["y"], group=C, pads=[1] * 4, name="dw"),
        _pw("y", "z", "pw"),
    ]
    inits = [_init("f_w", C, 3, 3, 3), _init("f_b", C), _init("dw_w", C, 1, 3, 3), _init("dw_b", C)]
    inits += [_init("pw_w", 24, C, 1, 1), _init("pw_b", 24)]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 160, 150])],
        [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = epctx.InferenceSession(model.SerializeToString())
    x = RNG.standard_normal((1, 3, 160, 150)).astype(np.float32)
    ours = sess.run(None, {"x": x})[0]
    np.testing.assert_allclose(ours, run_ort(model, {"x": x})[0], atol=1e-4, rtol=1e-4)
    plans = [p for p in _conv_plans(sess) if p.w_shape[1] == 3]
    assert [p.nhwc for p in plans] == ["im2col"]


def test_residual_add_passes_channels_last_on(monkeypatch: pytest.MonkeyPatch, numpy_kernels: None) -> None:
    """dw -> 1x1 'proj' -> Add(residual) -> 1x1 'next': the projection reads channels-last and, its readers
    (the Add, then a 1x1 conv) taking it, writes channels-last as the GEMM x^T W^T; the Add's result is read
    by 'next' and is also a graph output (an NCHW array as onnxruntime's)."""
    nodes = [
        *_dw("y", act="Relu"),
        helper.make_node("Conv", ["y", "proj_w", "proj_b"], ["p"], name="proj"),
        helper.make_node("Add", ["p", "x"], ["a"]),
        helper.make_node("Conv", ["a", "next_w", "next_b"], ["z"], name="next"),
    ]
    inits = [_init("dw_w", C, 1, 3, 3), _init("dw_b", C), _init("proj_w", C, C, 1, 1), _init("proj_b", C)]
    inits += [_init("next_w", 24, C, 1, 1), _init("next_b", 24)]
    from epctx.providers.cpu.kernels import conv_direct

    ran: list[tuple[int, ...]] = []

    def spy(plan: Any, *args: Any, **kwargs: Any) -> Any:
        route = real(plan, *args, **kwargs)

        def spied(x: np.ndarray) -> Any:
            ran.append(plan.w_shape)
            return route(x)

        return spied

    real = conv_direct._channels_last
    monkeypatch.setattr(conv_direct, "_channels_last", spy)
    for outputs in (["z"], ["z", "a"]):
        ran.clear()
        graph = helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, C, 14, 18])],
            [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in outputs],
            inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        sess = _check(model.SerializeToString())
        values = {v.name: v for node in sess.model.graph for v in node.outputs}
        assert layout.HANDOFFS[values["y"]].active()
        assert (values["p"] in layout.HANDOFFS) == (outputs == ["z"])
        # the depthwise conv, then the projection when the Add is no graph output; in each of the two runs
        assert ran == 2 * ([(C, 1, 3, 3), (C, C, 1, 1)] if outputs == ["z"] else [(C, 1, 3, 3)])


def _weights(sess: Any) -> list[Any]:
    """The Conv kernels' Weights (kernels/conv_weights.py), from their closures."""
    from epctx.providers.cpu.kernels.conv_weights import Weights

    return [c for fn, *_ in sess._plan.steps for c in _closure_cells(fn) if isinstance(c, Weights)]


@pytest.mark.parametrize("bias", ["constant", "graph input"])
def test_first_conv_adds_a_constant_bias_in_its_gemm(bias: str, numpy_kernels: None) -> None:
    """The im2col conv handing over channels-last adds a constant bias in its GEMM (a row of ones under the
    columns, the bias a last weight column; with HardSwish the prescaled bias); a bias fed at run time is
    added after the GEMM, each run's own."""
    nodes = [
        helper.make_node("Conv", ["x", "f_w", "f_b"], ["f_pre"], pads=[1] * 4, strides=[2, 2]),
        helper.make_node("HardSwish", ["f_pre"], ["f"]),
        helper.make_node("Conv", ["f", "dw_w", "dw_b"], ["y"], group=C, pads=[1] * 4, name="dw"),
        _pw("y", "z", "pw"),
    ]
    inits = [_init("f_w", C, 3, 3, 3), _init("dw_w", C, 1, 3, 3), _init("dw_b", C)]
    inits += [_init("pw_w", 24, C, 1, 1), _init("pw_b", 24)]
    inputs = [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 160, 150])]
    if bias == "constant":
        inits.append(_init("f_b", C))
    else:
        inputs.append(helper.make_tensor_value_info("f_b", onnx.TensorProto.FLOAT, [C]))
    graph = helper.make_graph(
        nodes, "g", inputs, [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, None)], inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = epctx.InferenceSession(model.SerializeToString())
    for _ in range(2):  # a bias fed at run time differs from run to run
        feed = {"x": RNG.standard_normal((1, 3, 160, 150)).astype(np.float32)}
        if bias != "constant":
            feed["f_b"] = RNG.standard_normal(C).astype(np.float32)
        ours = sess.run(None, feed)[0]
        np.testing.assert_allclose(ours, run_ort(model, feed)[0], atol=1e-4, rtol=1e-4)
    assert [p.nhwc for p in _conv_plans(sess) if p.w_shape[1] == 3] == ["im2col"]
    first = [w for w in _weights(sess) if w.w is not None and w.w.shape[1] == 3]
    assert len(first) == 1
    assert ("w2_bias" in first[0].settled()[0]) == (bias == "constant")


@pytest.mark.parametrize(
    ("c", "k", "stride", "pads", "size"),
    [
        (3, 3, 2, [1, 1, 1, 1], (160, 150)),  # a network's first conv
        (3, 3, 2, [0, 0, 0, 0], (161, 151)),  # no padding, odd sizes
        (3, 3, 2, [1, 0, 0, 1], (160, 147)),  # asymmetric padding
        (1, 5, 2, [2, 2, 2, 2], (140, 133)),
        (2, 3, 3, [1, 2, 2, 1], (200, 190)),  # stride 3
        (1, 5, 2, [3, 3, 3, 3], (130, 130)),  # padding past the kernel's reach on one side
    ],
)
def test_strided_first_conv_columns_from_a_phase_split(
    c: int, k: int, stride: int, pads: list[int], size: tuple[int, int]
) -> None:
    """The im2col conv handing over channels-last builds a strided conv's columns from a phase split of its
    input (kernels/im2col.py): outputs as onnxruntime's for strides 2 and 3, odd sizes, asymmetric and large
    padding."""
    nodes = [
        helper.make_node("Conv", ["x", "f_w", "f_b"], ["f"], pads=pads, strides=[stride, stride]),
        helper.make_node("Conv", ["f", "dw_w", "dw_b"], ["y"], group=C, pads=[1] * 4, name="dw"),
        _pw("y", "z", "pw"),
    ]
    inits = [_init("f_w", C, c, k, k), _init("f_b", C), _init("dw_w", C, 1, 3, 3), _init("dw_b", C)]
    inits += [_init("pw_w", 24, C, 1, 1), _init("pw_b", 24)]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, c, *size])],
        [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = epctx.InferenceSession(model.SerializeToString())
    x = RNG.standard_normal((1, c, *size)).astype(np.float32)
    ours = sess.run(None, {"x": x})[0]
    np.testing.assert_allclose(ours, run_ort(model, {"x": x})[0], atol=1e-4, rtol=1e-4)
    assert [p.nhwc for p in _conv_plans(sess) if p.group == 1 and p.w_shape[1] == c] == ["im2col"]


def test_phase_columns_equal_the_window_view_columns() -> None:
    """kernels/im2col.py against the plain im2col copy, value for value, over strides and paddings."""
    from epctx.providers.cpu.kernels.im2col import phase_cols, phase_cols_fit
    from epctx.providers.cpu.kernels.windows import pad_input, spatial_geometry, window_view

    for stride, k, pads, size in [
        (2, 3, [1, 1, 1, 1], (9, 8)),
        (3, 5, [2, 0, 1, 3], (11, 13)),
        (2, 2, [0] * 4, (6, 7)),
    ]:
        x = RNG.standard_normal((1, 2, *size)).astype(np.float32)
        geo = spatial_geometry(size, (k, k), (stride, stride), (1, 1), pads, "NOTSET")
        assert phase_cols_fit(x.shape, geo)
        expected = np.ascontiguousarray(window_view(pad_input(x, geo), geo)).reshape(2 * k * k, -1)
        cols = np.full_like(expected, np.nan)
        phase_cols(x, geo, cols)
        np.testing.assert_array_equal(cols, expected)


@pytest.mark.parametrize("source", ["channels-last", "NCHW"])
def test_layout_copies_of_many_tiles(source: str) -> None:
    """depthwise.copy_in_tiles into the padded channels-last buffer (one copy, the source channels-last or an
    NCHW array seen channels-last) and back to NCHW (row tiles: the writes strided); the same values each way
    (sizes of many tiles)."""
    from epctx.providers.cpu.kernels.depthwise import _TILE_VALUES, copy_in_tiles

    x = RNG.standard_normal((1, 24, 60, 50)).astype(np.float32)  # (N, C, H, W)
    assert x.size > 4 * _TILE_VALUES
    src = (
        np.ascontiguousarray(x.transpose(0, 2, 3, 1))
        if source == "channels-last"
        else x.transpose(0, 2, 3, 1)
    )
    buf = np.zeros((1, 62, 52, 24), np.float32)
    copy_in_tiles(buf[:, 1:61, 1:51], src)
    np.testing.assert_array_equal(buf[:, 1:61, 1:51], x.transpose(0, 2, 3, 1))
    assert not buf[:, 0].any() and not buf[:, :, 0].any() and not buf[:, 61].any() and not buf[:, :, 51].any()
    back = np.empty_like(x)
    copy_in_tiles(back.transpose(0, 2, 3, 1), buf[:, 1:61, 1:51])
    np.testing.assert_array_equal(back, x)


@pytest.mark.parametrize("stride", [1, 2])
def test_padded_buffers_are_reused_with_their_padding_zero(stride: int) -> None:
    """A depthwise conv's padded buffer goes back to depthwise._PADDED with its padding zero and the next call
    (of this conv, or of another of the same geometry: two sessions here) writes only where its input lands:
    runs on different inputs, alternating between the sessions, match onnxruntime each time."""
    from epctx.providers.cpu.kernels import depthwise

    model = _model([*_dw("y", stride=stride, k=5), _pw("y", "z", "pw")], ["z"], k=5)
    sessions = [epctx.InferenceSession(model) for _ in range(2)]
    for step in range(4):
        x = RNG.standard_normal((1, C, 14, 18)).astype(np.float32) + step
        ours = sessions[step % 2].run(None, {"x": x})[0]
        np.testing.assert_allclose(ours, run_ort(model, {"x": x})[0], atol=1e-4, rtol=1e-4)
        kept = [b for bufs in depthwise._PADDED._free.values() for b in bufs if b.shape[-1] == C]
        assert kept  # given back for the next call
