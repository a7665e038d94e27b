"""Untrusted input without a policy: a payload whose checksums and identity were recomputed by epctx's own writer
reaches the backend, which must refuse what it can validate with a typed error naming the node, never by taking
the process down. Each load runs in a fresh process (``tests.trust.payload_fuzz``), so a crash or a hang is a
failure here, not the end of the test run.

What is asserted is what the backends validate (docs/trust.md, "Untrusted input without a policy"): an IREE
module's archive and FlatBuffer structure (IREE verifies both when the module is created, before the VM uses
it), and an OpenVINO blob's framing at import. What no backend validates (an IREE module's native code, the
values its bytecode hands the interpreter) is left to a signature and the policy;
``benchmarks/fuzz_payloads.py`` counts it, not these tests."""

from __future__ import annotations

import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest

import epctx
from tests.epcontext.models import whole_model
from tests.requires import requires
from tests.trust.payload_fuzz import elf_range, load_in_child, rewrite_payload, run_case

IREE = "IREEExecutionProvider"
OPENVINO = "OpenVINOExecutionProvider"


def _context(folder: Path, ep: str) -> Path:
    folder.mkdir(parents=True)
    onnx.save(whole_model(), folder / "model.onnx")
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    epctx.InferenceSession(str(folder / "model.onnx"), so, providers=[ep])
    (folder / "model.onnx").unlink()
    return folder


@pytest.fixture(scope="module")
def iree_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _context(tmp_path_factory.mktemp("iree") / "base", IREE)


@pytest.fixture(scope="module")
def openvino_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _context(tmp_path_factory.mktemp("openvino") / "base", OPENVINO)


def _root(module: bytes) -> int:
    """Where the module's FlatBuffer starts (its root offset): 4 bytes before its file identifier."""
    return module.index(b"IREE") - 4


def _put(module: bytes, offset: int, value: bytes) -> bytes:
    return module[:offset] + value + module[offset + len(value) :]


STRUCTURE: dict[str, Callable[[bytes], bytes]] = {
    "FlatBuffer length prefix": lambda m: _put(m, _root(m) - 4, struct.pack("<I", 1 << 30)),
    "root offset out of bounds": lambda m: _put(m, _root(m), struct.pack("<I", 0x7FFFFFF0)),
    "file identifier": lambda m: _put(m, _root(m) + 4, b"XXXX"),
    "root table's vtable offset": lambda m: _put(
        m, _root(m) + struct.unpack_from("<I", m, _root(m))[0], struct.pack("<i", 1 << 20)
    ),
    "archive header zeroed": lambda m: _put(m, 0, bytes(16)),
    "truncated to 8 bytes": lambda m: m[:8],
    "truncated in the FlatBuffer": lambda m: m[: _root(m) + 200],
    "truncated before the executable": lambda m: m[: elf_range(m)[0]],
    "truncated in the executable": lambda m: m[: sum(elf_range(m)) // 2],
    "empty": lambda m: b"",
}


@pytest.mark.slow  # compiles with IREE
@requires("iree.compiler", "iree.runtime")
@pytest.mark.parametrize("case", sorted(STRUCTURE))
def test_iree_module_with_bad_structure_is_invalid_graph(iree_base: Path, tmp_path: Path, case: str) -> None:
    folder = tmp_path / "m"
    shutil.copytree(iree_base, folder)
    rewrite_payload(folder / "model_ctx.onnx", STRUCTURE[case])
    outcome, output = load_in_child(folder / "model_ctx.onnx", IREE, dict(os.environ))
    assert outcome == "typed", f"{case}: {outcome}: {output}"
    assert output.startswith("InvalidGraph"), output
    assert "EPContext node 'IREEExecutionProvider_" in output and "IREE cannot read the module" in output


@pytest.mark.slow  # compiles with IREE
@requires("iree.compiler", "iree.runtime")
@pytest.mark.parametrize("region", ["structure", "truncate"])
def test_iree_module_fuzz_never_crashes_the_load(iree_base: Path, tmp_path: Path, region: str) -> None:
    """The fuzzer's bit flips over the module's archive and FlatBuffer (the ELF left alone) and its truncations:
    creating the session fails typed or succeeds, in every case (0 crashes in 200 seeds at creation here; the
    few that crash or hang do so at run, from bytecode values, see docs/trust.md)."""
    env = dict(os.environ)
    cases = [run_case(iree_base, tmp_path, region, seed, env, phase="load", timeout=60) for seed in range(12)]
    bad = [c for c in cases if c.outcome not in ("typed", "runs")]
    assert not bad, bad
    assert any(c.outcome == "typed" for c in cases)  # the mutations do reach IREE's checks


@pytest.mark.slow  # 24 fresh processes
@requires("openvino")
@pytest.mark.parametrize("region", ["blob", "truncate"])
def test_openvino_blob_fuzz_never_crashes(openvino_base: Path, tmp_path: Path, region: str) -> None:
    """Bit flips anywhere in an OpenVINO blob and truncations: import and run fail typed or run."""
    env = dict(os.environ)
    cases = [
        run_case(openvino_base, tmp_path, region, seed, env, ep=OPENVINO, timeout=60) for seed in range(12)
    ]
    bad = [c for c in cases if c.outcome not in ("typed", "runs")]
    assert not bad, bad
    assert any(c.outcome == "typed" for c in cases)


@pytest.mark.slow  # compiles with IREE
@requires("iree.compiler", "iree.runtime")
@pytest.mark.parametrize("aligned", [True, False], ids=["mapped", "copied"])
def test_both_module_paths_verify(iree_base: Path, aligned: bool) -> None:
    """``load_module`` wraps aligned memory (a mapped binary) and copies unaligned bytes (an embedded context's):
    IREE verifies the FlatBuffer on both paths; a bad one is InvalidGraph naming the graph."""
    from epctx.epcontext import ContextBinary
    from epctx.errors import InvalidGraph
    from epctx.providers.iree.runtime import load_module

    with ContextBinary.open(iree_base / f"model_{IREE}.bin") as binary:
        module = bytes(binary.read(next(n for n in binary.names() if n.endswith("/module"))))
    bad = STRUCTURE["root offset out of bounds"](module)
    buffer = np.zeros(len(bad) + 65, np.uint8)  # 64-byte aligned at 64 (numpy's data is), unaligned at 65
    start = 64 - buffer.ctypes.data % 64 + (0 if aligned else 1)
    buffer[start : start + len(bad)] = np.frombuffer(bad, np.uint8)
    view = memoryview(buffer[start : start + len(bad)])
    with pytest.raises(InvalidGraph, match="graph 'g'.*FlatBuffer verification failed"):
        load_module(view, "graph 'g'")
    good = buffer.copy()
    good[start : start + len(module)] = np.frombuffer(module, np.uint8)
    assert load_module(memoryview(good[start : start + len(module)]), "graph 'g'").function_names
