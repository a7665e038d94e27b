"""ExampleExecutionProvider: capability, lowering, numerics vs onnxruntime, context save/load round trips."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import epctx
from epctx.ep._compiling import CapabilityContext, CompileContext
from epctx.ep._context_node import EPContextNode
from epctx.ep._contract import Partition
from epctx.epcontext import ContextBinary, ContextBinaryWriter
from epctx.epcontext.store import ContextSource, ContextStore
from epctx.errors import InvalidArgument, InvalidGraph
from epctx.providers.example import ExampleExecutionProvider
from epctx.providers.example import lowering as lowering_mod
from epctx.providers.example.interpreter import CompiledProgram
from epctx.providers.example.program import PROGRAM_VERSION, Program
from tests.oracle import run_ort

EP = "ExampleExecutionProvider"
F = TensorProto.FLOAT
rng = np.random.default_rng(1234)


def randn(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: dict[str, tuple[Any, ...]],
    outputs: Sequence[str],
    inits: dict[str, np.ndarray] | None = None,
    opset: int = 17,
    elem: int = F,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        list(nodes),
        "g",
        [helper.make_tensor_value_info(n, elem, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, elem, None) for n in outputs],
        [numpy_helper.from_array(v, n) for n, v in (inits or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    # Shape inference gives the outputs the shapes the checker requires; intermediate types are left out, so
    # the example EP's own type propagation is what claims chains of nodes.
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    del model.graph.value_info[:]
    return model


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[Partition, CompiledProgram]]]:
    """Records every (partition, compiled program) the example EP compiles."""
    seen: list[tuple[Partition, CompiledProgram]] = []
    original = ExampleExecutionProvider.compile

    def compile(
        self: ExampleExecutionProvider, partitions: Sequence[Partition], ctx: CompileContext
    ) -> list[Any]:
        results = original(self, partitions, ctx)
        seen.extend(zip(partitions, results))
        return results

    monkeypatch.setattr(ExampleExecutionProvider, "compile", compile)
    yield seen


def check(
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    *,
    claimed: int | None = None,
    options: dict[str, str] | None = None,
) -> list[np.ndarray]:
    """Run on epctx (example EP first) and onnxruntime; compare dtype, shape, values within 1e-5.
    ``claimed``: how many nodes the example EP must claim (default: all of them)."""
    ep = ExampleExecutionProvider(options)
    graph = ir.from_proto(model).graph
    got = ep.get_capability(graph, {"": model.opset_import[0].version}, CapabilityContext()).claimed
    assert len(got) == (len(model.graph.node) if claimed is None else claimed)
    provider: Any = (EP, options) if options else EP
    session = epctx.InferenceSession(model.SerializeToString(), providers=[provider])
    ours = session.run(None, feeds)
    theirs = run_ort(model, feeds)
    assert len(ours) == len(theirs)
    for k, (a, b) in enumerate(zip(ours, theirs)):
        assert a.dtype == b.dtype, f"output {k}: {a.dtype} != {b.dtype}"
        assert a.shape == b.shape, f"output {k}: {a.shape} != {b.shape}"
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5, err_msg=f"output {k}")
    return ours


# -- every op vs onnxruntime ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("a_shape", "b_shape", "b_const"),
    [
        ((3, 4), (4, 5), True),
        ((3, 4), (4, 5), False),
        ((2, 3, 4), (4, 5), True),
        ((2, 3, 4), (2, 4, 5), False),
        ((4,), (4, 5), True),
        ((2, 3, 4), (4,), True),
    ],
)
def test_matmul(a_shape: tuple[int, ...], b_shape: tuple[int, ...], b_const: bool) -> None:
    b = randn(*b_shape)
    inputs: dict[str, Any] = {"a": a_shape} if b_const else {"a": a_shape, "b": b_shape}
    model = make_model(
        [helper.make_node("MatMul", ["a", "b"], ["y"])], inputs, ["y"], {"b": b} if b_const else None
    )
    feeds = {"a": randn(*a_shape)} if b_const else {"a": randn(*a_shape), "b": b}
    check(model, feeds)


GEMM_CASES = [
    dict(),
    dict(transA=1),
    dict(transB=1),
    dict(transA=1, transB=1, alpha=0.5, beta=2.0),
    dict(alpha=1.5),
    dict(beta=0.0),
    dict(beta=-0.25, transB=1),
]


@pytest.mark.parametrize("attrs", GEMM_CASES, ids=[json.dumps(a) for a in GEMM_CASES])
@pytest.mark.parametrize("c_shape", [None, (), (5,), (3, 1), (1, 5), (3, 5)], ids=str)
@pytest.mark.parametrize("const", ["weights", "inputs"])
def test_gemm(attrs: dict[str, Any], c_shape: tuple[int, ...] | None, const: str) -> None:
    m, k, n = 3, 4, 5
    a_shape = (k, m) if attrs.get("transA") else (m, k)
    b_shape = (n, k) if attrs.get("transB") else (k, n)
    values = {"b": randn(*b_shape)}
    if c_shape is not None:
        values["c"] = randn(*c_shape)
    names = ["a", "b"] + (["c"] if c_shape is not None else [])
    node = helper.make_node("Gemm", names, ["y"], **attrs)
    feeds = {"a": randn(*a_shape)}
    if const == "weights":
        model = make_model([node], {"a": a_shape}, ["y"], values)
    else:
        shapes = {"a": a_shape, "b": b_shape} | ({"c": c_shape} if c_shape is not None else {})
        model = make_model([node], shapes, ["y"])
        feeds |= values
    check(model, feeds)


def test_gemm_with_omitted_c_and_constant_folded_reshape() -> None:
    nodes = [
        helper.make_node("Reshape", ["wflat", "s"], ["w"]),  # all constant: folded at compile time
        helper.make_node("Gemm", ["a", "w", ""], ["y"], alpha=3.0),
    ]
    inits = {"wflat": randn(12), "s": np.array([4, -1], np.int64)}
    model = make_model(nodes, {"a": (2, 4)}, ["y"], inits)
    check(model, {"a": randn(2, 4)})
    _, compiled = _compile(model)
    ((op, attrs),) = [(i.op, i.attrs) for i in compiled.program.instructions]
    assert op == "Gemm" and attrs["alpha"] == 1.0 and len(compiled.weights) == 1


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize(
    ("a_shape", "b_shape"), [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 4)), ((), (2, 3))]
)
@pytest.mark.parametrize("b_const", [False, True])
def test_binary(op: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...], b_const: bool) -> None:
    b = randn(*b_shape) + np.float32(3.0)  # away from 0 for Div
    if b_const:
        model = make_model([helper.make_node(op, ["a", "b"], ["y"])], {"a": a_shape}, ["y"], {"b": b})
        feeds = {"a": randn(*a_shape)}
    else:
        model = make_model([helper.make_node(op, ["a", "b"], ["y"])], {"a": a_shape, "b": b_shape}, ["y"])
        feeds = {"a": randn(*a_shape), "b": b}
    check(model, feeds)


@pytest.mark.parametrize("op", ["Relu", "Sigmoid", "Tanh", "Identity"])
def test_unary(op: str) -> None:
    x = np.concatenate([randn(40) * 4, np.array([0, -0.0, 1e-8, -100, 100, -1e4, 1e4], np.float32)])
    model = make_model([helper.make_node(op, ["x"], ["y"])], {"x": x.shape}, ["y"])
    check(model, {"x": x})


@pytest.mark.parametrize("axis", [None, -1, 0, 1, 2, -2])
def test_softmax(axis: int | None) -> None:
    kwargs = {} if axis is None else {"axis": axis}
    model = make_model(
        [helper.make_node("Softmax", ["x"], ["y"], **kwargs)], {"x": (2, 3, 5)}, ["y"], opset=13
    )
    check(model, {"x": randn(2, 3, 5) * 5})


def test_softmax_before_opset_13_is_left_to_cpu() -> None:
    model = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], {"x": (2, 3, 5)}, ["y"], opset=11)
    check(model, {"x": randn(2, 3, 5)}, claimed=0)


@pytest.mark.parametrize(
    ("in_shape", "shape", "allowzero"),
    [
        ((2, 3, 4), [0, -1], 0),
        ((2, 3, 4), [-1], 0),
        ((2, 3, 4), [4, 0, 2], 0),
        ((2, 3, 4), [2, 2, 3, 2], 0),
        ((2, 3, 4), [0, 0, 0], 0),
        ((0, 3, 4), [3, 4, 0], 1),
    ],
)
def test_reshape(in_shape: tuple[int, ...], shape: list[int], allowzero: int) -> None:
    kwargs = {"allowzero": allowzero} if allowzero else {}
    model = make_model(
        [helper.make_node("Reshape", ["x", "s"], ["y"], **kwargs)],
        {"x": in_shape},
        ["y"],
        {"s": np.array(shape, np.int64)},
        opset=14,
    )
    check(model, {"x": randn(*in_shape)})


@pytest.mark.parametrize("perm", [None, [0, 1, 2], [2, 0, 1], [1, 0, 2], [2, 1, 0]])
def test_transpose(perm: list[int] | None) -> None:
    kwargs = {} if perm is None else {"perm": perm}
    model = make_model([helper.make_node("Transpose", ["x"], ["y"], **kwargs)], {"x": (2, 3, 4)}, ["y"])
    check(model, {"x": randn(2, 3, 4)})


def test_mlp_chain_in_one_partition(spy: list[tuple[Partition, CompiledProgram]]) -> None:
    nodes = [
        helper.make_node("Reshape", ["x", "s"], ["flat"]),
        helper.make_node("Gemm", ["flat", "w1", "b1"], ["h"], transB=1),
        helper.make_node("Tanh", ["h"], ["t"]),
        helper.make_node("MatMul", ["t", "w2"], ["m"]),
        helper.make_node("Add", ["m", "b2"], ["z"]),
        helper.make_node("Sigmoid", ["z"], ["g"]),
        helper.make_node("Mul", ["z", "g"], ["sw"]),
        helper.make_node("Softmax", ["sw"], ["y"]),
    ]
    inits = {
        "s": np.array([0, -1], np.int64),
        "w1": randn(16, 12),
        "b1": randn(16),
        "w2": randn(16, 8),
        "b2": randn(8),
    }
    model = make_model(nodes, {"x": (4, 3, 4)}, ["y", "t"], inits)
    check(model, {"x": randn(4, 3, 4)})
    assert len(spy) == 1
    assert [n.op_type for n in spy[0][0].nodes] == [n.op_type for n in nodes]


# -- partly claimed models: CPU in the middle -------------------------------------------------------------
def test_conv_in_the_middle_gives_two_partitions(spy: list[tuple[Partition, CompiledProgram]]) -> None:
    nodes = [
        helper.make_node("Mul", ["x", "scale"], ["xs"]),
        helper.make_node("Conv", ["xs", "k"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Reshape", ["r", "s"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w"], ["m"]),
        helper.make_node("Softmax", ["m"], ["y"]),
    ]
    inits = {
        "scale": randn(1, 3, 1, 1),
        "k": randn(4, 3, 3, 3),
        "s": np.array([1, -1], np.int64),
        "w": randn(4 * 5 * 5, 6),
    }
    model = make_model(nodes, {"x": (1, 3, 5, 5)}, ["y"], inits)
    # Conv runs on the CPU EP: the example EP needs the declared type of its output (shape inference).
    model = onnx.shape_inference.infer_shapes(model)
    check(model, {"x": randn(1, 3, 5, 5)}, claimed=5)
    assert [[n.op_type for n in p.nodes] for p, _ in spy] == [
        ["Mul"],
        ["Relu", "Reshape", "MatMul", "Softmax"],
    ]


def test_layernorm_in_the_middle(spy: list[tuple[Partition, CompiledProgram]]) -> None:
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("LayerNormalization", ["h", "gamma", "beta"], ["n"], axis=-1),
        helper.make_node("Gemm", ["n", "w2"], ["y"], transB=1, alpha=0.5),
    ]
    inits = {"w1": randn(6, 8), "gamma": randn(8), "beta": randn(8), "w2": randn(3, 8)}
    model = onnx.shape_inference.infer_shapes(make_model(nodes, {"x": (5, 6)}, ["y"], inits))
    check(model, {"x": randn(5, 6)}, claimed=2)
    assert len(spy) == 2


def test_untyped_value_from_another_ep_is_not_claimed() -> None:
    nodes = [helper.make_node("Conv", ["x", "k"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    model = make_model(nodes, {"x": (1, 2, 4, 4)}, ["y"], {"k": randn(3, 2, 1, 1)})
    check(model, {"x": randn(1, 2, 4, 4)}, claimed=0)  # no value_info for "c": its dtype is unknown


def test_ops_option_forces_cpu_fallback(spy: list[tuple[Partition, CompiledProgram]]) -> None:
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Relu", ["m"], ["r"]),
        helper.make_node("Add", ["r", "b"], ["y"]),
    ]
    model = make_model(nodes, {"x": (2, 3)}, ["y"], {"w": randn(3, 4), "b": randn(4)})
    model = onnx.shape_inference.infer_shapes(model)
    check(model, {"x": randn(2, 3)}, claimed=2, options={"ops": "MatMul, Add"})
    assert [[n.op_type for n in p.nodes] for p, _ in spy] == [["MatMul"], ["Add"]]


def test_other_dtypes_are_not_claimed() -> None:
    model = make_model(
        [helper.make_node("Add", ["a", "b"], ["y"])],
        {"a": (2, 3), "b": (2, 3)},
        ["y"],
        elem=TensorProto.DOUBLE,
    )
    check(model, {"a": np.ones((2, 3)), "b": np.ones((2, 3))}, claimed=0)


def test_reshape_with_computed_shape_is_not_claimed() -> None:
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Reshape", ["x", "s"], ["y"])]
    check(make_model(nodes, {"x": (2, 3)}, ["y"]), {"x": randn(2, 3)}, claimed=0)


def test_get_capability_does_not_modify_the_graph() -> None:
    nodes = [helper.make_node("Gemm", ["x", "w"], ["h"], transB=1), helper.make_node("Relu", ["h"], ["y"])]
    model = ir.from_proto(make_model(nodes, {"x": (2, 3)}, ["y"], {"w": randn(4, 3)}))
    before = ir.to_proto(model).SerializeToString()
    capability = ExampleExecutionProvider().get_capability(model.graph, {"": 17}, CapabilityContext())
    assert len(capability.claimed) == 2
    assert ir.to_proto(model).SerializeToString() == before


def test_bad_options() -> None:
    with pytest.raises(InvalidArgument, match="Conv"):
        ExampleExecutionProvider({"ops": "MatMul,Conv"})
    with pytest.raises(InvalidArgument, match="speed"):
        ExampleExecutionProvider({"speed": "fast"})


# -- lowering ---------------------------------------------------------------------------------------------
def _compile(model: onnx.ModelProto) -> tuple[Partition, CompiledProgram]:
    from epctx.partition import GraphPartitioner

    irm = ir.from_proto(model)
    ep = ExampleExecutionProvider()
    units = GraphPartitioner([ep], cpu_fallback=False).partition(irm.graph, dict(irm.opset_imports))
    parts = [u.partition for u in units if u.partition is not None]
    assert len(parts) == 1
    compiled = ep.compile(parts, CompileContext())[0]
    assert isinstance(compiled, CompiledProgram)
    return parts[0], compiled


def test_lowering_folds_constants_and_rewrites_gemm() -> None:
    w = randn(4, 3)
    nodes = [
        helper.make_node("Transpose", ["w"], ["wt"]),  # constant: folded into the weight
        helper.make_node("MatMul", ["x", "wt"], ["m"]),
        helper.make_node("Identity", ["m"], ["i"]),  # aliased away
        helper.make_node("Gemm", ["i", "g", "c"], ["y"], transB=1, alpha=2.0, beta=0.5),
    ]
    g, c = randn(5, 4), randn(5)
    model = make_model(nodes, {"x": (2, 3)}, ["y"], {"w": w, "g": g, "c": c})
    _, compiled = _compile(model)
    program = compiled.program
    assert [i.op for i in program.instructions] == ["MatMul", "Gemm"]
    gemm = program.instructions[1]
    assert gemm.attrs == {"trans_a": 0, "trans_b": 0, "alpha": 1.0, "beta": 1.0}
    by_slot = {len(program.inputs) + j: wt for j, wt in enumerate(compiled.weights)}
    np.testing.assert_array_equal(by_slot[program.instructions[0].inputs[1]], w.T)
    np.testing.assert_allclose(by_slot[gemm.inputs[1]], (g * np.float32(2.0)).T)
    np.testing.assert_allclose(by_slot[gemm.inputs[2]], c * np.float32(0.5))
    assert all(wt.flags.c_contiguous for wt in compiled.weights)
    check(model, {"x": randn(2, 3)})


def test_reshape_shape_is_an_attribute_not_a_weight() -> None:
    model = make_model(
        [helper.make_node("Reshape", ["x", "s"], ["y"])],
        {"x": (2, 3, 4)},
        ["y"],
        {"s": np.array([0, -1], np.int64)},
    )
    _, compiled = _compile(model)
    assert compiled.weights == ()
    (ins,) = compiled.program.instructions
    assert ins.attrs == {"shape": [0, -1], "copy_dims": [0]}


# -- context binary round trip ----------------------------------------------------------------------------
def _mlp() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["m"]),
        helper.make_node("Add", ["m", "b2"], ["z"]),
        helper.make_node("Softmax", ["z"], ["y"]),
    ]
    local = np.random.default_rng(7)
    inits = {
        "w1": local.standard_normal((16, 6)).astype(np.float32),
        "b1": local.standard_normal(16).astype(np.float32),
        "w2": local.standard_normal((16, 4)).astype(np.float32),
        "b2": local.standard_normal(4).astype(np.float32),
    }
    return make_model(nodes, {"x": (3, 6)}, ["y", "h"], inits)


def assert_matches_ort_by_name(
    partition: Partition, results: Sequence[np.ndarray], model: onnx.ModelProto, feeds: dict[str, np.ndarray]
) -> None:
    """A partition's outputs (in partition order) against the model's outputs on onnxruntime (by name)."""
    expected = dict(zip([o.name for o in model.graph.output], run_ort(model, feeds)))
    assert {v.name for v in partition.outputs} == set(expected)
    for value, result in zip(partition.outputs, results):
        np.testing.assert_allclose(
            result, expected[value.name or ""], atol=1e-5, rtol=1e-5, err_msg=value.name
        )


def _save(partition: Partition, compiled: CompiledProgram) -> bytes:
    ep = ExampleExecutionProvider()
    writer = ContextBinaryWriter(ep_name=ep.name, sdk_version=ep.sdk_version(), hardware=ep.hardware())
    ep.save_partition(partition, compiled, ContextStore(writer, "graph_0"))
    return writer.to_bytes()


def _node_for(partition: Partition) -> EPContextNode:
    return EPContextNode(
        name="graph_0",
        inputs=tuple(v.name or "" for v in partition.inputs),
        outputs=tuple(v.name or "" for v in partition.outputs),
        ep_cache_context=b"(embedded)",
        source=EP,
    )


def _forbid_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("load_partition compiled")

    monkeypatch.setattr(ExampleExecutionProvider, "compile", fail)
    monkeypatch.setattr(lowering_mod, "lower_partition", fail)


def test_save_load_round_trip_without_compiling_or_copying(monkeypatch: pytest.MonkeyPatch) -> None:
    partition, compiled = _compile(_mlp())
    blob = _save(partition, compiled)
    binary = ContextBinary.from_bytes(blob)
    source = ContextSource(binary, "graph_0")
    assert sorted(source.keys()) == ["program", "weights/0", "weights/1", "weights/2", "weights/3"]
    assert source.attrs("weights/0")["dtype"] == "float32"
    assert json.loads(source.attrs("weights/0")["shape"]) == list(compiled.weights[0].shape)

    _forbid_compiling(monkeypatch)
    loaded = ExampleExecutionProvider().load_partition(source, _node_for(partition), partition)
    assert isinstance(loaded, CompiledProgram)
    assert loaded.program == compiled.program
    buffer = np.frombuffer(blob, np.uint8)
    for w in loaded.weights:
        assert np.shares_memory(w, buffer)  # a view of the binary, not a copy
        assert not w.flags.writeable
    x = randn(3, 6)
    for a, b in zip(loaded(x), compiled(x)):
        np.testing.assert_array_equal(a, b)
    assert_matches_ort_by_name(partition, loaded(x), _mlp(), {"x": x})


def test_round_trip_of_aliases_and_weight_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    # Outputs that are partition inputs (Identity) or weights (folded constants) survive save/load.
    nodes = [
        helper.make_node("Identity", ["x"], ["ix"]),
        helper.make_node("Transpose", ["w"], ["wt"]),
        helper.make_node("Add", ["ix", "wt"], ["y"]),
    ]
    model = make_model(nodes, {"x": (3, 2)}, ["y", "ix", "wt"], {"w": randn(2, 3)})
    partition, compiled = _compile(model)
    assert [i.op for i in compiled.program.instructions] == ["Add"]
    blob = _save(partition, compiled)
    _forbid_compiling(monkeypatch)
    source = ContextSource(ContextBinary.from_bytes(blob), "graph_0")
    loaded = ExampleExecutionProvider().load_partition(source, _node_for(partition), partition)
    x = randn(3, 2)
    assert_matches_ort_by_name(partition, loaded(x), model, {"x": x})


def test_program_bytes_are_deterministic() -> None:
    blobs = []
    programs = []
    for _ in range(2):
        partition, compiled = _compile(_mlp())
        programs.append(compiled.program.to_json())
        blobs.append(_save(partition, compiled))
    assert programs[0] == programs[1]
    assert blobs[0] == blobs[1]
    assert programs[0] == Program.from_json(programs[0]).to_json()


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: d.update(format="other"), "format"),
        (lambda d: d.update(version=PROGRAM_VERSION + 1), "format version"),
        (lambda d: d["instructions"][0].update(op="Conv"), "unknown op 'Conv'"),
        (lambda d: d["instructions"][0].update(inputs=[99, 0]), "undefined slots"),
        (lambda d: d["instructions"][0].update(output=0), "writes slot"),
        (lambda d: d["weights"][0].update(dtype="float64"), "malformed"),
        (lambda d: d["weights"][0].update(shape=[1, 2]), "expected"),
        (lambda d: d["outputs"][0].update(slot=1000), "outputs read undefined"),
        (lambda d: d["instructions"][1].update(attrs={"axis": "last"}), "must be an integer"),
        (lambda d: d.pop("weights"), "malformed"),
    ],
)
def test_load_rejects_malformed_programs(mutate: Any, match: str) -> None:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Softmax", ["m"], ["y"])]
    partition, compiled = _compile(make_model(nodes, {"x": (2, 3)}, ["y"], {"w": randn(3, 4)}))
    doc = json.loads(compiled.program.to_json())
    mutate(doc)
    ep = ExampleExecutionProvider()
    writer = ContextBinaryWriter(ep_name=EP)
    writer.add("graph_0/program", json.dumps(doc).encode())
    writer.add("graph_0/weights/0", np.ascontiguousarray(compiled.weights[0]), kind="weights")
    source = ContextSource(ContextBinary.from_bytes(writer.to_bytes()), "graph_0")
    with pytest.raises(InvalidGraph, match=match):
        ep.load_partition(source, _node_for(partition), partition)


def test_load_rejects_non_json() -> None:
    partition, _ = _compile(make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": (2,)}, ["y"]))
    writer = ContextBinaryWriter(ep_name=EP)
    writer.add("graph_0/program", b"\x80\x04 pickle?")
    source = ContextSource(ContextBinary.from_bytes(writer.to_bytes()), "graph_0")
    with pytest.raises(InvalidGraph, match="not a JSON document"):
        ExampleExecutionProvider().load_partition(source, _node_for(partition), partition)


def test_sdk_version_and_check_context() -> None:
    ep = ExampleExecutionProvider()
    node = EPContextNode(name="n", inputs=("x",), outputs=("y",), ep_cache_context=b"b", source=EP)
    assert ep.sdk_version() == f"example-{epctx.__version__}/program-{PROGRAM_VERSION}"
    assert ep.hardware() == ""
    assert ep.check_context(node, ep.sdk_version(), "") is None
    # Another epctx release writing the same program format loads here.
    assert ep.check_context(node, f"example-9.9.9/program-{PROGRAM_VERSION}", "") is None
    assert "program format" in (
        ep.check_context(node, f"example-0.1.0/program-{PROGRAM_VERSION + 1}", "") or ""
    )
    assert "not an example EP" in (ep.check_context(node, "openvino-2025.1", "") or "")
    assert "hardware" in (ep.check_context(node, ep.sdk_version(), "x86_64") or "")
    assert ep.compatibility_info() == f"sdk={ep.sdk_version()};hardware="


def test_compiled_program_is_reentrant_and_leaves_inputs_alone() -> None:
    _, compiled = _compile(_mlp())
    x = randn(3, 6)
    x.flags.writeable = False  # any write into an input would raise
    first = compiled(x)
    second = compiled(x)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="expected 1 inputs"):
        compiled()
