"""The lean load path (issue 11): a context model whose nodes are all EPContext nodes is read by the lean
reader (``epctx.model.lean``) without onnx or onnx-ir, and gives the same session as the full loader: inputs,
outputs, metadata, placement, results, and for a damaged file the same typed error."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import epctx
import epctx.session.lean
from epctx.model.lean import read_context_model
from tests.epcontext.context_fuzz import ContextFuzzer
from tests.epcontext.models import EXAMPLE, feed, two_partition_model, whole_model

HAS_OPENVINO = importlib.util.find_spec("openvino") is not None
OPENVINO = "OpenVINOExecutionProvider"
# What loading a context model must not import: onnx, onnx-ir, generation, the CPU kernel table, the
# full loader and the partitioner.
FORBIDDEN = (
    "onnx",
    "onnx_ir",
    "epctx.epcontext.generate",
    "epctx.epcontext.writer",
    "epctx.epcontext.transaction",
    "epctx.providers.cpu.kernels",
    "epctx.model.load",
    "epctx.partition",
)


def _compile(model: onnx.ModelProto, folder: Path, ep: str, *, embed: int = 0, name: str = "model") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / f"{name}.onnx"
    onnx.save(model, source)
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.context_embed_mode", str(embed))
    epctx.InferenceSession(str(source), so, providers=[ep])
    return folder / f"{name}_ctx.onnx"


def _context_models(root: Path) -> dict[str, tuple[Path, str]]:
    made = {
        "example_embed0": (_compile(whole_model(), root / "e0", EXAMPLE, embed=0), EXAMPLE),
        "example_embed1": (_compile(whole_model(), root / "e1", EXAMPLE, embed=1), EXAMPLE),
    }
    if HAS_OPENVINO:
        made["openvino"] = (_compile(whole_model(), root / "ov", OPENVINO), OPENVINO)
    return made


@pytest.fixture(scope="module")
def context_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    return _context_models(tmp_path_factory.mktemp("lean"))


def _full_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sessions made after this use the full loader (the lean reader declines every model)."""
    monkeypatch.setattr(epctx.session.lean, "read_context_model", lambda data: None)


def _describe(session: epctx.InferenceSession) -> dict[str, Any]:
    meta = session.get_modelmeta()
    return {
        "inputs": [repr(a) for a in session.get_inputs()],
        "outputs": [repr(a) for a in session.get_outputs()],
        "overridable": [repr(a) for a in session.get_overridable_initializers()],
        "meta": repr(meta),
        "providers": session.get_providers(),
        "partitions": session.get_partitions(),
    }


@pytest.mark.parametrize("which", ["example_embed0", "example_embed1", "openvino"])
def test_lean_session_is_the_full_loaders_session(
    context_models: dict[str, tuple[Path, str]], which: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if which not in context_models:
        pytest.skip("OpenVINO is not installed")
    path, ep = context_models[which]
    assert read_context_model(path.read_bytes()) is not None, "the lean reader declined a context model"
    lean = epctx.InferenceSession(str(path), providers=[ep])
    assert lean._loaded is None  # made on the lean path: the model was never loaded with onnx-ir
    _full_path(monkeypatch)
    full = epctx.InferenceSession(str(path), providers=[ep])
    assert full._loaded is not None
    assert _describe(lean) == _describe(full)
    for n in (1, 3):
        x = feed(seed=n, n=n)
        for got, want in zip(lean.run(None, x), full.run(None, x), strict=True):
            np.testing.assert_array_equal(got, want)
    # The model itself is still there for who asks (loaded on first access).
    assert [n.op_type for n in lean.model.graph] == [n.op_type for n in full.model.graph]


def test_lean_session_from_bytes_with_embedded_binary(context_models: dict[str, tuple[Path, str]]) -> None:
    path, ep = context_models["example_embed1"]
    from_bytes = epctx.InferenceSession(path.read_bytes(), providers=[ep])
    assert from_bytes._loaded is None
    from_file = epctx.InferenceSession(str(path), providers=[ep])
    np.testing.assert_array_equal(from_bytes.run(None, feed())[0], from_file.run(None, feed())[0])


def test_models_the_lean_reader_declines_go_to_the_full_loader(tmp_path: Path) -> None:
    plain = whole_model()
    assert read_context_model(plain.SerializeToString()) is None  # not a context model
    partial = _compile(two_partition_model(), tmp_path / "p", EXAMPLE)
    assert read_context_model(partial.read_bytes()) is None  # a CPU node and its initializers remain
    session = epctx.InferenceSession(str(partial), providers=[EXAMPLE])
    assert session._loaded is not None and session.run(None, feed())[0].shape == (3, 4)
    for junk in (b"", b"\x00", b"not an onnx model at all", bytes(range(256))):
        assert read_context_model(junk) is None


@pytest.mark.slow
@pytest.mark.parametrize("ep", [EXAMPLE, OPENVINO])
def test_loading_a_context_model_imports_neither_onnx_nor_onnx_ir(tmp_path: Path, ep: str) -> None:
    """In a fresh interpreter: ``import epctx``, a session over a context model and a run import neither onnx
    nor onnx-ir, nothing of generation, not the CPU kernels, the full loader or the partitioner."""
    if ep == OPENVINO and not HAS_OPENVINO:
        pytest.skip("OpenVINO is not installed")
    path = _compile(whole_model(), tmp_path, ep)
    script = f"""
import json, sys
import numpy as np
import epctx
session = epctx.InferenceSession({str(path)!r}, providers=[{ep!r}])
out = session.run(None, {{"x": np.ones((2, 8), np.float32)}})[0]
forbidden = {FORBIDDEN!r}
found = sorted(m for m in sys.modules if m in forbidden or m.startswith(tuple(f + "." for f in forbidden)))
print(json.dumps({{"found": found, "shape": list(out.shape), "lean": "epctx.model.lean" in sys.modules}}))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["found"] == [], f"loading a context model imported {report['found']}"
    assert report["lean"] and report["shape"] == [2, 4]


def _outcome(path: Path, ep: str, x: dict[str, np.ndarray]) -> str:
    try:
        outputs = epctx.InferenceSession(str(path), providers=[ep]).run(None, x)
    except epctx.errors.EPCtxError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "ran: " + ",".join(np.asarray(o).tobytes().hex()[:64] for o in outputs)


@pytest.mark.slow
def test_damaged_context_models_fail_alike_on_both_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bit flips, truncation, edited attributes, path attacks, foreign binaries (the context fuzzer's
    mutations) of an EPContext-only model: the lean path gives the full loader's outcome, error for error."""
    fuzzer = ContextFuzzer(tmp_path / "fuzz", whole=True)
    x = feed()
    differ = []
    cases = 0
    for seed in range(240):
        with fuzzer.mutated(seed) as (path, _, name, mutated):
            lean = _outcome(path, EXAMPLE, x)
            with monkeypatch.context() as patch:
                _full_path(patch)
                full = _outcome(path, EXAMPLE, x)
            cases += 1
            if lean != full:
                differ.append(f"seed {seed} ({name}: {mutated.description}):\n  lean: {lean}\n  full: {full}")
    assert cases == 240
    assert not differ, "\n".join(differ[:10])


@pytest.mark.slow
def test_compiling_a_model_one_ep_takes_whole_does_not_import_the_cpu_kernels(tmp_path: Path) -> None:
    """The cold path: when the compiling EP takes every node, the CPU EP is never asked, so its kernel table
    (and onnx.reference) stays unimported. With the measured rule off: the rule (on by default) runs the
    partition's nodes on the CPU EP to time them, which imports its kernels."""
    source = tmp_path / "model.onnx"
    onnx.save(whole_model(), source)
    script = f"""
import json, sys
import numpy as np
import epctx
so = epctx.SessionOptions()
so.add_session_config_entry("epctx.partition.measured_rule", "0")
session = epctx.InferenceSession({str(source)!r}, so, providers=[{EXAMPLE!r}])
session.run(None, {{"x": np.ones((2, 8), np.float32)}})
print(json.dumps(sorted(m for m in sys.modules if m.startswith(("epctx.providers.cpu.kernels", "onnx.reference")))))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_a_profiled_lean_session_records_each_context_load_and_step(
    context_models: dict[str, tuple[Path, str]], tmp_path: Path
) -> None:
    path, ep = context_models["example_embed0"]
    so = epctx.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "lean")
    session = epctx.InferenceSession(str(path), so, providers=[ep])
    assert session._loaded is None  # still the lean path
    session.run(None, feed())
    events = json.loads(Path(session.end_profiling()).read_text())
    names = [e["name"] for e in events]
    node = session.get_partitions()[0][1][0]
    assert f"{node}_context_load" in names and f"{node}_kernel_time" in names
    assert "model_loading_uri" in names and "session_initialization" in names


@pytest.mark.slow
def test_an_iree_context_model_loads_without_onnx_or_the_iree_compiler(tmp_path: Path) -> None:
    """Issue 9: loading imports only iree.runtime (never iree.compiler), and the lean path no onnx either."""
    if "IREEExecutionProvider" not in epctx.get_available_providers():
        pytest.skip("the IREE EP is not available")
    path = _compile(whole_model(), tmp_path, "IREEExecutionProvider")
    assert read_context_model(path.read_bytes()) is not None
    script = f"""
import json, sys
import numpy as np
import epctx
from epctx.testing import no_compile
with no_compile():
    session = epctx.InferenceSession({str(path)!r}, providers=["IREEExecutionProvider"])
    out = session.run(None, {{"x": np.ones((2, 8), np.float32)}})[0]
found = sorted(m for m in sys.modules if m.split(".")[0] in ("onnx", "onnx_ir") or m.startswith("iree.compiler"))
print(json.dumps({{"found": found, "runtime": "iree.runtime" in sys.modules, "shape": list(out.shape)}}))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"found": [], "runtime": True, "shape": [2, 4]}
