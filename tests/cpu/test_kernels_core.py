"""Own CPU kernels of the hot general ops (elementwise, linalg, tensor, reduce) against onnxruntime (CPU).

Every case is a one-node model built with onnx.helper; inputs listed in ``const`` become initializers (so
the kernels' constant-folding paths at factory time are exercised too). Output value infos come from a
first onnxruntime run, so each case only states its inputs and attributes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper

import epctx.providers.cpu.kernels  # noqa: F401  (registers the own kernels)
from epctx.errors import Fail
from epctx.providers.cpu.registry import find_factory
from tests.oracle import assert_matches_ort, graph_inputs_for, run_ort

pytest.importorskip("onnxruntime")

F32 = np.float32
I32 = np.int32
I64 = np.int64
RNG = np.random.default_rng(1234)


def _f(*shape: int, lo: float = -3.0, hi: float = 3.0, dtype: Any = F32) -> np.ndarray:
    return RNG.uniform(lo, hi, size=shape).astype(dtype)


def _i(*shape: int, lo: int = -5, hi: int = 6, dtype: Any = I32) -> np.ndarray:
    return RNG.integers(lo, hi, size=shape).astype(dtype)


def _model(
    op: str,
    opset: int,
    inputs: Sequence[Any],
    attrs: dict[str, Any] | None,
    n_outputs: int,
    const: Sequence[int],
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    names, graph_inputs, inits, feeds = graph_inputs_for(inputs, const)
    out_names = [f"out{k}" for k in range(n_outputs)]
    node = helper.make_node(op, names, out_names, **(attrs or {}))

    def build(outputs: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
        graph = helper.make_graph([node], "g", graph_inputs, outputs, initializer=inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])

    # onnxruntime accepts outputs without a type: its results give the value infos epctx's checker wants.
    probe = run_ort(build([helper.make_empty_tensor_value_info(n) for n in out_names]), feeds)
    outputs = [
        helper.make_tensor_value_info(
            n, helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype), [f"{n}_{i}" for i in range(np.ndim(v))]
        )
        for n, v in zip(out_names, probe)
    ]
    return build(outputs), feeds


def _check(
    op: str,
    opset: int,
    inputs: Sequence[Any],
    attrs: dict[str, Any] | None = None,
    *,
    n_outputs: int = 1,
    const: Sequence[int] = (),
    rtol: float = 1e-6,
    atol: float = 1e-6,
    own: bool = True,
) -> None:
    if own:
        assert find_factory("", op, opset) is not None, f"{op} opset {opset} has no own kernel"
    model, feeds = _model(op, opset, inputs, attrs, n_outputs, const)
    assert_matches_ort(model, feeds, rtol=rtol, atol=atol)


def _case(op: str, opset: int, inputs: Sequence[Any], attrs: dict[str, Any] | None = None, **kw: Any) -> Any:
    name = "-".join([op, str(opset), *(f"{k}={v}" for k, v in (attrs or {}).items() if k != "value")])
    return pytest.param(op, opset, inputs, attrs, kw, id=name[:90])


def _run_cases(cases: list[Any]) -> Any:
    return pytest.mark.parametrize(("op", "opset", "inputs", "attrs", "kw"), cases)


# ------------------------------------------------------------------------------------------ unary
_POS = _f(3, 4, lo=0.05, hi=4.0)
_UNIT = _f(3, 4, lo=-0.95, hi=0.95)
_X = _f(3, 4, 5)
_UNARY_CASES = [
    *(_case(op, 13, [_X]) for op in ["Abs", "Neg", "Exp", "Floor", "Ceil", "Sign", "Tanh", "Erf", "Relu"]),
    *(_case(op, 13, [_X]) for op in ["Sigmoid", "Softsign", "Softplus", "Sin", "Cos", "Tan", "Atan"]),
    *(_case(op, 13, [_X]) for op in ["Sinh", "Cosh", "Asinh", "Reciprocal", "IsNaN"]),
    *(_case(op, 13, [_POS]) for op in ["Log", "Sqrt"]),
    *(_case(op, 13, [_UNIT]) for op in ["Asin", "Acos", "Atanh"]),
    _case("Acosh", 13, [_f(3, 4, lo=1.0, hi=5.0)]),
    _case("Round", 11, [np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.4, -0.6], F32)]),
    _case("Erf", 13, [np.linspace(-6, 6, 501).astype(F32)]),
    _case("Sigmoid", 13, [np.array([-100.0, -20.0, 0.0, 20.0, 100.0], F32)]),
    _case("Softplus", 13, [np.array([-100.0, -20.0, 0.0, 20.0, 100.0], F32)]),
    _case("Mish", 18, [_X]),
    _case("Abs", 13, [_i(3, 4, dtype=np.int8)]),
    _case("Neg", 13, [_i(3, 4, dtype=I64)]),
    _case("Sign", 13, [_i(3, 4)]),
    _case("Relu", 14, [_i(3, 4)]),
    _case("Relu", 6, [_X]),
    _case("Exp", 13, [_f(3, 4, dtype=np.float64)]),
    _case("Sqrt", 13, [_f(3, 4, lo=0.0, hi=2.0, dtype=np.float16)], rtol=1e-3),
    _case("Not", 1, [RNG.random((3, 4)) > 0.5]),
    _case("BitwiseNot", 18, [_i(3, 4)]),
    _case("BitwiseNot", 18, [_i(3, 4, lo=0, hi=255, dtype=np.uint8)]),
    _case("IsNaN", 13, [np.array([1.0, np.nan, np.inf, -np.inf], F32)]),
    *(
        _case("IsInf", 10, [np.array([1.0, np.nan, np.inf, -np.inf], F32)], a)
        for a in [{}, {"detect_negative": 0}, {"detect_positive": 0}]
    ),
    _case("LeakyRelu", 16, [_X]),
    _case("LeakyRelu", 6, [_X], {"alpha": 0.3}),
    _case("Elu", 6, [_X], {"alpha": 0.5}),
    _case("Selu", 6, [_X]),
    _case("Selu", 6, [_X], {"alpha": 1.5, "gamma": 2.0}),
    _case("Celu", 12, [_X], {"alpha": 2.0}),
    _case("HardSigmoid", 6, [_X]),
    _case("HardSigmoid", 6, [_X], {"alpha": 0.3, "beta": 0.4}),
    _case("HardSwish", 14, [_X]),
    _case("ThresholdedRelu", 10, [_X], {"alpha": 0.5}),
    _case("Shrink", 9, [_X], {"lambd": 1.0, "bias": 0.5}),
    _case("Gelu", 20, [_X]),
    _case("Gelu", 20, [_X], {"approximate": "tanh"}),
    _case("PRelu", 16, [_X, _f(5)]),
    _case("PRelu", 9, [_X, _f(4, 1)], const=[1]),
    _case("PRelu", 16, [_i(3, 4), _i(4)]),
    _case("PRelu", 16, [_X, _f(4, 1, lo=0.0, hi=1.0)], const=[1]),
    _case("LeakyRelu", 16, [_X], {"alpha": 1.5}),
    _case("LeakyRelu", 16, [_X], {"alpha": -0.5}),
    _case("Elu", 6, [np.array([-np.inf, -100.0, -1.0, 0.0, 2.0, np.inf, np.nan], F32)]),
    _case("Selu", 6, [np.array([-np.inf, -100.0, -1.0, 0.0, 2.0, np.inf], F32)]),
    _case("Celu", 12, [np.array([-np.inf, -100.0, -1.0, 0.0, 2.0, np.inf], F32)]),
    _case("Sigmoid", 13, [_f(3, 4, dtype=np.float64)]),
    _case("Sigmoid", 13, [_f(3, 4, dtype=np.float16)], rtol=1e-3, atol=1e-3),
    _case("Identity", 13, [_X]),
    _case("Identity", 19, [_i(2, 3, dtype=I64)]),
]


@_run_cases(_UNARY_CASES)
def test_unary(
    op: str, opset: int, inputs: list[Any], attrs: dict[str, Any] | None, kw: dict[str, Any]
) -> None:
    _check(op, opset, inputs, attrs, **kw)


# ----------------------------------------------------------------------------------------- binary
_A = _f(3, 1, 4)
_B = _f(2, 4)
_DIVI = np.array([7, -7, 7, -7, 0, 5, -1, 9], I32)
_DIVD = np.array([2, 2, -2, -2, 3, -5, 3, 4], I32)
_BINARY_CASES = [
    *(_case(op, 14, [_A, _B]) for op in ["Add", "Sub", "Mul", "Div"]),
    *(_case(op, 7, [_A, _B]) for op in ["Add", "Sub", "Mul", "Div"]),
    _case("Add", 14, [_f(3, 4), np.array(2.5, F32)], const=[1]),
    _case("Add", 14, [_i(2, 3, dtype=np.int8), _i(3, dtype=np.int8)]),
    _case("Mul", 14, [_i(2, 3, dtype=I64), _i(2, 1, dtype=I64)]),
    _case("Sub", 14, [_i(2, 3, lo=0, hi=200, dtype=np.uint8), _i(3, lo=0, hi=200, dtype=np.uint8)]),
    _case("Div", 14, [_DIVI, _DIVD]),
    _case("Div", 14, [_DIVI.astype(I64), _DIVD.astype(I64)]),
    _case("Div", 14, [np.array([7, 200, 9], np.uint8), np.array([2, 3, 10], np.uint8)]),
    _case("Div", 14, [_f(3, 4, dtype=np.float64), _f(4, lo=0.5, hi=2.0, dtype=np.float64)]),
    _case("Pow", 15, [_f(3, 4, lo=0.1, hi=3.0), _f(3, 4)]),
    _case("Pow", 15, [_f(3, 4), np.array([2, 3, 0, 1], I64)]),
    _case("Pow", 15, [_f(3, 4), np.array(2.0, np.float64)]),
    _case("Pow", 15, [_i(3, 4, lo=-4, hi=5), _i(4, lo=0, hi=4)]),
    _case("Pow", 15, [_i(3, 4, lo=0, hi=5, dtype=I64), np.array([0.5, 2.0, 1.5, 3.0], F32)]),
    *(_case("Pow", 15, [_f(3, 4), np.array(v, F32)], const=[1]) for v in [1.0, 2.0, 3.0, 0.5, -1.0]),
    _case("Pow", 15, [_f(3, 4), np.array([2.0], F32)], const=[1]),
    _case("Pow", 15, [_i(3, 4, lo=0, hi=9), np.array(0.5, F32)], const=[1]),
    _case("Pow", 15, [_i(3, 4), np.array(2, I64)], const=[1]),
    _case("Pow", 15, [np.array(3.0, F32), np.array([2.0], F32)], const=[1]),
    _case("Mod", 13, [_DIVI, np.where(_DIVD == 0, 1, _DIVD).astype(I32)]),
    _case("Mod", 13, [_DIVI, np.where(_DIVD == 0, 1, _DIVD).astype(I32)], {"fmod": 1}),
    _case("Mod", 13, [_f(3, 4), _f(4, lo=0.5, hi=2.0)], {"fmod": 1}),
    _case("Mod", 13, [_i(3, 4, dtype=I64), np.array(3, I64)]),
    _case(
        "BitShift",
        11,
        [np.array([1, 4, 255], np.uint8), np.array([1, 2, 1], np.uint8)],
        {"direction": "LEFT"},
    ),
    _case(
        "BitShift",
        11,
        [np.array([16, 4, 255], np.uint32), np.array([1, 2, 3], np.uint32)],
        {"direction": "RIGHT"},
    ),
    *(_case(op, 18, [_i(3, 4), _i(4)]) for op in ["BitwiseAnd", "BitwiseOr", "BitwiseXor"]),
    *(_case(op, 13, [_A, _B]) for op in ["Equal", "Less", "Greater"]),
    *(_case(op, 16, [_A, _B]) for op in ["LessOrEqual", "GreaterOrEqual"]),
    *(_case(op, 13, [_i(3, 4), _i(4)]) for op in ["Equal", "Less", "Greater"]),
    _case("Equal", 19, [np.array(["a", "b", "c"], object), np.array(["a", "x", "c"], object)]),
    _case("Equal", 13, [RNG.random((3, 4)) > 0.5, RNG.random(4) > 0.5]),
    *(_case(op, 7, [RNG.random((3, 4)) > 0.5, RNG.random(4) > 0.5]) for op in ["And", "Or", "Xor"]),
    _case("Where", 16, [RNG.random((3, 1)) > 0.5, _f(3, 4), _f(4)]),
    _case("Where", 9, [RNG.random((2, 3)) > 0.5, _i(2, 3, dtype=I64), np.array(7, I64)]),
    _case("Max", 13, [_f(3, 4)]),
    _case("Max", 13, [_A, _B]),
    _case("Min", 13, [_A, _B, _f(4)]),
    _case("Max", 12, [_i(3, 4), _i(4)]),
    _case("Min", 8, [_f(2, 3), _f(2, 3)]),
    _case("Sum", 13, [_A, _B, _f(1)]),
    _case("Sum", 13, [_A]),
    _case("Sum", 8, [_f(2, 3), _f(3)]),
    _case("Mean", 13, [_A, _B]),
    _case("Mean", 13, [_A, _B, _f(4), _f(3, 2, 4)]),
    _case("Mean", 13, [_A]),
    _case("Clip", 6, [_X], {"min": -1.0, "max": 0.5}),
    _case("Clip", 6, [_X], {"max": 0.5}),
    _case("Clip", 6, [_X]),
    _case("Clip", 11, [_X, np.array(-1.0, F32), np.array(1.5, F32)]),
    _case("Clip", 13, [_X, np.array(-1.0, F32)]),
    _case("Clip", 13, [_X, None, np.array(1.0, F32)]),
    _case("Clip", 13, [_X, np.array(-0.5, F32), np.array(0.5, F32)], const=[1, 2]),
    _case("Clip", 13, [_X]),
    _case("Clip", 12, [_i(3, 4), np.array(-2, I32), np.array(3, I32)]),
]


@_run_cases(_BINARY_CASES)
def test_binary(
    op: str, opset: int, inputs: list[Any], attrs: dict[str, Any] | None, kw: dict[str, Any]
) -> None:
    _check(op, opset, inputs, attrs, **kw)


# ------------------------------------------------------------------------------------------- cast
T = onnx.TensorProto
_FRACT = np.array([-2.7, -0.5, 0.0, 0.5, 1.99, 3.2, 100.25, -7.75], F32)
_CAST_CASES = [
    _case("Cast", 13, [_FRACT], {"to": T.INT32}),
    _case("Cast", 13, [_FRACT], {"to": T.INT64}),
    _case("Cast", 13, [_FRACT], {"to": T.FLOAT16}),
    _case("Cast", 13, [_FRACT], {"to": T.DOUBLE}),
    _case("Cast", 13, [_FRACT], {"to": T.BOOL}),
    _case("Cast", 13, [_FRACT], {"to": T.FLOAT}),
    _case("Cast", 6, [_i(3, 4, dtype=I64)], {"to": T.FLOAT}),
    _case("Cast", 13, [_i(3, 4, lo=0, hi=255, dtype=np.uint8)], {"to": T.INT8}),
    _case("Cast", 13, [RNG.random((3, 4)) > 0.5], {"to": T.FLOAT}),
    _case("Cast", 13, [_f(3, 4, dtype=np.float64)], {"to": T.FLOAT}),
    _case("Cast", 13, [_f(3, 4, dtype=np.float16)], {"to": T.FLOAT}),
    _case(
        "Cast",
        13,
        [np.array([0.1, 1.5, 1e10, 1e-7, np.nan, np.inf, -np.inf, 3.0, 1 / 3], F32)],
        {"to": T.STRING},
    ),
    _case("Cast", 13, [np.array([0.1, 1 / 3, 1e20, -2.0], np.float64)], {"to": T.STRING}),
    _case("Cast", 13, [np.array([1, -5, 0], I32)], {"to": T.STRING}),
    _case("Cast", 13, [np.array([True, False])], {"to": T.STRING}),
    _case("Cast", 13, [np.array(["0.1", "1e3", "NaN", "INF", "-INF", "-2.5"], object)], {"to": T.FLOAT}),
    _case("Cast", 13, [np.array(["12", "-3", "0"], object)], {"to": T.INT64}),
    _case("Cast", 13, [np.array(["1.5", "-3"], object)], {"to": T.DOUBLE}),
    _case("CastLike", 15, [_FRACT, np.array([1], I64)]),
    _case("CastLike", 15, [_i(2, 3, dtype=I64), np.array([1.0], F32)]),
    _case("CastLike", 15, [_FRACT, np.array(["x"], object)]),
    _case("CastLike", 15, [np.array(["1.25", "-2"], object), np.array([1.0], F32)]),
]


@_run_cases(_CAST_CASES)
def test_cast(
    op: str, opset: int, inputs: list[Any], attrs: dict[str, Any] | None, kw: dict[str, Any]
) -> None:
    _check(op, opset, inputs, attrs, **kw)


# ----------------------------------------------------------------------------------------- linalg
_LINALG_CASES = [
    _case("MatMul", 13, [_f(3, 4), _f(4, 5)], rtol=1e-5),
    _case("MatMul", 13, [_f(2, 1, 3, 4), _f(5, 4, 6)], rtol=1e-5),
    _case("MatMul", 13, [_f(4), _f(2, 4, 3)], rtol=1e-5),
    _case("MatMul", 13, [_f(2, 3, 4), _f(4)], rtol=1e-5),
    _case("MatMul", 13, [_f(4), _f(4)], rtol=1e-5),
    _case("MatMul", 9, [_f(3, 4), _f(4, 5)], const=[1], rtol=1e-5),
    _case("MatMul", 13, [_i(3, 4), _i(4, 2)]),
    _case("MatMul", 13, [_i(3, 4, dtype=I64), _i(4, 2, dtype=I64)]),
    _case("MatMul", 13, [_f(3, 4, dtype=np.float64), _f(4, 2, dtype=np.float64)]),
    _case("Gemm", 13, [_f(3, 4), _f(4, 5), _f(5)], rtol=1e-5),
    _case("Gemm", 13, [_f(4, 3), _f(5, 4), _f(3, 5)], {"transA": 1, "transB": 1}, rtol=1e-5),
    _case("Gemm", 13, [_f(3, 4), _f(5, 4), _f(1)], {"transB": 1, "alpha": 0.5, "beta": 2.0}, rtol=1e-5),
    _case("Gemm", 13, [_f(3, 4), _f(5, 4), _f(5)], {"transB": 1}, const=[1, 2], rtol=1e-5),
    _case("Gemm", 13, [_f(3, 4), _f(5, 4), _f(3, 1)], {"transB": 1, "beta": 0.25}, const=[1, 2], rtol=1e-5),
    _case("Gemm", 13, [_f(3, 4), _f(4, 5)], {"alpha": 2.0}, rtol=1e-5),
    _case("Gemm", 11, [_f(3, 4), _f(4, 5), np.array(1.5, F32)], {"beta": 0.0}, rtol=1e-5),
    _case("Gemm", 7, [_f(3, 4), _f(4, 5), _f(3, 5)], {"alpha": 1.5, "beta": 0.5}, rtol=1e-5),
    _case("Gemm", 13, [_f(3, 4, dtype=np.float64), _f(4, 5, dtype=np.float64), _f(5, dtype=np.float64)]),
    *(_case(op, 11, [_f(2, 3, 4)], {"axis": 1}) for op in ["Softmax", "LogSoftmax", "Hardmax"]),
    *(_case(op, 11, [_f(2, 3, 4)]) for op in ["Softmax", "LogSoftmax", "Hardmax"]),
    *(_case(op, 1, [_f(2, 3, 4)], {"axis": -1}) for op in ["Softmax", "LogSoftmax", "Hardmax"]),
    *(_case(op, 11, [_f(2, 3, 4)], {"axis": 0}) for op in ["Softmax", "LogSoftmax", "Hardmax"]),
    *(_case(op, 13, [_f(2, 3, 4)]) for op in ["Softmax", "LogSoftmax", "Hardmax"]),
    *(_case(op, 13, [_f(2, 3, 4)], {"axis": 1}) for op in ["Softmax", "LogSoftmax", "Hardmax"]),
    *(_case(op, 13, [_f(2, 3, 4)], {"axis": -3}) for op in ["Softmax", "LogSoftmax", "Hardmax"]),
    _case("Softmax", 13, [_f(2, 5, lo=-80, hi=80)]),
    _case("Hardmax", 13, [np.array([[1, 3, 3, 2], [4, 4, 4, 4]], F32)]),
    _case("Softmax", 13, [_f(2, 5, dtype=np.float64)]),
    # float16 is computed in float32 and rounded once, as onnxruntime does (to within one ulp).
    *(_case(op, 13, [_f(16, 50, dtype=np.float16)], rtol=1e-3, atol=0) for op in ["Softmax", "LogSoftmax"]),
    _case("Softmax", 11, [_f(4, 5, 6, dtype=np.float16)], rtol=1e-3, atol=0),
    _case("Einsum", 12, [_f(3, 4), _f(4, 5)], {"equation": "ij,jk->ik"}, rtol=1e-5),
    _case("Einsum", 12, [_f(2, 3, 4), _f(2, 4, 5)], {"equation": "bij,bjk->bik"}, rtol=1e-5),
    _case("Einsum", 12, [_f(3, 4), _f(4, 5)], {"equation": "ij,jk"}, rtol=1e-5),
    _case("Einsum", 12, [_f(4, 4)], {"equation": "ii->i"}),
    _case("Einsum", 12, [_f(3, 4)], {"equation": "ij->ji"}),
    _case("Einsum", 12, [_f(3, 4)], {"equation": "ij->"}, rtol=1e-5),
    _case("Einsum", 12, [_f(3), _f(4)], {"equation": "i,j->ij"}),
    _case("Einsum", 12, [_f(2, 3, 4), _f(2, 4, 5)], {"equation": "...ij,...jk->...ik"}, rtol=1e-5),
    _case("Einsum", 12, [_f(2, 3), _f(3, 4), _f(4, 5)], {"equation": "ab,bc,cd->ad"}, rtol=1e-5),
    _case("Einsum", 12, [_i(3, 4), _i(4, 5)], {"equation": "ij, jk -> ik"}),
]


@_run_cases(_LINALG_CASES)
def test_linalg(
    op: str, opset: int, inputs: list[Any], attrs: dict[str, Any] | None, kw: dict[str, Any]
) -> None:
    _check(op, opset, inputs, attrs, **kw)


# ----------------------------------------------------------------------------------------- tensor
_D = _f(2, 3, 4)
_BIG = np.iinfo(np.int64).max


def _a(*values: int) -> np.ndarray:
    return np.array(values, I64)


_TENSOR_CASES = [
    _case("Reshape", 14, [_D, _a(0, -1)]),
    _case("Reshape", 14, [_D, _a(4, 0, 2)], const=[1]),
    _case("Reshape", 14, [_D, _a(-1)], const=[1]),
    _case("Reshape", 14, [_D, _a(6, 4)], const=[1]),
    _case("Reshape", 14, [np.zeros((0, 3), F32), _a(3, 0)], {"allowzero": 1}),
    _case("Reshape", 5, [_D, _a(2, -1)]),
    _case("Transpose", 13, [_D]),
    _case("Transpose", 13, [_D], {"perm": [1, 0, 2]}),
    _case("Transpose", 1, [_i(2, 3, 4, dtype=I64)], {"perm": [2, 0, 1]}),
    _case("Concat", 13, [_f(2, 3), _f(2, 1), _f(2, 4)], {"axis": -1}),
    _case("Concat", 4, [_f(2, 3), _f(1, 3)], {"axis": 0}),
    _case("Concat", 13, [_i(2, 3, dtype=I64), np.zeros((0, 3), I64)], {"axis": 0}),
    _case("Gather", 13, [_D, _a(2, 0, -1)], {"axis": 2}),
    _case("Gather", 13, [_D, np.array([[1, 0], [-1, 1]], I32)]),
    _case("Gather", 13, [_D, np.array(1, I64)], {"axis": 1}),
    _case("Gather", 1, [_D, _a(1, 0)], {"axis": 0}),
    _case("GatherElements", 13, [_f(3, 3), np.array([[1, -1, 0], [2, 0, 0]], I64)], {"axis": 0}),
    _case("GatherElements", 13, [_f(3, 4), np.array([[1, 3], [0, -4], [2, 2]], I32)], {"axis": -1}),
    _case("GatherElements", 11, [_D, np.zeros((2, 2, 2), I64)], {"axis": 1}),
    _case("GatherND", 13, [_D, np.array([[0, 1], [1, -1]], I64)]),
    _case("GatherND", 13, [_D, np.array([[[1, 2]], [[0, 3]]], I64)], {"batch_dims": 1}),
    _case("GatherND", 11, [_f(2, 2), np.array([[0, 0], [1, 1]], I64)]),
    _case("GatherND", 12, [_f(2, 3, 4, 2), np.array([[[1], [0]], [[2], [1]]], I64)], {"batch_dims": 1}),
    _case("Slice", 1, [_D], {"starts": [0, 1], "ends": [2, 3], "axes": [0, 2]}),
    _case("Slice", 1, [_D], {"starts": [1], "ends": [1000]}),
    _case("Slice", 13, [_D, _a(1, 0), _a(3, -1), _a(1, 2)]),
    _case("Slice", 13, [_D, _a(-1), _a(-_BIG), _a(-1), _a(-1)]),
    _case("Slice", 13, [_D, _a(_BIG), _a(0), _a(2), _a(-2)], const=[1, 2, 3, 4]),
    _case("Slice", 13, [_D, _a(0, 3), _a(2, 1), _a(0, 2), _a(1, -1)], const=[1, 2, 3, 4]),
    _case("Slice", 13, [_D, _a(1), _a(10)], const=[1, 2]),
    _case("Slice", 10, [_D, _a(-3, 1), _a(_BIG, -1), _a(2, 1), _a(2, 1)]),
    _case("Slice", 13, [_D, _a(0), _a(0), _a(1)]),
    _case("Squeeze", 11, [_f(1, 3, 1, 2)], {"axes": [0, -2]}),
    _case("Squeeze", 11, [_f(1, 3, 1, 2)]),
    _case("Squeeze", 13, [_f(1, 3, 1, 2), _a(-2)]),
    _case("Squeeze", 13, [_f(1, 3, 1, 2)]),
    _case("Unsqueeze", 11, [_f(3, 2)], {"axes": [0, -1]}),
    _case("Unsqueeze", 13, [_f(3, 2), _a(1, -1)]),
    _case("Unsqueeze", 13, [_f(3, 2), _a(0, 3)], const=[1]),
    _case("Unsqueeze", 13, [np.array(2.0, F32), _a(0)]),
    *(_case("Flatten", 13, [_D], {"axis": a}) for a in [0, 1, 2, 3, -1]),
    _case("Flatten", 9, [_D]),
    _case("Flatten", 13, [np.zeros((0, 3, 2), F32)], {"axis": 2}),
    _case("Expand", 13, [_f(3, 1), _a(2, 1, 4)]),
    _case("Expand", 13, [_f(3, 4), _a(1, 1)]),
    _case("Expand", 8, [_i(1, 2), _a(3, 2)]),
    _case("Shape", 13, [_D]),
    *(
        _case("Shape", 15, [_D], a)
        for a in [{"start": 1}, {"end": -1}, {"start": -2, "end": 10}, {"start": 2, "end": 1}]
    ),
    _case("Size", 13, [_D]),
    _case("ConstantOfShape", 9, [_a(2, 3)]),
    _case("ConstantOfShape", 20, [_a(2, 3)], {"value": helper.make_tensor("v", T.INT64, [1], [7])}),
    _case("ConstantOfShape", 20, [_a(0)], {"value": helper.make_tensor("v", T.FLOAT, [1], [1.5])}),
    _case("Split", 11, [_f(6, 4)], {"axis": 0, "split": [2, 4]}, n_outputs=2),
    _case("Split", 11, [_f(6, 4)], {"axis": -1}, n_outputs=2),
    _case("Split", 13, [_f(6, 4), _a(1, 2, 3)], n_outputs=3),
    _case("Split", 13, [_f(6, 4), _a(1, 5)], const=[1], n_outputs=2),
    _case("Split", 13, [_f(6, 4)], n_outputs=3),
    _case("Split", 18, [_f(7, 4)], {"num_outputs": 3}, n_outputs=3),
    _case("Split", 18, [_f(2, 5)], {"axis": 1, "num_outputs": 2}, n_outputs=2),
    _case("Tile", 13, [_f(2, 3), _a(2, 3)]),
    _case("Tile", 6, [_i(2, 1, 2, dtype=I64), _a(1, 2, 3)]),
    _case("Pad", 13, [_f(3, 4), _a(1, 2, 0, 1)]),
    _case("Pad", 13, [_f(3, 4), _a(1, 2, 0, 1), np.array(2.5, F32)]),
    _case("Pad", 13, [_f(3, 4), _a(1, 2, 2, 1)], {"mode": "reflect"}),
    _case("Pad", 13, [_f(3, 4), _a(2, 0, 1, 3)], {"mode": "edge"}),
    _case("Pad", 11, [_i(3, 4), _a(0, 1, 0, 1), np.array(-1, I32)], {"mode": "constant"}),
    _case("Pad", 13, [_f(3, 4), _a(-1, 1, 0, -2)]),
    _case("Pad", 18, [_f(2, 3, 4), _a(1, 2), None, _a(-1)]),
    _case("Pad", 18, [_f(2, 3, 4), _a(1, 0, 2, 1), np.array(3.0, F32), _a(0, 2)], const=[1, 3]),
    _case("Pad", 19, [_f(3, 4), _a(1, 2, 2, 1)], {"mode": "wrap"}),
    _case("Pad", 2, [_f(3, 4)], {"pads": [1, 0, 0, 2], "value": 1.5}),
    _case("Pad", 2, [_f(3, 4)], {"pads": [1, 1, 1, 1], "mode": "edge"}),
    _case("Range", 11, [np.array(1, I32), np.array(10, I32), np.array(3, I32)]),
    _case("Range", 11, [np.array(10, I64), np.array(-4, I64), np.array(-3, I64)]),
    _case("Range", 11, [np.array(0.1, F32), np.array(50.0, F32), np.array(0.3, F32)]),
    _case("Range", 11, [np.array(5.0, F32), np.array(1.0, F32), np.array(1.0, F32)]),
    _case("Range", 11, [np.array(1.5, np.float64), np.array(-2.0, np.float64), np.array(-0.25, np.float64)]),
    *(_case("Trilu", 14, [_f(2, 4, 5)], {"upper": u}) for u in [0, 1]),
    *(_case("Trilu", 14, [_f(4, 5), np.array(k, I64)], {"upper": u}) for u in [0, 1] for k in [-1, 2]),
    _case("DepthToSpace", 13, [_f(1, 8, 2, 3)], {"blocksize": 2}),
    _case("DepthToSpace", 13, [_f(2, 8, 2, 3)], {"blocksize": 2, "mode": "CRD"}),
    _case("SpaceToDepth", 13, [_f(2, 2, 4, 6)], {"blocksize": 2}),
    _case("ScatterElements", 13, [_f(3, 3), np.array([[1, 0, 2], [0, 2, 1]], I64), _f(2, 3)]),
    _case("ScatterElements", 13, [_f(3, 3), np.array([[1, -1]], I64), _f(1, 2)], {"axis": 1}),
    *(
        _case(
            "ScatterElements",
            18,
            [_f(3, 3), np.array([[1, 1, 0], [1, 2, 1]], I64), _f(2, 3)],
            {"reduction": r},
        )
        for r in ["add", "mul", "max", "min"]
    ),
    _case("ScatterND", 13, [_f(4, 3), np.array([[1], [3]], I64), _f(2, 3)]),
    _case("ScatterND", 13, [_f(2, 3, 4), np.array([[0, 1], [1, -1]], I64), _f(2, 4)]),
    *(
        _case("ScatterND", 18, [_f(4, 3), np.array([[1], [1], [2]], I64), _f(3, 3)], {"reduction": r})
        for r in ["add", "mul", "max", "min"]
    ),
    _case("NonZero", 13, [np.array([[1, 0, 3], [0, 0, 2]], I32)]),
    _case("NonZero", 13, [RNG.random((2, 3, 2)) > 0.5]),
    _case("NonZero", 13, [np.zeros((2, 2), F32)]),
    _case("TopK", 11, [_f(3, 6), _a(2)], n_outputs=2),
    _case("TopK", 11, [_f(3, 6), _a(3)], {"largest": 0, "axis": 0}, n_outputs=2),
    _case("TopK", 11, [np.array([[3, 1, 3, 2, 3, 1]], F32), _a(4)], n_outputs=2),
    _case("TopK", 11, [np.array([[3, 1, 3, 2, 3, 1]], F32), _a(4)], {"largest": 0}, n_outputs=2),
    _case("TopK", 11, [_i(2, 5, dtype=I64), _a(5)], {"axis": -1}, n_outputs=2),
    _case("TopK", 1, [_f(3, 6)], {"k": 2, "axis": 1}, n_outputs=2),
    _case("TopK", 10, [_f(3, 6), _a(0)], n_outputs=2),
    _case("OneHot", 11, [_a(0, 2, -1, 5), np.array(4, I64), np.array([0.0, 1.0], F32)]),
    _case("OneHot", 11, [np.array([[1, 0], [2, -3]], I32), np.array(3.0, F32), _f(2)], {"axis": 0}),
    _case("OneHot", 11, [np.array([1.0, 2.0], F32), np.array([3], I64), _a(1, 9)], {"axis": -2}),
    _case("CumSum", 14, [_f(3, 4), np.array(1, I32)]),
    _case("CumSum", 14, [_f(3, 4), np.array(0, I64)], {"exclusive": 1}),
    _case("CumSum", 14, [_f(3, 4), np.array(-1, I64)], {"reverse": 1}),
    _case("CumSum", 14, [_i(3, 4), np.array(1, I64)], {"exclusive": 1, "reverse": 1}),
    _case("CumSum", 11, [_i(5, dtype=I64), np.array([0], I64)]),
]


@_run_cases(_TENSOR_CASES)
def test_tensor(
    op: str, opset: int, inputs: list[Any], attrs: dict[str, Any] | None, kw: dict[str, Any]
) -> None:
    _check(op, opset, inputs, attrs, **kw)


_CONSTANT_ATTRS = [
    {"value": helper.make_tensor("v", T.FLOAT, [2, 2], [1.0, 2.0, 3.0, 4.0])},
    {"value": helper.make_tensor("v", T.INT32, [3], [1, -2, 3])},
    {"value": helper.make_tensor("v", T.STRING, [2], [b"ab", b"c"])},
    {"value_float": 2.5},
    {"value_floats": [1.0, 2.5]},
    {"value_int": 7},
    {"value_ints": [1, 2, 3]},
    {"value_string": "hi"},
    {"value_strings": ["a", "bc"]},
]


@pytest.mark.parametrize("attrs", _CONSTANT_ATTRS, ids=lambda a: next(iter(a)))
def test_constant(attrs: dict[str, Any]) -> None:
    _check("Constant", 13, [], attrs)


# ----------------------------------------------------------------------------------------- reduce
_R = _f(3, 4, 5, lo=0.1, hi=2.0)
_RI = _i(3, 4, 5, lo=-3, hi=4)
_REDUCE_OPS = ["ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2"]
_REDUCE_OPS += ["ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]
_REDUCE_CASES = [
    *(_case(op, 13, [_R], {"axes": [1]}) for op in _REDUCE_OPS),
    *(_case(op, 13, [_R], {"axes": [0, -1], "keepdims": 0}) for op in _REDUCE_OPS),
    *(_case(op, 11, [_R]) for op in _REDUCE_OPS + ["ReduceSum"]),
    *(_case(op, 18, [_R, _a(-2)]) for op in _REDUCE_OPS),
    *(_case(op, 18, [_R, _a(0, 2)], {"keepdims": 0}) for op in _REDUCE_OPS),
    *(_case(op, 18, [_R, _a(2)], {"keepdims": 0}, const=[1]) for op in _REDUCE_OPS),
    *(_case(op, 18, [_R], {"keepdims": 0}) for op in _REDUCE_OPS),
    *(_case(op, 18, [_R], {"noop_with_empty_axes": 1}) for op in _REDUCE_OPS),
    *(
        _case(op, 18, [_f(3, 4, lo=0.5, hi=2.0) * np.array([-1, 1, 1, -1], F32)], {"noop_with_empty_axes": 1})
        for op in _REDUCE_OPS
    ),
    _case("ReduceSum", 11, [_R], {"axes": [1, 2]}),
    _case("ReduceSum", 13, [_R, _a(1)]),
    _case("ReduceSum", 13, [_R, _a(-1, 0)], {"keepdims": 0}, const=[1]),
    _case("ReduceSum", 13, [_R]),
    _case("ReduceSum", 13, [_R, np.zeros(0, I64)], {"noop_with_empty_axes": 1}),
    _case("ReduceSum", 13, [_R, np.zeros(0, I64)]),
    _case("ReduceSum", 13, [_RI, _a(1)]),
    _case("ReduceSum", 13, [_RI.astype(I64), _a(0, 2)], {"keepdims": 0}),
    _case("ReduceMean", 18, [_RI, _a(1)]),
    _case("ReduceMax", 18, [_RI, _a(1)]),
    _case("ReduceMin", 18, [_RI.astype(I64), _a(2)]),
    _case("ReduceProd", 18, [_RI, _a(0)]),
    _case("ReduceSumSquare", 18, [_RI, _a(1)]),
    _case("ReduceL1", 18, [_RI, _a(1)]),
    _case("ReduceLogSumExp", 18, [_f(3, 4, lo=-80, hi=80), _a(1)]),
    _case("ReduceMax", 18, [np.zeros((2, 0, 3), F32), _a(1)]),
    _case("ReduceMin", 18, [np.zeros((2, 0, 3), F32), _a(1)], {"keepdims": 0}),
    _case("ReduceSum", 13, [np.zeros((2, 0, 3), F32), _a(1)]),
    _case("ReduceProd", 18, [np.zeros((2, 0, 3), F32), _a(1)]),
    *(_case(op, 11, [_R], {"axis": 1}) for op in ["ArgMax", "ArgMin"]),
    *(_case(op, 13, [_R], {"axis": -1, "keepdims": 0}) for op in ["ArgMax", "ArgMin"]),
    *(_case(op, 13, [_RI]) for op in ["ArgMax", "ArgMin"]),
    *(
        _case(op, 13, [np.array([[1, 3, 3, 0], [2, 2, 0, 0]], F32)], {"axis": 1, "select_last_index": s})
        for op in ["ArgMax", "ArgMin"]
        for s in [0, 1]
    ),
    _case("ArgMax", 12, [_RI], {"axis": -2, "keepdims": 0, "select_last_index": 1}),
]


@_run_cases(_REDUCE_CASES)
def test_reduce(
    op: str, opset: int, inputs: list[Any], attrs: dict[str, Any] | None, kw: dict[str, Any]
) -> None:
    _check(op, opset, inputs, attrs, **kw)


def test_kernels_do_not_modify_inputs() -> None:
    from tests.oracle import run_epctx

    data = _f(3, 4)
    keep = data.copy()
    for op, inputs, attrs in [
        ("ScatterElements", [data, np.array([[0, 1]], I64), _f(1, 2)], {}),
        ("ScatterND", [data, np.array([[1]], I64), _f(1, 4)], {}),
        ("Gemm", [data, _f(4, 2), _f(2)], {"alpha": 2.0, "beta": 3.0}),
        ("CumSum", [data, np.array(1, I64)], {"exclusive": 1}),
        ("Softmax", [data], {}),
    ]:
        model, feeds = _model(op, 18, inputs, attrs, 1, ())
        run_epctx(model, feeds)
        np.testing.assert_array_equal(data, keep, err_msg=op)


def test_erf_float64_and_float16() -> None:
    # onnxruntime has no float64 Erf: compare with math.erf.
    import math

    from epctx.providers.cpu.kernels.erf import erf

    x = np.linspace(-7, 7, 2001)
    expected = np.array([math.erf(v) for v in x.tolist()])
    np.testing.assert_allclose(erf(x), expected, rtol=1e-13, atol=1e-300)
    half = erf(x.astype(np.float16))
    assert half.dtype == np.float16
    np.testing.assert_allclose(half.astype(np.float64), expected, atol=2e-3)


def test_bfloat16_keeps_dtype() -> None:
    # onnxruntime's CPU EP has few bfloat16 kernels: check dtypes and values against float32 math instead.
    import ml_dtypes

    from tests.oracle import run_epctx

    bf16 = np.dtype(ml_dtypes.bfloat16)
    x = _f(3, 4, lo=0.1, hi=0.9)
    xb = x.astype(bf16)
    for op, inputs, attrs, expected in [
        ("MatMul", [xb, xb.T.copy()], {}, x.astype(bf16).astype(F32) @ x.astype(bf16).astype(F32).T),
        ("Gemm", [xb, xb], {"transB": 1, "alpha": 0.5}, 0.5 * (xb.astype(F32) @ xb.astype(F32).T)),
        ("Sigmoid", [xb], {}, 1 / (1 + np.exp(-xb.astype(F32)))),
        ("Softmax", [xb], {}, np.exp(xb.astype(F32)) / np.exp(xb.astype(F32)).sum(-1, keepdims=True)),
        ("ReduceSum", [xb], {"keepdims": 0}, xb.astype(F32).sum()),
    ]:
        names = [f"in{k}" for k in range(len(inputs))]
        node = helper.make_node(op, names, ["out"], **attrs)
        graph = helper.make_graph(
            [node],
            "g",
            [helper.make_tensor_value_info(n, T.BFLOAT16, v.shape) for n, v in zip(names, inputs)],
            [helper.make_tensor_value_info("out", T.BFLOAT16, None)],
        )
        graph.output[0].type.tensor_type.shape.SetInParent()
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
        (out,) = run_epctx(model, dict(zip(names, inputs)))
        assert out.dtype == bf16, op
        np.testing.assert_allclose(out.astype(F32), np.asarray(expected, F32), rtol=1e-2, err_msg=op)
    # Einsum's schema has no bfloat16: refused at load by its type check, as onnxruntime refuses it.
    node = helper.make_node("Einsum", ["a", "b"], ["out"], equation="ij,kj->ik")
    inputs = [helper.make_tensor_value_info(n, T.BFLOAT16, [3, 4]) for n in "ab"]
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("out", T.BFLOAT16, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    with pytest.raises(Fail, match="Einsum.*bfloat16"):
        run_epctx(model, {"a": xb, "b": xb})
