"""Every Generation and Loading scenario of EP_CONTEXT_SPEC.md, with the example EP and the CPU EP. The
scenarios every compiling EP must pass (embed mode 1 round trip, a fresh process loading without compiling,
the node-name prefix) are cases of the conformance suite: tests/test_conformance.py."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest

import epctx
from epctx.testing import no_compile
from tests.epcontext.models import EXAMPLE, feed, two_partition_model
from tests.oracle import run_ort


def _options(**config: str) -> epctx.SessionOptions:
    so = epctx.SessionOptions()
    for key, value in config.items():
        so.add_session_config_entry(key.replace("__", "."), value)
    return so


def _generate(tmp_path: Path, model: onnx.ModelProto | None = None, **config: str) -> tuple[Path, np.ndarray]:
    """Save the model, run a generating session from its path; returns (source path, its output)."""
    src = tmp_path / "model.onnx"
    onnx.save(model or two_partition_model(), src)
    sess = epctx.InferenceSession(str(src), _options(ep__context_enable="1", **config), providers=[EXAMPLE])
    return src, sess.run(None, feed())[0]


def _ctx_nodes(path: Path) -> list[onnx.NodeProto]:
    return [n for n in onnx.load(path, load_external_data=False).graph.node if n.op_type == "EPContext"]


def _attrs(node: onnx.NodeProto) -> dict[str, object]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _load(path: Path | bytes, **config: str) -> epctx.InferenceSession:
    with no_compile():
        return epctx.InferenceSession(
            path if isinstance(path, bytes) else str(path), _options(**config), providers=[EXAMPLE]
        )


def test_generate_from_path_embed0_default_names(tmp_path):
    _, expected = _generate(tmp_path)
    np.testing.assert_allclose(expected, run_ort(two_partition_model(), feed())[0], atol=1e-5)
    ctx = tmp_path / "model_ctx.onnx"
    assert {p.name for p in tmp_path.iterdir()} == {"model.onnx", "model_ctx.onnx", f"model_{EXAMPLE}.bin"}
    nodes = _ctx_nodes(ctx)
    assert [_attrs(n)["main_context"] for n in nodes] == [1, 0]  # one binary per EP, first node is main
    main, other = (_attrs(n) for n in nodes)
    assert main["ep_cache_context"] == f"model_{EXAMPLE}.bin".encode()
    assert main["embed_mode"] == 0 and main["source"] == EXAMPLE.encode()
    assert "ep_cache_context" not in other and other["partition_name"]
    model = onnx.load(ctx)
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["origin"] == "tests" and f"ep_compatibility_info.{EXAMPLE}" in meta
    assert {o.domain: o.version for o in model.opset_import} == {"": 17, "com.microsoft": 1}
    # Only the CPU node's initializers stay; the EP's weights live in its binary.
    assert sorted(i.name for i in model.graph.initializer) == ["ln_bias", "ln_scale"]
    assert [i.name for i in model.graph.input] == ["x"] and [o.name for o in model.graph.output] == ["y"]
    out = _load(ctx).run(None, feed())[0]
    np.testing.assert_allclose(out, expected, atol=1e-5)


def test_context_file_path_option_and_subfolder(tmp_path):
    target = tmp_path / "out" / "custom.onnx"
    _, expected = _generate(tmp_path, ep__context_file_path=str(target))
    # The binary takes the output model's stem: two outputs in one folder never share a binary name.
    assert {p.name for p in target.parent.iterdir()} == {"custom.onnx", f"custom_{EXAMPLE}.bin"}
    np.testing.assert_allclose(_load(target).run(None, feed())[0], expected, atol=1e-5)
    # Subfolders are allowed: move the binary and point the node at it.
    sub = target.parent / "bins"
    sub.mkdir()
    (target.parent / f"custom_{EXAMPLE}.bin").rename(sub / "b.bin")
    model = onnx.load(target)
    for a in model.graph.node[0].attribute:
        if a.name == "ep_cache_context":
            a.s = b"bins/b.bin"
    onnx.save(model, target)
    np.testing.assert_allclose(_load(target).run(None, feed())[0], expected, atol=1e-5)


def test_context_file_path_folder_is_rejected(tmp_path):
    with pytest.raises(epctx.InvalidArgument, match="must name a file"):
        _generate(tmp_path, ep__context_file_path=str(tmp_path))


def test_generate_from_bytes_needs_context_file_path(tmp_path):
    data = two_partition_model().SerializeToString()
    with pytest.raises(epctx.InvalidArgument, match="ep.context_file_path"):
        epctx.InferenceSession(data, _options(ep__context_enable="1"), providers=[EXAMPLE])
    target = tmp_path / "from_bytes_ctx.onnx"
    sess = epctx.InferenceSession(
        data, _options(ep__context_enable="1", ep__context_file_path=str(target)), providers=[EXAMPLE]
    )
    expected = sess.run(None, feed())[0]
    assert (tmp_path / f"from_bytes_{EXAMPLE}.bin").is_file()
    np.testing.assert_allclose(_load(target).run(None, feed())[0], expected, atol=1e-5)


def test_bytes_context_model_embed0_needs_context_file_path(tmp_path):
    _, expected = _generate(tmp_path)
    data = (tmp_path / "model_ctx.onnx").read_bytes()
    with pytest.raises(epctx.InvalidArgument, match="ep.context_file_path"):
        _load(data)
    sess = _load(data, ep__context_file_path=str(tmp_path / "model_ctx.onnx"))
    np.testing.assert_allclose(sess.run(None, feed())[0], expected, atol=1e-5)


def test_from_bytes_with_external_weights_and_folder_option(tmp_path):
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    onnx.save(two_partition_model(), src_dir / "m.onnx", save_as_external_data=True, location="m.data",
              size_threshold=0)  # fmt: skip
    data = (src_dir / "m.onnx").read_bytes()
    out = tmp_path / "out" / "m_ctx.onnx"
    so = _options(
        ep__context_enable="1",
        ep__context_file_path=str(out),
        session__model_external_initializers_file_folder_path=str(src_dir),
    )
    expected = epctx.InferenceSession(data, so, providers=[EXAMPLE]).run(None, feed())[0]
    np.testing.assert_allclose(expected, run_ort(two_partition_model(), feed())[0], atol=1e-5)
    # The generated model never references the source's files: CPU-fallback weights are embedded.
    model = onnx.load(out, load_external_data=False)
    assert all(i.data_location != onnx.TensorProto.EXTERNAL for i in model.graph.initializer)
    (src_dir / "m.data").unlink()
    np.testing.assert_allclose(_load(out).run(None, feed())[0], expected, atol=1e-5)


def test_external_initializers_file_option(tmp_path):
    _, expected = _generate(tmp_path, ep__context_model_external_initializers_file_name="weights.data")
    model = onnx.load(tmp_path / "model_ctx.onnx", load_external_data=False)
    assert model.graph.initializer and all(
        i.data_location == onnx.TensorProto.EXTERNAL for i in model.graph.initializer
    )
    assert (tmp_path / "weights.data").is_file()
    np.testing.assert_allclose(_load(tmp_path / "model_ctx.onnx").run(None, feed())[0], expected, atol=1e-5)


def test_output_exists_is_an_error_and_no_compiled_node_writes_nothing(tmp_path, caplog):
    src, _ = _generate(tmp_path)
    with pytest.raises(epctx.Fail, match="exists already"):
        epctx.InferenceSession(str(src), _options(ep__context_enable="1"), providers=[EXAMPLE])
    other = tmp_path / "cpu_only"
    other.mkdir()
    onnx.save(two_partition_model(), other / "m.onnx")
    with caplog.at_level(logging.WARNING, logger="epctx"):
        epctx.InferenceSession(str(other / "m.onnx"), _options(ep__context_enable="1"))
    assert "no node was compiled" in caplog.text
    assert sorted(p.name for p in other.iterdir()) == ["m.onnx"]


def test_generation_is_byte_identical(tmp_path):
    outs = []
    for name in ("a", "b"):
        folder = tmp_path / name
        folder.mkdir()
        _generate(folder)
        outs.append(
            ((folder / "model_ctx.onnx").read_bytes(), (folder / f"model_{EXAMPLE}.bin").read_bytes())
        )
    assert outs[0] == outs[1]


def test_disable_model_compile(tmp_path):
    src, expected = _generate(tmp_path)
    with pytest.raises(
        epctx.ModelRequiresCompilation,
        match="ExampleExecutionProvider was asked to compile 2 partition.s. with session.disable_model_compile=1",
    ):
        epctx.InferenceSession(str(src), _options(session__disable_model_compile="1"), providers=[EXAMPLE])
    sess = _load(tmp_path / "model_ctx.onnx", session__disable_model_compile="1")
    np.testing.assert_allclose(sess.run(None, feed())[0], expected, atol=1e-5)


def test_node_whose_source_no_ep_accepts(tmp_path):
    _generate(tmp_path)
    with pytest.raises(epctx.InvalidGraph, match="ExampleExecutionProvider.*CPUExecutionProvider"):
        epctx.InferenceSession(str(tmp_path / "model_ctx.onnx"))


def _set_cache_path(ctx: Path, value: bytes) -> None:
    model = onnx.load(ctx)
    for a in model.graph.node[0].attribute:
        if a.name == "ep_cache_context":
            a.s = value
    onnx.save(model, ctx)


@pytest.mark.parametrize("attack", ["absolute", "dotdot", "symlink"])
def test_path_attacks_are_invalid_graph(tmp_path, attack):
    _generate(tmp_path)
    ctx = tmp_path / "model_ctx.onnx"
    outside = tmp_path.parent / f"outside_{tmp_path.name}.bin"
    outside.write_bytes((tmp_path / f"model_{EXAMPLE}.bin").read_bytes())
    if attack == "absolute":
        _set_cache_path(ctx, str(outside).encode())
    elif attack == "dotdot":
        _set_cache_path(ctx, f"../{outside.name}".encode())
    else:
        (tmp_path / "link.bin").symlink_to(outside)
        _set_cache_path(ctx, b"link.bin")
    with pytest.raises(epctx.InvalidGraph, match="absolute|leaves the model folder|outside the model folder"):
        _load(ctx)


def test_corrupted_and_truncated_binaries(tmp_path):
    _, expected = _generate(tmp_path)
    ctx = tmp_path / "model_ctx.onnx"
    binary = tmp_path / f"model_{EXAMPLE}.bin"
    original = binary.read_bytes()
    flipped = bytearray(original)
    flipped[-5] ^= 0x40  # a byte of the last payload (weights)
    binary.write_bytes(bytes(flipped))
    with pytest.raises(
        epctx.InvalidGraph, match=r"EPContext node 'ExampleExecutionProvider_\w+' \(source .*checksum"
    ):
        _load(ctx).run(None, feed())
    binary.write_bytes(original[: len(original) // 2])
    with pytest.raises(epctx.InvalidGraph, match="truncated|size"):
        _load(ctx)
    binary.unlink()
    with pytest.raises(epctx.InvalidGraph, match="does not exist"):
        _load(ctx)
    binary.write_bytes(original)
    np.testing.assert_allclose(_load(ctx).run(None, feed())[0], expected, atol=1e-5)


def test_sdk_version_mismatch_names_node_source_expected_and_found(tmp_path, monkeypatch):
    _generate(tmp_path)
    import epctx.providers.example.provider as example

    # A newer example EP whose program format moved on: the old binary must be refused, not misread.
    monkeypatch.setattr(example, "PROGRAM_VERSION", 99)
    with pytest.raises(epctx.InvalidGraph) as info:
        _load(tmp_path / "model_ctx.onnx")
    message = str(info.value)
    assert EXAMPLE in message and "99" in message and "'1'" in message  # source, expected, found
    assert "ExampleExecutionProvider_" in message  # the node


def test_main_context_zero_is_served_from_its_main_context(tmp_path):
    _, expected = _generate(tmp_path)
    nodes = _ctx_nodes(tmp_path / "model_ctx.onnx")
    assert _attrs(nodes[1])["main_context"] == 0
    np.testing.assert_allclose(_load(tmp_path / "model_ctx.onnx").run(None, feed())[0], expected, atol=1e-5)
    # A main_context=0 node whose graph no main context holds is an error naming the graph.
    model = onnx.load(tmp_path / "model_ctx.onnx")
    for a in model.graph.node[-1].attribute:
        if a.name == "partition_name":
            a.s = b"no_such_graph"
    onnx.save(model, tmp_path / "broken_ctx.onnx")
    with pytest.raises(epctx.InvalidGraph, match="no_such_graph"):
        _load(tmp_path / "broken_ctx.onnx")
