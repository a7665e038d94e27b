"""Fuzzed context models load and run to the right output or fail with a typed epctx error, never another
exception (issue 7). The fuzzer is ``tests/epcontext/context_fuzz.py``; ``benchmarks/fuzz_context.py`` runs
more cases. ``pytest -s`` prints the counts (typed / correct / wrong / uncovered / untyped).

Also the typed errors for the situations the fuzzer found or the issue names: bad ``ep_cache_context`` paths,
names that are not UTF-8, impossible feeds, kernels and compiled partitions failing at run time.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import epctx
from tests.epcontext.context_fuzz import CaseResult, ContextFuzzer, summarize
from tests.epcontext.models import EXAMPLE, feed, two_partition_model

# Compiles with IREE, exports with torch or runs many whole models: `make test-fast` leaves it out.
pytestmark = pytest.mark.slow

_CHUNKS = 8
_PER_CHUNK = 300  # 2,400 cases: about 5-10 s on a shared 2-core machine
_RESULTS: list[CaseResult] = []


@pytest.fixture(scope="module", params=["partial", "whole"])
def fuzzer(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> ContextFuzzer:
    """ "partial": CPU nodes remain (the full loader); "whole": EPContext nodes only (the lean load path)."""
    return ContextFuzzer(tmp_path_factory.mktemp("fuzz"), whole=request.param == "whole")


@pytest.mark.parametrize("chunk", range(_CHUNKS))
def test_fuzzed_context_models_are_correct_or_typed(fuzzer: ContextFuzzer, chunk: int) -> None:
    results = list(fuzzer.run_many(range(chunk * _PER_CHUNK, (chunk + 1) * _PER_CHUNK)))
    _RESULTS.extend(results)
    untyped = [r for r in results if r.outcome == "untyped"]
    wrong = [r for r in results if r.outcome == "wrong"]
    assert not untyped, "\n".join(
        f"seed {r.seed} ({r.mutation}, embed {r.embed}): {r.detail}" for r in untyped
    )
    assert not wrong, "\n".join(f"seed {r.seed} ({r.mutation}, embed {r.embed}): {r.detail}" for r in wrong)
    # Nothing hangs or crawls: a mutated model fails or runs as fast as a good one.
    assert max(r.seconds for r in results) < 5.0


def test_fuzz_summary() -> None:
    """Prints the table (``pytest -s``); runs after the chunks (same module, definition order)."""
    if len(_RESULTS) < 2 * _CHUNKS * _PER_CHUNK:
        pytest.skip("the fuzz chunks did not all run")
    print(f"\ncontext-model fuzz, {len(_RESULTS)} cases (seeds 0..{len(_RESULTS) - 1}):")
    print(summarize(_RESULTS))
    counts = Counter(r.outcome for r in _RESULTS)
    assert counts["untyped"] == 0 and counts["wrong"] == 0
    # The fuzzer reaches every class it should: refusals, and mutations that change nothing that matters.
    assert counts["typed"] > len(_RESULTS) // 2 and counts["correct"] > 0


# -- the situations the issue names ---------------------------------------------------------------------
def _options(**config: str) -> epctx.SessionOptions:
    so = epctx.SessionOptions()
    for key, value in config.items():
        so.add_session_config_entry(key, value)
    return so


@pytest.fixture
def context_model(tmp_path: Path) -> Path:
    onnx.save(two_partition_model(), tmp_path / "model.onnx")
    epctx.InferenceSession(
        str(tmp_path / "model.onnx"), _options(**{"ep.context_enable": "1"}), providers=[EXAMPLE]
    )
    return tmp_path / "model_ctx.onnx"


def _with_path(ctx: Path, path: bytes) -> Path:
    model = onnx.load(ctx)
    for attr in model.graph.node[0].attribute:
        if attr.name == "ep_cache_context":
            attr.s = path
    out = ctx.with_name("edited.onnx")
    out.write_bytes(model.SerializeToString())
    return out


@pytest.mark.parametrize(
    ("path", "match"),
    [
        (b"model_\x00.bin", "NUL byte"),
        (b"loop_a", "cannot be resolved"),
        (b"n" * 300, "cannot be resolved.*too long"),
        (b"d/" * 3000 + b"x.bin", "cannot be resolved"),
        (b"\xff\xfe.bin", "not a UTF-8 path"),
        (b"../model_ExampleExecutionProvider.bin", r"leaves the model folder \('\.\.'\)"),
        (b"/etc/passwd", "is absolute"),
        (b"fifo.bin", "does not exist or is not a file"),
    ],
)
def test_bad_context_paths_are_invalid_graph_naming_node_and_path(
    context_model: Path, path: bytes, match: str
) -> None:
    folder = context_model.parent
    os.symlink("loop_b", folder / "loop_a")
    os.symlink("loop_a", folder / "loop_b")
    os.mkfifo(folder / "fifo.bin")
    node = onnx.load(context_model).graph.node[0].name
    with pytest.raises(epctx.InvalidGraph, match=match) as info:
        epctx.InferenceSession(str(_with_path(context_model, path)), providers=[EXAMPLE])
    assert f"EPContext node {node!r}" in str(info.value)
    if b"\xff" not in path:
        assert repr(path.decode())[:60] in str(info.value) or "NUL" in str(info.value)


def _replace_name(model: onnx.ModelProto, old: bytes, new: bytes) -> bytes:
    """Serialized ``model`` with every string ``old`` (length-prefixed) replaced by ``new`` (same length)."""
    assert len(old) == len(new)
    data = model.SerializeToString()
    marker = bytes([len(old)]) + old
    assert marker in data
    return data.replace(marker, bytes([len(new)]) + new)


@pytest.mark.parametrize(
    ("old", "new", "match"),
    [
        (b"relu", b"r\xfflu", r"node 1 of graph 'two_partitions': its name is not UTF-8 text: 'r\\\\xfflu'"),
        (b"two_partitions", b"two_partition\xc3", "the graph name is not UTF-8"),
        (b"ln_scale", b"ln_scal\xed", "not UTF-8"),  # the checker's message quotes it
        (b"Relu", b"R\x80lu", "not UTF-8"),
        (b"a", b"\xa0", "not UTF-8"),  # a value name, everywhere it appears
    ],
)
def test_names_that_are_not_utf8_are_invalid_graph_naming_the_file(
    tmp_path: Path, old: bytes, new: bytes, match: str
) -> None:
    path = tmp_path / "bad.onnx"
    path.write_bytes(_replace_name(two_partition_model(), old, new))
    with pytest.raises(epctx.InvalidGraph, match=match) as info:
        epctx.InferenceSession(str(path))
    assert str(path) in str(info.value)
    with pytest.raises(epctx.InvalidGraph, match="model bytes"):
        epctx.InferenceSession(path.read_bytes())


def test_free_text_that_is_not_utf8_is_decoded_with_replacements(tmp_path: Path) -> None:
    model = two_partition_model()
    model.doc_string = "docs"
    data = _replace_name(model, b"docs", b"d\xffcs")
    data = data.replace(b"\x06origin", b"\x06or\xffgin")
    sess = epctx.InferenceSession(data)
    meta = sess.get_modelmeta()
    assert meta.description == "d\ufffdcs" and meta.custom_metadata_map == {"or\ufffdgin": "tests"}
    np.testing.assert_array_equal(
        sess.run(None, feed())[0], epctx.InferenceSession(model.SerializeToString()).run(None, feed())[0]
    )


def test_feed_contradicting_static_dims_is_invalid_argument_in_onnxruntime_words() -> None:
    sess = epctx.InferenceSession(two_partition_model().SerializeToString(), providers=[EXAMPLE])
    message = (
        "Got invalid dimensions for input: x for the following indices\n index: 1 Got: 5 Expected: 8\n"
        " Please fix either the inputs/outputs or the model."
    )
    with pytest.raises(epctx.InvalidArgument, match=re.escape(message)):
        sess.run(None, {"x": np.zeros((3, 5), np.float32)})
    with pytest.raises(epctx.InvalidArgument, match="Invalid rank for input: x Got: 3 Expected: 2"):
        sess.run(None, {"x": np.zeros((1, 3, 8), np.float32)})
    with pytest.raises(
        epctx.InvalidArgument, match=re.escape("Unexpected input data type. Actual: (tensor(double))")
    ):
        sess.run(None, {"x": np.zeros((3, 8))})


def _dynamic_matmul_model() -> onnx.ModelProto:
    """x: [N, K] with K unknown, MatMul by an (8, 4) weight then Reshape to [-1, 3]: the feed check cannot see
    that K must be 8 or that N * 4 must divide by 3."""
    w = numpy_helper.from_array(np.ones((8, 4), np.float32), "w")
    shape = numpy_helper.from_array(np.array([-1, 3], np.int64), "s")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
            helper.make_node("Reshape", ["h", "s"], ["y"], name="reshape_y"),
        ],
        "dyn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "K"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w, shape],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_kernel_failing_at_run_is_fail_naming_the_node() -> None:
    sess = epctx.InferenceSession(_dynamic_matmul_model().SerializeToString())
    with pytest.raises(epctx.Fail, match=r"running Reshape node\. Name:'reshape_y' Status Message: "):
        sess.run(None, {"x": np.ones((2, 8), np.float32)})  # 2 x 4 = 8 elements: not a multiple of 3
    with pytest.raises(epctx.Fail, match=r"running MatMul node\. Name:'mm'"):
        sess.run(None, {"x": np.ones((3, 5), np.float32)})
    assert sess.run(None, {"x": np.ones((3, 8), np.float32)})[0].shape == (4, 3)  # the session still works


def test_compiled_partition_failing_at_run_is_fail_naming_the_partition(context_model: Path) -> None:
    model = onnx.load(context_model)
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "K"  # hide the static 8 from the check
    sess = epctx.InferenceSession(
        model.SerializeToString(),
        _options(**{"ep.context_file_path": str(context_model)}),
        providers=[EXAMPLE],
    )
    partition = model.graph.node[0].name
    with pytest.raises(epctx.Fail, match=rf"while running .*{re.escape(partition)}.* Status Message: "):
        sess.run(None, {"x": np.ones((3, 5), np.float32)})
    np.testing.assert_array_equal(
        sess.run(None, feed())[0],
        epctx.InferenceSession(str(context_model), providers=[EXAMPLE]).run(None, feed())[0],
    )


def test_empty_batch_through_a_context_model(context_model: Path) -> None:
    sess = epctx.InferenceSession(str(context_model), providers=[EXAMPLE])
    (y,) = sess.run(None, feed(n=0))
    assert y.shape == (0, 4) and y.dtype == np.float32
