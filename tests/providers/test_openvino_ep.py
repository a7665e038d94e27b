"""OpenVINOExecutionProvider: capability from OpenVINO, numerics vs onnxruntime, context round trips."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("openvino")

from benchmarks.models import example_inputs, mlp, resnet18, transformer

import epctx
from epctx.ep import CapabilityContext
from epctx.epcontext import ContextBinary, ContextBinaryWriter
from epctx.model.load import load_model
from epctx.providers.openvino import OpenVINOExecutionProvider
from epctx.session.compile_guard import no_compile
from tests.oracle import run_ort

EP = "OpenVINOExecutionProvider"
BIN = f"model_{EP}.bin"
ATOL = 1e-4

SMALL = {
    "mlp": lambda: mlp(batch=2, sizes=(24, 32, 32, 6)),
    "resnet18": lambda: resnet18(image=32, widths=(8, 16), blocks=(1, 1), num_classes=7),
    "transformer": lambda: transformer(layers=2, hidden=32, heads=4, ffn=64, seq=6),
}


def _options(**config: str) -> epctx.SessionOptions:
    so = epctx.SessionOptions()
    for key, value in config.items():
        so.add_session_config_entry(key.replace("__", "."), value)
    return so


def _generate(
    folder: Path, model: onnx.ModelProto, ep_options: dict[str, str] | None = None, **config: str
) -> tuple[epctx.InferenceSession, Path]:
    src = folder / "model.onnx"
    onnx.save(model, src)
    sess = epctx.InferenceSession(
        str(src), _options(ep__context_enable="1", **config), providers=[(EP, ep_options or {})]
    )
    return sess, folder / "model_ctx.onnx"


def _load(
    path: Path | bytes, ep_options: dict[str, str] | None = None, **config: str
) -> epctx.InferenceSession:
    with no_compile():
        return epctx.InferenceSession(
            path if isinstance(path, bytes) else str(path),
            _options(**config),
            providers=[(EP, ep_options or {})],
        )


def _ctx_nodes(path: Path) -> list[onnx.NodeProto]:
    return [n for n in onnx.load(path, load_external_data=False).graph.node if n.op_type == "EPContext"]


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _close(a: Any, b: Any, atol: float = ATOL) -> None:
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_allclose(a, b, atol=atol, rtol=1e-4)


# -- round trips on the benchmark models ---------------------------------------------------------------
@pytest.mark.parametrize("embed", ["0", "1"])
@pytest.mark.parametrize("name", sorted(SMALL))
def test_compile_and_reload_benchmark_models(tmp_path: Path, name: str, embed: str) -> None:
    model = SMALL[name]()
    feeds = example_inputs(name, model)
    expected = run_ort(model, feeds)[0]
    sess, ctx = _generate(tmp_path, model, ep__context_embed_mode=embed)
    cold = sess.run(None, feeds)[0]
    _close(cold, expected)
    assert float(np.abs(cold - expected).max()) <= ATOL  # f32 by default: no bf16 drift
    nodes = _ctx_nodes(ctx)
    assert len(nodes) == len(onnx.load(ctx).graph.node) == 1  # OpenVINO claims every node
    main = _attrs(nodes[0])
    assert main["source"] == EP.encode() and main["embed_mode"] == int(embed)
    assert main["ep_sdk_version"].startswith(b"openvino-")
    assert (tmp_path / BIN).exists() == (embed == "0")
    warm = _load(ctx).run(None, feeds)[0]
    np.testing.assert_array_equal(warm, cold)  # the same compiled code
    if embed == "1":  # an embedded context loads from bytes with no path option
        np.testing.assert_array_equal(_load(ctx.read_bytes()).run(None, feeds)[0], cold)


def test_dynamic_batch_and_external_data_source(tmp_path: Path) -> None:
    model = mlp(batch=2, sizes=(24, 32, 6))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "N"
    src = tmp_path / "model.onnx"
    onnx.save(model, src, save_as_external_data=True, location="model.data", size_threshold=0)
    model = onnx.load(src)
    epctx.InferenceSession(str(src), _options(ep__context_enable="1"), providers=[EP])
    sess = _load(tmp_path / "model_ctx.onnx")
    for batch in (1, 5):
        x = np.random.default_rng(batch).standard_normal((batch, 24)).astype(np.float32)
        _close(sess.run(None, {"input": x})[0], run_ort(model, {"input": x})[0])


# -- two EPs: OpenVINO + CPU fallback ------------------------------------------------------------------
def test_two_ep_model_cut_in_the_middle(tmp_path: Path) -> None:
    """Softmax and LayerNormalization left to the CPU EP: OpenVINO partitions with several inputs / outputs."""
    model = SMALL["transformer"]()
    feeds = example_inputs("transformer", model)
    expected = run_ort(model, feeds)[0]
    options = {"disabled_ops": "Softmax,LayerNormalization"}
    sess, ctx = _generate(tmp_path, model, options)
    _close(sess.run(None, feeds)[0], expected)
    nodes = _ctx_nodes(ctx)
    assert len(nodes) > 2
    assert [_attrs(n)["main_context"] for n in nodes] == [1] + [0] * (len(nodes) - 1)  # one binary
    left = {n.op_type for n in onnx.load(ctx).graph.node if n.op_type != "EPContext"}
    assert left == {"Softmax", "LayerNormalization"}
    assert any(len(n.input) > 1 for n in nodes) and any(len(n.output) > 1 for n in nodes)
    _close(_load(ctx, options).run(None, feeds)[0], expected)


def test_op_openvino_rejects_falls_back_to_the_next_ep() -> None:
    """A custom-domain op OpenVINO cannot translate is not claimed; its neighbours are."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Mystery", ["a"], ["b"], domain="com.example", name="mystery"),
        helper.make_node("Neg", ["b"], ["y"], name="neg"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        value_info=[
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 3]),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    )
    ir_model = load_model(model.SerializeToString()).model
    before = ir_model.graph.node(0), len(ir_model.graph)
    ep = OpenVINOExecutionProvider()
    claimed = ep.get_capability(ir_model.graph, dict(ir_model.opset_imports), CapabilityContext()).claimed
    assert [n.name for n in claimed] == ["relu", "neg"]
    assert (ir_model.graph.node(0), len(ir_model.graph)) == before


def test_capability_is_pure_and_needs_types() -> None:
    model = SMALL["mlp"]()
    ep = OpenVINOExecutionProvider()
    untyped = load_model(model.SerializeToString(), infer_types=False).model
    # Without shape inference the values between nodes have no type: no node is claimed.
    assert ep.get_capability(untyped.graph, dict(untyped.opset_imports), CapabilityContext()).claimed == ()
    typed = load_model(model.SerializeToString(), infer_types=True).model
    before = onnx.printer.to_text(ir.serde.serialize_model(typed))
    claimed = ep.get_capability(typed.graph, dict(typed.opset_imports), CapabilityContext()).claimed
    assert len(claimed) == len(typed.graph)
    assert onnx.printer.to_text(ir.serde.serialize_model(typed)) == before


# -- weightless binaries ---------------------------------------------------------------------------------
@pytest.mark.parametrize("embed", ["0", "1"])
def test_weightless_round_trip(tmp_path: Path, embed: str) -> None:
    model = mlp(batch=2, sizes=(64, 128, 128, 6))
    feeds = example_inputs("mlp", model)
    weight_bytes = sum(len(t.raw_data) for t in model.graph.initializer)
    sess, ctx = _generate(tmp_path, model, {"weightless": "1"}, ep__context_embed_mode=embed)
    cold = sess.run(None, feeds)[0]
    _close(cold, run_ort(model, feeds)[0])
    if embed == "0":
        binary = ContextBinary.open(tmp_path / BIN)
    else:
        binary = ContextBinary.from_bytes(_attrs(_ctx_nodes(ctx)[0])["ep_cache_context"])
    with binary:
        entries = {name.split("/", 1)[1]: binary.entry(name) for name in binary.names()}
        blob = entries.pop("blob")
        weights = [e for key, e in entries.items() if key.startswith("weights/")]
        assert weights and all(e.kind == "weights" for e in weights)
        assert sum(e.size for e in weights) == weight_bytes
        assert blob.size < weight_bytes / 4  # the blob references the weights instead of holding them
    warm = _load(ctx, {"weightless": "1"}).run(None, feeds)[0]
    np.testing.assert_array_equal(warm, cold)


# -- errors ------------------------------------------------------------------------------------------------
def test_options_are_checked() -> None:
    with pytest.raises(epctx.InvalidArgument, match="device_type.*precision"):
        OpenVINOExecutionProvider({"bogus": "1"})
    with pytest.raises(epctx.InvalidArgument, match="precision"):
        OpenVINOExecutionProvider({"precision": "f64"})
    with pytest.raises(epctx.InvalidArgument, match="num_streams"):
        OpenVINOExecutionProvider({"num_streams": "-1"})
    with pytest.raises(epctx.EPFail, match="NO_SUCH_DEVICE"):
        OpenVINOExecutionProvider({"device_type": "NO_SUCH_DEVICE"})
    ep = OpenVINOExecutionProvider({"num_of_threads": "1", "num_streams": "1"})
    assert ep.config.runtime_config() == {
        "INFERENCE_PRECISION_HINT": "f32",
        "INFERENCE_NUM_THREADS": 1,
        "NUM_STREAMS": 1,
    }
    assert ep.provider_options() == {"num_of_threads": "1", "num_streams": "1"}


def test_version_and_hardware_mismatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, ctx = _generate(tmp_path, SMALL["mlp"]())
    made_by = OpenVINOExecutionProvider().sdk_version()
    monkeypatch.setattr(OpenVINOExecutionProvider, "sdk_version", lambda self: "openvino-2099.1")
    with pytest.raises(epctx.InvalidGraph) as info:
        _load(ctx)
    message = str(info.value)
    assert made_by in message and "openvino-2099.1" in message and EP in message
    monkeypatch.undo()
    monkeypatch.setattr(OpenVINOExecutionProvider, "hardware", lambda self: "CPU/intel64/Other CPU/FP32")
    with pytest.raises(epctx.InvalidGraph, match="Other CPU") as info:
        _load(ctx)
    assert "CPU/intel64/" in str(info.value)


def test_corrupted_binary_errors(tmp_path: Path) -> None:
    _, ctx = _generate(tmp_path, SMALL["mlp"]())
    path = tmp_path / BIN
    original = path.read_bytes()
    with ContextBinary.from_bytes(
        original
    ) as binary:  # a byte inside a payload (not in padding between them)
        blob = binary.entry(next(n for n in binary.names() if n.endswith("/blob")))
        inside = blob.offset + blob.size // 2
    flipped = bytearray(original)
    flipped[inside] ^= 0x10
    path.write_bytes(bytes(flipped))
    with pytest.raises(epctx.InvalidGraph, match="checksum"):
        _load(ctx)
    # A blob whose checksum is right but whose content OpenVINO refuses: OpenVINO's own error is the cause.
    with ContextBinary.from_bytes(original) as binary:
        writer = ContextBinaryWriter(ep_name=EP, sdk_version=binary.sdk_version, hardware=binary.hardware)
        for name in binary.names():
            data = binary.read(name)
            writer.add(name, bytes(data[: len(data) // 3]) if name.endswith("/blob") else data)
        writer.write(path)
    with pytest.raises(epctx.InvalidGraph, match="not the binary this model was made with"):
        _load(ctx)
    _rebind_identities(ctx)  # a binary the model names as its own, whose blob OpenVINO refuses
    with pytest.raises(epctx.InvalidGraph, match="failed to load") as info:
        _load(ctx)
    assert info.value.__cause__ is not None and not isinstance(info.value.__cause__, epctx.InvalidGraph)


def _rebind_identities(ctx: Path) -> None:
    """Record in each EPContext node the identity of the graph its binary holds now."""
    from epctx.epcontext.identity import IDENTITY_ATTRIBUTE, graph_identity

    model = onnx.load(ctx)
    with ContextBinary.open(ctx.parent / BIN) as binary:
        rows = [(i.name, i.kind, i.size, i.checksum, i.attrs) for i in map(binary.entry, binary.names())]
        for node in model.graph.node:
            graph = next(a.s.decode() for a in node.attribute if a.name == "partition_name")
            for attr in node.attribute:
                if attr.name == IDENTITY_ATTRIBUTE:
                    attr.s = graph_identity(graph, rows, binary.checksum_algorithm).encode()
    onnx.save(model, ctx)


def test_mismatched_partition_names_are_invalid_graph(tmp_path: Path) -> None:
    _, ctx = _generate(tmp_path, SMALL["mlp"]())
    model = onnx.load(ctx)
    node = model.graph.node[0]
    node.input[0] = "renamed"
    model.graph.input[0].name = "renamed"
    onnx.save(model, ctx)
    with pytest.raises(epctx.InvalidGraph, match="renamed"):
        _load(ctx)


# -- loading: no compile, runtime only, threads ---------------------------------------------------------
@pytest.mark.slow
def test_fresh_process_loads_without_compiling_or_the_onnx_frontend(tmp_path: Path) -> None:
    model = SMALL["resnet18"]()
    feeds = example_inputs("resnet18", model)
    sess, ctx = _generate(tmp_path, model)
    expected = sess.run(None, feeds)[0]
    np.save(tmp_path / "x.npy", feeds["input"])
    code = textwrap.dedent(
        f"""
        import sys, numpy as np, epctx
        assert "openvino" not in sys.modules  # importing epctx does not import OpenVINO
        from epctx.session.compile_guard import no_compile
        with no_compile():
            s = epctx.InferenceSession({str(ctx)!r}, providers=[{EP!r}])
        np.save({str(tmp_path / "y.npy")!r}, s.run(None, {{"input": np.load({str(tmp_path / "x.npy")!r})}})[0])
        maps = open("/proc/self/maps").read() if sys.platform.startswith("linux") else ""
        assert "onnx_frontend" not in maps, "loading a context model loaded OpenVINO's ONNX frontend"
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), expected)


@pytest.mark.slow
def test_generation_is_byte_identical_across_processes(tmp_path: Path) -> None:
    """OpenVINO names the nodes its transformations create from a process-wide counter, so two compiles in one
    process differ; fresh processes give the same bytes."""
    outs = []
    for name in ("a", "b"):
        folder = tmp_path / name
        folder.mkdir()
        onnx.save(SMALL["transformer"](), folder / "model.onnx")
        code = (
            "import epctx; so = epctx.SessionOptions(); so.add_session_config_entry('ep.context_enable', '1'); "
            f"epctx.InferenceSession({str(folder / 'model.onnx')!r}, so, providers=[{EP!r}])"
        )
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        subprocess.run([sys.executable, "-c", code], check=True, env=env)
        outs.append(((folder / "model_ctx.onnx").read_bytes(), (folder / BIN).read_bytes()))
    assert outs[0] == outs[1]


def test_threads_share_a_session(tmp_path: Path) -> None:
    model = SMALL["transformer"]()
    _, ctx = _generate(tmp_path, model)
    sess = _load(ctx)
    rng = np.random.default_rng(3)
    feeds = [{"input": rng.standard_normal((1, 6, 32)).astype(np.float32)} for _ in range(4)]
    expected = [sess.run(None, f)[0] for f in feeds]
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for _ in range(20):
                np.testing.assert_array_equal(sess.run(None, feeds[k])[0], expected[k])
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_inputs_that_cannot_be_shared_are_copied(tmp_path: Path) -> None:
    """Read-only and non-contiguous inputs, integer inputs and several outputs."""
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "W")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["y"], name="mm"),
        helper.make_node("Add", ["k", "k"], ["z"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("k", TensorProto.INT64, [3]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3]),
            helper.make_tensor_value_info("z", TensorProto.INT64, [3]),
        ],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = epctx.InferenceSession(model.SerializeToString(), providers=[EP])
    x = np.arange(40, dtype=np.float32).reshape(4, 10)[:, ::3].T.copy().T  # non-contiguous after .T
    x.flags.writeable = False
    k = np.array([1, 2, 3], np.int64)
    y, z = sess.run(None, {"x": x, "k": k})
    _close(y, x @ np.arange(12, dtype=np.float32).reshape(4, 3))
    assert z.dtype == np.int64 and z.tolist() == [2, 4, 6]


def test_control_flow_with_outer_references(tmp_path: Path) -> None:
    from tests.test_partition_extract import _if_model

    model = _if_model()
    _, ctx = _generate(tmp_path, model)
    assert [n.op_type for n in onnx.load(ctx).graph.node] == ["EPContext"]
    sess = _load(ctx)
    for cond in (True, False):
        feeds = {"x": np.arange(8, dtype=np.float32).reshape(2, 4) - 3, "cond": np.array(cond)}
        _close(sess.run(None, feeds)[0], run_ort(model, feeds)[0])


def test_binary_records_precision_device_and_names(tmp_path: Path) -> None:
    import json

    _generate(tmp_path, SMALL["mlp"](), {"num_of_threads": "1"})
    with ContextBinary.open(tmp_path / BIN) as binary:
        (meta_name,) = [n for n in binary.names() if n.endswith("/meta")]
        meta = json.loads(bytes(binary.read(meta_name)))
        assert binary.hardware == OpenVINOExecutionProvider().hardware()
    assert meta["device"] == "CPU" and meta["inputs"] == ["input"] and meta["outputs"] == ["output"]
    assert meta["config"] == {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1}


def _rewrite_meta(path: Path, change: Any) -> str:
    """Rewrite the binary at ``path`` with ``change(meta)`` applied to its one ``meta`` document (checksums
    recomputed: a crafted file, not a corrupt one); returns the graph name."""
    import json

    with ContextBinary.from_bytes(path.read_bytes()) as binary:
        writer = ContextBinaryWriter(ep_name=EP, sdk_version=binary.sdk_version, hardware=binary.hardware)
        (meta_name,) = [n for n in binary.names() if n.endswith("/meta")]
        for name in binary.names():
            data = binary.read(name)
            if name == meta_name:
                meta = json.loads(bytes(data))
                change(meta)
                data = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()  # type: ignore[assignment]
            writer.add(name, data)
        writer.write(path)
    return meta_name[: -len("/meta")]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("CACHE_DIR", None),
        ("WEIGHTS_PATH", "/etc/passwd"),
        ("NUM_STREAMS", -1),
        ("INFERENCE_PRECISION_HINT", "i8"),
    ],
)
def test_binary_config_outside_the_allow_list_is_refused(tmp_path: Path, key: str, value: Any) -> None:
    """A crafted binary whose stored OpenVINO config asks for CACHE_DIR (or any key or value epctx never
    writes) is InvalidGraph naming the key; the folder is never created."""
    from epctx.ep._context_node import EPContextNode
    from epctx.ep._contract import Partition
    from epctx.epcontext.store import ContextSource

    work = tmp_path / "work"
    work.mkdir()
    _, ctx = _generate(work, SMALL["mlp"]())
    evil = tmp_path / "evil_cache_dir"
    value = str(evil) if value is None else value
    graph = _rewrite_meta(work / BIN, lambda meta: meta["config"].__setitem__(key, value))
    with pytest.raises(epctx.InvalidGraph):
        _load(ctx)
    # The EP itself, whatever the framework checks first: the key is named.
    ep = OpenVINOExecutionProvider()
    with ContextBinary.open(work / BIN) as binary:
        node = EPContextNode(name=graph, inputs=("input",), outputs=("output",), source=EP)
        part = Partition(graph, EP, (), (ir.Value(name="input"),), (ir.Value(name="output"),), (), {})
        with pytest.raises(epctx.InvalidGraph, match=key):
            ep.load_partition(ContextSource(binary, graph), node, part)
    assert not evil.exists()
    assert sorted(p.name for p in work.iterdir()) == sorted(["model.onnx", "model_ctx.onnx", BIN])


def test_two_precisions_compiled_into_one_folder_each_run_their_own_binary(tmp_path: Path) -> None:
    """The f32 / f16 situation: same input, two outputs in one folder. Each output's binary takes its stem, so
    f32.onnx keeps running the f32 blob (before, the f16 compile overwrote model_<EP>.bin under it)."""
    from epctx.cli import main as cli_main

    model = SMALL["transformer"]()
    onnx.save(model, tmp_path / "model.onnx")
    for precision in ("f32", "f16"):
        out = tmp_path / f"{precision}.onnx"
        assert (
            cli_main(
                [
                    "compile",
                    str(tmp_path / "model.onnx"),
                    "-p",
                    f"{EP}:precision={precision}",
                    "-o",
                    str(out),
                    "-q",
                ]
            )
            == 0
        )
    assert {p.name for p in tmp_path.glob("*.bin")} == {f"f32_{EP}.bin", f"f16_{EP}.bin"}
    feeds = example_inputs("transformer", model)
    expected = run_ort(model, feeds)[0]
    errors = {
        p: float(np.abs(_load(tmp_path / f"{p}.onnx").run(None, feeds)[0] - expected).max())
        for p in ("f32", "f16")
    }
    assert errors["f32"] < 1e-4, errors
    assert errors["f16"] > errors["f32"], errors  # the f16 blob really is another binary
