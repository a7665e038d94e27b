"""Own CPU kernels for LSTM/GRU/RNN and the quantization ops against onnxruntime (CPU).

Single-node models are built with onnx.helper and run on both runtimes (tests/oracle.py). onnxruntime has no
batch-major (``layout=1``) recurrent kernels, so those cases compare with onnxruntime running the same data
in ``layout=0`` and transposed. Quantized outputs must match exactly (rounding ties, saturation, NaN).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper

from epctx.providers.cpu.registry import find_factory
from tests.oracle import assert_matches_ort, graph_inputs_for, run_epctx, run_ort

pytest.importorskip("onnxruntime")

F32 = np.float32


def _model(
    op: str,
    opset: int,
    inputs: Sequence[Any],
    attrs: dict[str, Any] | None = None,
    outputs: Sequence[tuple[str, Any, int | None]] = (),
    *,
    const: Sequence[int] = (),
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A one-node model. ``inputs``: arrays or None (omitted); ``outputs``: (name or "", dtype, rank)."""
    names, graph_inputs, inits, feeds = graph_inputs_for(inputs, const)
    graph_outputs = [
        helper.make_tensor_value_info(
            name,
            helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
            None if rank is None else [f"{name}_{i}" for i in range(rank)],
        )
        for name, dtype, rank in outputs
        if name
    ]
    node = helper.make_node(op, names, [name for name, _, _ in outputs], **(attrs or {}))
    graph = helper.make_graph([node], "g", graph_inputs, graph_outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return model, feeds


def _check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], atol: float = 1e-5) -> list[Any]:
    """Compare with onnxruntime, and check that the kernel left its inputs untouched."""
    before = {k: v.copy() for k, v in feeds.items()}
    out = assert_matches_ort(model, feeds, atol=atol, rtol=atol)
    for k, v in feeds.items():
        np.testing.assert_array_equal(v, before[k], err_msg=f"input {k} was modified")
    return out


@pytest.mark.parametrize(
    ("op", "opset"),
    [
        ("LSTM", 7),
        ("LSTM", 14),
        ("LSTM", 22),
        ("GRU", 7),
        ("GRU", 14),
        ("RNN", 14),
        ("QuantizeLinear", 10),
        ("QuantizeLinear", 21),
        ("QuantizeLinear", 25),
        ("DequantizeLinear", 13),
        ("DequantizeLinear", 21),
        ("DynamicQuantizeLinear", 11),
        ("MatMulInteger", 10),
        ("ConvInteger", 10),
        ("QLinearMatMul", 10),
        ("QLinearMatMul", 21),
        ("QLinearConv", 10),
    ],
)
def test_own_kernel_registered(op: str, opset: int) -> None:
    import epctx.providers.cpu.kernels  # noqa: F401  (importing registers the kernels)

    factory = find_factory("", op, opset)
    assert factory is not None
    assert factory.__module__.startswith("epctx.providers.cpu.kernels.")


# ----------------------------------------------------------------------------------------------------
# Recurrent ops

_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
S, B, I, H = 5, 3, 4, 6


def _rnn_inputs(
    op: str,
    nd: int,
    rng: np.random.Generator,
    *,
    bias: bool = True,
    lens: Any = None,
    init: bool = True,
    peep: bool = False,
    scale: float = 0.5,
) -> list[Any]:
    g = _GATES[op]
    ins: list[Any] = [
        rng.standard_normal((S, B, I)).astype(F32),
        (rng.standard_normal((nd, g * H, I)) * scale).astype(F32),
        (rng.standard_normal((nd, g * H, H)) * scale).astype(F32),
        rng.standard_normal((nd, 2 * g * H)).astype(F32) * scale if bias else None,
        None if lens is None else np.asarray(lens, dtype=np.int32),
        rng.standard_normal((nd, B, H)).astype(F32) if init else None,
    ]
    if op == "LSTM":
        ins.append(rng.standard_normal((nd, B, H)).astype(F32) if init else None)
        ins.append(rng.standard_normal((nd, 3 * H)).astype(F32) if peep else None)
    while ins[-1] is None:
        ins.pop()
    return ins


def _rnn_outputs(op: str, names: Sequence[str] = ("y", "y_h", "y_c")) -> list[tuple[str, Any, int]]:
    n = 3 if op == "LSTM" else 2
    return [(name, F32, 4 if k == 0 else 3) for k, name in enumerate(names[:n])]


_LENS = {"full": None, "short": [5, 2, 3], "zero": [0, 5, 1], "all_short": [3, 1, 2]}


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("lens", list(_LENS))
def test_rnn_directions_and_lengths(op: str, direction: str, lens: str) -> None:
    rng = np.random.default_rng(hash((op, direction, lens)) % 2**32)
    nd = 2 if direction == "bidirectional" else 1
    ins = _rnn_inputs(op, nd, rng, lens=_LENS[lens])
    model, feeds = _model(op, 14, ins, {"hidden_size": H, "direction": direction}, _rnn_outputs(op))
    _check(model, feeds, atol=1e-5)


@pytest.mark.parametrize(
    ("op", "attrs", "kwargs"),
    [
        ("LSTM", {}, {"bias": False, "init": False}),
        ("LSTM", {"clip": 0.7}, {}),
        ("LSTM", {}, {"peep": True}),
        ("LSTM", {}, {"peep": True, "init": False, "bias": False}),
        ("LSTM", {"clip": 0.5}, {"peep": True, "lens": [4, 5, 2]}),
        ("LSTM", {"input_forget": 1}, {}),
        ("LSTM", {"input_forget": 1}, {"peep": True}),
        ("GRU", {}, {"bias": False, "init": False}),
        ("GRU", {"linear_before_reset": 1}, {}),
        ("GRU", {"linear_before_reset": 1}, {"bias": False}),
        ("GRU", {"linear_before_reset": 1, "clip": 0.3}, {"lens": [1, 5, 3]}),
        ("GRU", {"clip": 0.3}, {}),
        ("RNN", {}, {"bias": False, "init": False}),
        ("RNN", {"clip": 0.4}, {"lens": [2, 3, 5]}),
    ],
)
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_rnn_options(op: str, attrs: dict[str, Any], kwargs: dict[str, Any], direction: str) -> None:
    rng = np.random.default_rng(7)
    nd = 2 if direction == "bidirectional" else 1
    ins = _rnn_inputs(op, nd, rng, **kwargs)
    model, feeds = _model(op, 14, ins, {"hidden_size": H, "direction": direction, **attrs}, _rnn_outputs(op))
    _check(model, feeds, atol=1e-5)


_ACTS = [
    "Sigmoid",
    "Tanh",
    "Relu",
    "HardSigmoid",
    "LeakyRelu",
    "Affine",
    "ThresholdedRelu",
    "ScaledTanh",
    "Elu",
    "Softsign",
    "Softplus",
]


@pytest.mark.parametrize("act", _ACTS)
@pytest.mark.parametrize(
    ("op", "slot"), [("LSTM", 0), ("LSTM", 1), ("LSTM", 2), ("GRU", 0), ("GRU", 1), ("RNN", 0)]
)
@pytest.mark.parametrize("args", ["none", "full", "short"])
def test_rnn_activations(act: str, op: str, slot: int, args: str) -> None:
    rng = np.random.default_rng(3)
    defaults = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}[op]
    acts = list(defaults)
    acts[slot] = act
    attrs: dict[str, Any] = {"hidden_size": H, "direction": "bidirectional", "activations": acts * 2}
    if args == "full":
        attrs["activation_alpha"] = [0.3, 0.6, 0.2, 0.8]
        attrs["activation_beta"] = [0.4, 0.1, 0.5, 0.7]
    elif args == "short":  # the second direction falls back to onnxruntime's per-activation defaults
        attrs["activation_alpha"] = [0.7]
    ins = _rnn_inputs(op, 2, rng, scale=0.3)
    model, feeds = _model(op, 14, ins, attrs, _rnn_outputs(op))
    _check(model, feeds, atol=1e-4)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize(
    "names",
    [("", "y_h", "y_c"), ("y", "", "y_c"), ("y", "y_h", ""), ("", "", "y_c"), ("y",), ("", "y_h")],
)
def test_rnn_omitted_outputs(op: str, names: tuple[str, ...]) -> None:
    rng = np.random.default_rng(5)
    outs = _rnn_outputs(op, names)
    if not any(name for name, _, _ in outs):
        pytest.skip("no output left")
    ins = _rnn_inputs(op, 2, rng, lens=[3, 5, 1])
    model, feeds = _model(op, 14, ins, {"hidden_size": H, "direction": "bidirectional"}, outs)
    _check(model, feeds, atol=1e-5)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("lens", ["full", "short"])
def test_rnn_batch_major_layout(op: str, direction: str, lens: str) -> None:
    """layout=1 on epctx equals onnxruntime's layout=0 on transposed data (onnxruntime lacks layout=1)."""
    rng = np.random.default_rng(11)
    nd = 2 if direction == "bidirectional" else 1
    ins = _rnn_inputs(op, nd, rng, lens=_LENS[lens])
    attrs = {"hidden_size": H, "direction": direction}
    ref_model, ref_feeds = _model(op, 14, ins, attrs, _rnn_outputs(op))
    expected = run_ort(ref_model, ref_feeds)
    batch_major = list(ins)
    batch_major[0] = np.ascontiguousarray(ins[0].transpose(1, 0, 2))
    for k in (5, 6):
        if k < len(ins) and ins[k] is not None:
            batch_major[k] = np.ascontiguousarray(ins[k].transpose(1, 0, 2))
    model, feeds = _model(op, 14, batch_major, {**attrs, "layout": 1}, _rnn_outputs(op))
    got = run_epctx(model, feeds)
    np.testing.assert_allclose(got[0], expected[0].transpose(2, 0, 1, 3), atol=1e-5, rtol=1e-5)
    for a, b in zip(got[1:], expected[1:]):
        assert a.dtype == b.dtype
        np.testing.assert_allclose(a, b.transpose(1, 0, 2), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_rnn_constant_weights_opset7(op: str) -> None:
    rng = np.random.default_rng(13)
    ins = _rnn_inputs(op, 1, rng, lens=[5, 4, 5])
    model, feeds = _model(op, 7, ins, {"hidden_size": H}, _rnn_outputs(op), const=(1, 2, 3))
    _check(model, feeds, atol=1e-5)


def test_lstm_inside_if() -> None:
    """The silero-vad pattern: LSTM in an If branch, weights from the outer graph's initializers."""
    rng = np.random.default_rng(17)
    w = (rng.standard_normal((1, 4 * H, I)) * 0.5).astype(F32)
    r = (rng.standard_normal((1, 4 * H, H)) * 0.5).astype(F32)
    b = (rng.standard_normal((1, 8 * H)) * 0.5).astype(F32)
    outputs = [helper.make_tensor_value_info("h", onnx.TensorProto.FLOAT, [1, B, H])]

    def branch(name: str, direction: str) -> onnx.GraphProto:
        node = helper.make_node(
            "LSTM", ["x", "W", "R", "B", "", "h0", "c0"], ["", "h", ""], hidden_size=H, direction=direction
        )
        return helper.make_graph([node], name, [], outputs)

    if_node = helper.make_node(
        "If", ["cond"], ["h"], then_branch=branch("then", "forward"), else_branch=branch("else", "reverse")
    )
    graph = helper.make_graph(
        [if_node],
        "g",
        [
            helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [S, B, I]),
            helper.make_tensor_value_info("h0", onnx.TensorProto.FLOAT, [1, B, H]),
            helper.make_tensor_value_info("c0", onnx.TensorProto.FLOAT, [1, B, H]),
        ],
        outputs,
        initializer=[onnx.numpy_helper.from_array(v, n) for n, v in (("W", w), ("R", r), ("B", b))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])
    for cond in (True, False):
        feeds = {
            "cond": np.array(cond),
            "x": rng.standard_normal((S, B, I)).astype(F32),
            "h0": rng.standard_normal((1, B, H)).astype(F32),
            "c0": rng.standard_normal((1, B, H)).astype(F32),
        }
        _check(model, feeds, atol=1e-5)


# ----------------------------------------------------------------------------------------------------
# QuantizeLinear / DequantizeLinear / DynamicQuantizeLinear

# Ties at .5 on both sides of zero and of every saturation bound, huge values, NaN and infinities.
_SPECIAL = np.array(
    [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, -3.5, 126.5, 127.5, 128.5, -127.5, -128.5, -129.5, 254.5, 255.5]
    + [256.5, 32766.5, 32767.5, -32768.5, 65534.5, 65535.5, 1e10, -1e10, np.nan, np.inf, -np.inf, 0.0, -0.0],
    dtype=F32,
)
_INT_TYPES = [np.int8, np.uint8, np.int16, np.uint16]


def _quant_input(rng: np.random.Generator, n: int = 300) -> np.ndarray:
    return np.concatenate([_SPECIAL, (rng.standard_normal(n) * 300).astype(F32)])


@pytest.mark.parametrize("qtype", _INT_TYPES)
@pytest.mark.parametrize("opset", [10, 13, 19, 21, 23, 25])
@pytest.mark.parametrize(("scale", "zp"), [(1.0, 0), (1.0, 3), (0.37, 5), (2.0, 0)])
def test_quantize_per_tensor(qtype: Any, opset: int, scale: float, zp: int) -> None:
    if opset < 21 and qtype in (np.int16, np.uint16):
        pytest.skip("16-bit quantization arrived in opset 21")
    x = _quant_input(np.random.default_rng(opset))
    model, feeds = _model(
        "QuantizeLinear", opset, [x, F32(scale), np.array(zp, qtype)], {}, [("y", qtype, 1)]
    )
    _check(model, feeds)


@pytest.mark.parametrize(
    ("opset", "attrs", "qtype"),
    [
        (10, {}, np.uint8),
        (13, {}, np.uint8),
        (21, {"output_dtype": 3}, np.int8),
        (21, {"output_dtype": 5}, np.int16),
    ],
)
def test_quantize_without_zero_point(opset: int, attrs: dict[str, Any], qtype: Any) -> None:
    x = _quant_input(np.random.default_rng(1))
    model, feeds = _model("QuantizeLinear", opset, [x, F32(0.5)], attrs, [("y", qtype, 1)])
    _check(model, feeds)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("qtype", [np.uint8, np.int8])
@pytest.mark.parametrize("const", [(), (1, 2)])
def test_quantize_dequantize_per_axis(axis: int, qtype: Any, const: tuple[int, ...]) -> None:
    rng = np.random.default_rng(axis + 10)
    x = (rng.standard_normal((2, 3, 4, 5)) * 50).astype(F32)
    dim = x.shape[axis]
    scale = (rng.random(dim) + 0.1).astype(F32)
    zp = rng.integers(0, 20, dim).astype(qtype)
    model, feeds = _model(
        "QuantizeLinear", 13, [x, scale, zp], {"axis": axis}, [("y", qtype, 4)], const=const
    )
    _check(model, feeds)
    info = np.iinfo(qtype)
    xq = rng.integers(info.min, info.max, x.shape, endpoint=True).astype(qtype)
    model, feeds = _model(
        "DequantizeLinear", 13, [xq, scale, zp], {"axis": axis}, [("y", F32, 4)], const=const
    )
    _check(model, feeds)


@pytest.mark.parametrize(("axis", "block"), [(1, 2), (3, 2), (-1, 3), (0, 2), (2, 4)])
@pytest.mark.parametrize("with_zp", [True, False])
def test_quantize_dequantize_blocked(axis: int, block: int, with_zp: bool) -> None:
    rng = np.random.default_rng(block * 10 + axis)
    x = (rng.standard_normal((2, 3, 4, 5)) * 50).astype(F32)
    shape = list(x.shape)
    shape[axis] = -(-shape[axis] // block)
    scale = (rng.random(shape) + 0.1).astype(F32)
    zp = rng.integers(-10, 10, shape).astype(np.int8) if with_zp else None
    attrs = {"axis": axis, "block_size": block}
    if with_zp:
        model, feeds = _model("QuantizeLinear", 21, [x, scale, zp], attrs, [("y", np.int8, 4)])
        _check(model, feeds)
    xq = rng.integers(-128, 127, x.shape).astype(np.int8)
    model, feeds = _model("DequantizeLinear", 21, [xq, scale, zp], attrs, [("y", F32, 4)])
    _check(model, feeds)


@pytest.mark.parametrize("opset", [19, 21])
@pytest.mark.parametrize("qtype", [np.int8, np.uint8])
def test_quantize_float16(opset: int, qtype: Any) -> None:
    rng = np.random.default_rng(opset)
    x = np.concatenate([_SPECIAL[:16], rng.standard_normal(2000) * 20]).astype(np.float16)
    for scale in (np.float16(1.0), np.float16(0.1), np.float16(rng.random() + 0.05)):
        model, feeds = _model("QuantizeLinear", opset, [x, scale, np.array(4, qtype)], {}, [("y", qtype, 1)])
        _check(model, feeds)


@pytest.mark.parametrize("xtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32])
@pytest.mark.parametrize("opset", [10, 13, 19, 21, 23])
@pytest.mark.parametrize("stype", [np.float32, np.float16])
def test_dequantize_per_tensor(xtype: Any, opset: int, stype: Any) -> None:
    if (xtype in (np.int16, np.uint16) and opset < 21) or (stype == np.float16 and opset < 19):
        pytest.skip("type not in this opset")
    info = np.iinfo(xtype)
    rng = np.random.default_rng(opset)
    x = rng.integers(info.min, info.max, 500, endpoint=True).astype(xtype)
    x[:2] = info.min, info.max
    zp = np.array(0 if xtype == np.int32 else 7, xtype)
    out = [("y", stype, 1)]
    if xtype == np.int32 and stype == np.float16:
        x = x // 2**16  # keep within float16 range
    model, feeds = _model("DequantizeLinear", opset, [x, stype(0.0123), zp], {}, out)
    _check(model, feeds, atol=0)
    model, feeds = _model("DequantizeLinear", opset, [x, stype(0.25)], {}, out)
    if xtype not in (np.int16, np.uint16):  # onnxruntime needs the zero point to bind 16-bit types
        _check(model, feeds, atol=0)


_I4 = ml_dtypes.int4
_F8 = ml_dtypes.float8_e4m3fn


@pytest.mark.parametrize(
    ("op", "inputs", "attrs", "out_type"),
    [
        ("QuantizeLinear", [np.array([0.5, -3.25, 100.0, 1e6], F32), F32(0.5)], {"output_dtype": 17}, _F8),
        ("QuantizeLinear", [np.array([0.5, -3.25, 9.0, -20.0], F32), F32(0.5), np.array(1, _I4)], {}, _I4),
        ("DequantizeLinear", [np.array([1, 2.5, -3, 448], _F8), F32(0.5)], {}, F32),
        ("DequantizeLinear", [np.array([1, -2, 3, -8], _I4), F32(0.5), np.array(1, _I4)], {}, F32),
    ],
)
def test_float8_int4_fall_back_to_reference(
    op: str, inputs: list[Any], attrs: dict[str, Any], out_type: Any
) -> None:
    """Types numpy lacks go to onnx.reference (onnxruntime's Python API cannot feed them)."""
    from onnx.reference import ReferenceEvaluator

    model, feeds = _model(op, 21, inputs, attrs, [("y", out_type, 1)])
    got = run_epctx(model, feeds)[0]
    expected = ReferenceEvaluator(model).run(None, feeds)[0]
    assert got.dtype == expected.dtype == np.dtype(out_type)
    np.testing.assert_array_equal(got.astype(F32), expected.astype(F32))


@pytest.mark.parametrize(
    "x",
    [
        np.array([[1.0, 2.5, -3.25], [0.0, 7.75, -0.5]], dtype=F32),
        np.array([0.5, 1.5, 2.0], dtype=F32),
        np.array([-0.5, -1.5, -2.0], dtype=F32),
        np.zeros((2, 3), dtype=F32),
        np.array([3.0, 3.0], dtype=F32),
        np.random.default_rng(0).standard_normal((4, 5, 6)).astype(F32) * 13 + 2,
        np.random.default_rng(1).standard_normal(1000).astype(F32) * 0.01 - 0.3,
    ],
)
def test_dynamic_quantize(x: np.ndarray) -> None:
    model, feeds = _model(
        "DynamicQuantizeLinear", 11, [x], {}, [("y", np.uint8, x.ndim), ("s", F32, 0), ("z", np.uint8, 0)]
    )
    _check(model, feeds, atol=0)


# ----------------------------------------------------------------------------------------------------
# Integer matmul / conv


def _ints(rng: np.random.Generator, shape: Any, dtype: Any) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)


_PAIRS = [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)]
_MM_SHAPES = [
    ((4, 7), (7, 5)),
    ((2, 4, 300), (300, 5)),
    ((2, 4, 7), (2, 7, 5)),
    ((7,), (7, 5)),
    ((3, 1, 4, 7), (2, 7, 5)),
]


@pytest.mark.parametrize(("at", "bt"), [*_PAIRS, (np.int8, np.uint8)])
@pytest.mark.parametrize(("sa", "sb"), _MM_SHAPES)
@pytest.mark.parametrize("zps", ["none", "scalar", "per_column", "const_b"])
def test_matmul_integer(at: Any, bt: Any, sa: Any, sb: Any, zps: str) -> None:
    rng = np.random.default_rng(len(sa) * 10 + len(sb))
    a, b = _ints(rng, sa, at), _ints(rng, sb, bt)
    ins: list[Any] = [a, b]
    const: tuple[int, ...] = ()
    if zps != "none":
        ins += [np.array(3, at), np.array(5, bt)]
    if zps in ("per_column", "const_b"):
        if len(sb) != 2:
            pytest.skip("onnxruntime takes per-column zero points of 2-D B only")
        ins[3] = _ints(rng, (sb[-1],), bt)
        const = (1, 3) if zps == "const_b" else ()
    rank = max(len(sa), len(sb)) - (len(sa) == 1)
    model, feeds = _model("MatMulInteger", 10, ins, {}, [("y", np.int32, rank)], const=const)
    _check(model, feeds)


@pytest.mark.parametrize(
    ("at", "bt", "av", "bv"), [(np.uint8, np.uint8, 255, 255), (np.int8, np.int8, -128, -128)]
)
@pytest.mark.parametrize("k", [200, 1000, 5000])
def test_matmul_integer_extremes(at: Any, bt: Any, av: int, bv: int, k: int) -> None:
    """Sums past 2**24 must stay exact (the float32 fast path may only run where it provably is)."""
    a = np.full((3, k), av, dtype=at)
    b = np.full((k, 4), bv, dtype=bt)
    b[0, 0] = 1
    model, feeds = _model("MatMulInteger", 10, [a, b], {}, [("y", np.int32, 2)], const=(1,))
    out = _check(model, feeds)
    assert int(out[0][0, 1]) == av * bv * k


@pytest.mark.parametrize("opset", [10, 21])
@pytest.mark.parametrize(("at", "bt"), _PAIRS)
@pytest.mark.parametrize(("sa", "sb"), _MM_SHAPES[:3])
@pytest.mark.parametrize("mode", ["tensor", "const_b", "per_column"])
def test_qlinear_matmul(opset: int, at: Any, bt: Any, sa: Any, sb: Any, mode: str) -> None:
    rng = np.random.default_rng(opset + len(sa))
    for _ in range(3):
        b_scale: Any = F32(rng.random() * 0.05 + 0.001)
        b_zp = np.array(rng.integers(0, 10) if bt == np.uint8 else 0, bt)
        if mode == "per_column":
            if len(sb) != 2:
                pytest.skip("onnxruntime takes per-column parameters of 2-D B only")
            b_scale = (rng.random(sb[-1]) * 0.05 + 0.001).astype(F32)
            b_zp = np.full(sb[-1], b_zp, dtype=bt)
        ins = [
            _ints(rng, sa, at),
            F32(rng.random() * 0.05 + 0.001),
            np.array(rng.integers(0, 10), at),
            _ints(rng, sb, bt),
            b_scale,
            b_zp,
            F32(rng.random() * 0.5 + 0.01),
            np.array(rng.integers(0, 20), at),
        ]
        const = (3, 4, 5) if mode == "const_b" else ()
        model, feeds = _model(
            "QLinearMatMul", opset, ins, {}, [("y", at, max(len(sa), len(sb)))], const=const
        )
        _check(model, feeds)


_CONV_CASES = [
    ({}, (1, 3, 7, 7), (4, 3, 3, 3)),
    ({"pads": [1, 1, 1, 1]}, (2, 3, 6, 5), (4, 3, 3, 3)),
    ({"strides": [2, 2], "pads": [0, 1, 2, 1], "dilations": [1, 2]}, (1, 4, 9, 9), (6, 4, 3, 3)),
    ({"group": 2}, (1, 4, 9, 9), (6, 2, 3, 3)),
    ({"group": 3}, (1, 3, 5, 5), (3, 1, 3, 3)),
    ({"auto_pad": "SAME_UPPER", "strides": [2, 2]}, (1, 3, 8, 7), (2, 3, 3, 3)),
    ({"auto_pad": "SAME_LOWER"}, (1, 3, 8, 7), (2, 3, 2, 2)),
    ({}, (1, 3, 10), (2, 3, 3)),
    ({"pads": [1, 0, 0, 0, 1, 1]}, (1, 2, 4, 5, 3), (2, 2, 2, 2, 2)),
    ({"pads": [1, 1, 1, 1]}, (1, 64, 5, 6), (3, 64, 3, 3)),  # K = 576: float64 sums for 8-bit extremes
]


@pytest.mark.parametrize(("xt", "wt"), _PAIRS)
@pytest.mark.parametrize(("attrs", "xs", "ws"), _CONV_CASES)
@pytest.mark.parametrize("zps", [True, False])
def test_conv_integer(xt: Any, wt: Any, attrs: dict[str, Any], xs: Any, ws: Any, zps: bool) -> None:
    rng = np.random.default_rng(len(xs) + ws[0])
    ins: list[Any] = [_ints(rng, xs, xt), _ints(rng, ws, wt)]
    if zps:
        ins += [np.array(7, xt), np.array(3, wt)]
    model, feeds = _model("ConvInteger", 10, ins, attrs, [("y", np.int32, len(xs))])
    _check(model, feeds)


@pytest.mark.parametrize(("xt", "wt"), _PAIRS)
@pytest.mark.parametrize(("attrs", "xs", "ws"), _CONV_CASES)
@pytest.mark.parametrize("mode", ["tensor", "per_channel", "no_bias", "const"])
def test_qlinear_conv(xt: Any, wt: Any, attrs: dict[str, Any], xs: Any, ws: Any, mode: str) -> None:
    rng = np.random.default_rng(len(xs) * 7 + ws[0])
    m = ws[0]
    for _ in range(2):
        w_scale: Any = F32(rng.random() * 0.05 + 0.001)
        if mode in ("per_channel", "const"):
            w_scale = (rng.random(m) * 0.05 + 0.001).astype(F32)
        ins = [
            _ints(rng, xs, xt),
            F32(rng.random() * 0.05 + 0.001),
            np.array(rng.integers(0, 10), xt),
            _ints(rng, ws, wt),
            w_scale,
            np.array(rng.integers(0, 10) if wt == np.uint8 else 0, wt),
            F32(rng.random() * 0.5 + 0.05),
            np.array(rng.integers(0, 20), xt),
            None if mode == "no_bias" else rng.integers(-2000, 2000, m).astype(np.int32),
        ]
        const = (3, 4, 5, 8) if mode == "const" else ()
        model, feeds = _model("QLinearConv", 10, ins, attrs, [("y", xt, len(xs))], const=const)
        _check(model, feeds)
