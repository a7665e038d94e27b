"""A fuzzer for context models: mutate what the example EP generates, load and run it, classify the outcome.

Used by ``tests/epcontext/test_fuzz_models.py`` (a few thousand cases) and ``benchmarks/fuzz_context.py``
(as many as asked). Each case starts from a fresh copy of a generated context model (embed_mode 0, with its
``.bin``, or embed_mode 1), applies one mutation chosen by its seed, then creates an
``epctx.InferenceSession`` and runs it. Outcomes:

- ``typed``: an ``epctx.errors.EPCtxError`` subclass (load or run);
- ``correct``: the output equals the unmutated model's, bit for bit (dtype and shape included);
- ``wrong``: it ran and the output differs although the mutation touched only data that the context checks
  cover (the EP's binary, the EPContext nodes): a defect;
- ``uncovered``: it ran with a different output and the mutation touched data no checksum covers (a CPU
  node, a CPU node's initializer or attribute in the ``.onnx``): expected, ONNX has no checksum there;
- ``untyped``: any other exception: a defect.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx

import epctx
from epctx.errors import EPCtxError
from tests.epcontext.models import EXAMPLE, feed, two_partition_model, whole_model

__all__ = ["OUTCOMES", "CaseResult", "ContextFuzzer", "summarize"]

OUTCOMES = ("typed", "correct", "wrong", "uncovered", "untyped")
_CTX = "model_ctx.onnx"
_BIN = f"model_{EXAMPLE}.bin"


@dataclasses.dataclass(frozen=True)
class CaseResult:
    seed: int
    embed: int
    mutation: str
    outcome: str
    detail: str  # the error (type and message) or the mutation's description
    seconds: float


@dataclasses.dataclass
class _Base:
    folder: Path
    embed: int
    files: dict[str, bytes]  # file name -> content
    uncovered: list[tuple[int, int]]  # byte ranges of the .onnx no checksum covers (CPU nodes, initializers)
    strings: list[bytes]  # string field values of the .onnx (names, attributes, metadata)


@dataclasses.dataclass
class _Mutated:
    description: str
    uncovered: bool = False  # touched only data that no context check covers


class ContextFuzzer:
    """Generates the base context models in ``workdir`` once; ``run_case(seed)`` is one mutated load + run.
    ``whole``: the model is EPContext nodes only (the lean load path); else CPU nodes remain (the full one)."""

    def __init__(self, workdir: Path, *, whole: bool = False) -> None:
        self.workdir = workdir
        self.make_model = whole_model if whole else two_partition_model
        self.feed = feed()
        self.bases = [self._generate(0), self._generate(1)]
        self.expected = self._run(self.bases[0].folder / _CTX)
        for base in self.bases[1:]:
            assert np.array_equal(self._run(base.folder / _CTX), self.expected)
        # A valid binary made for another model with the same structure (other weights).
        self.foreign = self._generate(0, seed=7, name="foreign").files[_BIN]
        self._mutations: list[tuple[str, Callable[[np.random.Generator, _Base, Path], _Mutated]]] = [
            ("bitflip_onnx", _bitflip_onnx),
            ("bitflip_bin", _bitflip_bin),
            ("truncate_onnx", _truncate_onnx),
            ("truncate_bin", _truncate_bin),
            ("bytes_bin", _bytes_bin),
            ("name_bytes", _name_bytes),
            ("attr_edit", self._attr_edit),
            ("path_attack", self._path_attack),
            ("foreign_bin", self._foreign_bin),
        ]

    # -- setup ---------------------------------------------------------------------------------------
    def _generate(self, embed: int, *, seed: int = 0, name: str = "") -> _Base:
        folder = self.workdir / (name or f"base_embed{embed}")
        folder.mkdir(parents=True)
        onnx.save(self.make_model(seed), folder / "model.onnx")
        so = epctx.SessionOptions()
        so.add_session_config_entry("ep.context_enable", "1")
        so.add_session_config_entry("ep.context_embed_mode", str(embed))
        epctx.InferenceSession(str(folder / "model.onnx"), so, providers=[EXAMPLE])
        (folder / "model.onnx").unlink()
        files = {p.name: p.read_bytes() for p in sorted(folder.iterdir())}
        data = files[_CTX]
        proto = onnx.ModelProto.FromString(data)
        uncovered = []
        for part in (  # what no checksum covers: the CPU nodes, their weights, the graph's inputs and outputs
            *(n for n in proto.graph.node if n.op_type != "EPContext"),
            *proto.graph.initializer,
            *proto.graph.input,
            *proto.graph.output,
        ):
            blob = part.SerializeToString()
            start = data.find(blob)
            assert start >= 0, "the .onnx is not in canonical protobuf order"
            prefix = 1 + (len(blob).bit_length() + 6) // 7  # the field's tag and length varint
            uncovered.append((start - prefix, start + len(blob)))
        return _Base(folder, embed, files, uncovered, sorted(set(_strings(proto))))

    def _run(self, path: Path) -> np.ndarray:
        sess = epctx.InferenceSession(str(path), providers=[EXAMPLE])
        outputs = sess.run(None, self.feed)
        return np.asarray(outputs[0]) if outputs else np.empty(0)  # a flip can drop the graph's output

    # -- one case ------------------------------------------------------------------------------------
    def run_case(self, seed: int) -> CaseResult:
        with self.mutated(seed) as (path, base, name, mutated):
            started = time.perf_counter()
            outcome, detail = self._classify(path, mutated)
            return CaseResult(seed, base.embed, name, outcome, detail, time.perf_counter() - started)

    @contextlib.contextmanager
    def mutated(self, seed: int) -> Iterator[tuple[Path, _Base, str, _Mutated]]:
        """Case ``seed``'s files in a folder of their own (removed after): (context model path, its base,
        the mutation's name, what it did)."""
        rng = np.random.default_rng(seed)
        base = self.bases[seed % len(self.bases)]
        name, mutate = self._mutations[int(rng.integers(len(self._mutations)))]
        folder = self.workdir / f"case_{seed}"
        folder.mkdir()
        try:
            for file, content in base.files.items():
                (folder / file).write_bytes(content)
            yield folder / _CTX, base, name, mutate(rng, base, folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _classify(self, path: Path, mutated: _Mutated) -> tuple[str, str]:
        try:
            out = self._run(path)
        except EPCtxError as exc:
            return "typed", f"{type(exc).__name__}: {exc}"
        except Exception as exc:
            where = traceback.extract_tb(exc.__traceback__)[-1]
            return "untyped", (
                f"{mutated.description}: {type(exc).__name__}: {exc} "
                f"(at {Path(where.filename).name}:{where.lineno})"
            )
        same = out.dtype == self.expected.dtype and out.shape == self.expected.shape
        if same and np.array_equal(out, self.expected, equal_nan=True):
            return "correct", mutated.description
        return ("uncovered" if mutated.uncovered else "wrong"), mutated.description

    def run_many(self, seeds: range) -> Iterator[CaseResult]:
        for seed in seeds:
            yield self.run_case(seed)

    # -- structured mutations ------------------------------------------------------------------------
    def _attr_edit(self, rng: np.random.Generator, base: _Base, folder: Path) -> _Mutated:
        proto = onnx.ModelProto.FromString(base.files[_CTX])
        nodes = [n for n in proto.graph.node if n.op_type == "EPContext"]
        node = nodes[int(rng.integers(len(nodes)))]
        attrs = {a.name: a for a in node.attribute}
        choice = int(rng.integers(9))
        if choice == 0:
            value = int(rng.choice([0, 1, 2, -1, 2**40]))
            _set_int(node, "main_context", value)
            what = f"main_context={value}"
        elif choice == 1:
            value = int(rng.choice([0, 1, 2, -1]))
            _set_int(node, "embed_mode", value)
            what = f"embed_mode={value}"
        elif choice in (2, 3, 4):
            key = ["ep_sdk_version", "source", "partition_name"][choice - 2]
            raw = _random_text(rng)
            if key == "partition_name" and rng.random() < 0.5:  # the other node's graph
                other = [n for n in nodes if n is not node]
                raw = next((a.s for a in other[0].attribute if a.name == key), raw) if other else raw
            if key == "source" and rng.random() < 0.5:
                raw = str(rng.choice(["OpenVINOExecutionProvider", "CPUExecutionProvider", ""])).encode()
            _set_bytes(node, key, raw)
            what = f"{key}={raw[:40]!r}"
        elif choice == 5:
            key = str(rng.choice(["hardware_architecture", "notes", "onnx_model_filename", "max_size"]))
            if key == "max_size":
                _set_int(node, key, int(rng.integers(-(2**62), 2**62)))
            else:
                _set_bytes(node, key, _random_text(rng))
            what = f"{key} edited"
        elif choice == 6:
            key = str(rng.choice(list(attrs)))
            node.attribute.remove(attrs[key])
            what = f"removed {key}"
        elif choice == 7:  # an attribute of the wrong type
            key = str(
                rng.choice(["main_context", "embed_mode", "source", "ep_cache_context", "partition_name"])
            )
            if key in attrs:
                node.attribute.remove(attrs[key])
            node.attribute.append(
                onnx.helper.make_attribute(key, 1.5 if rng.random() < 0.5 else [1, 2])  # type: ignore[arg-type]
            )
            what = f"{key} of a wrong type"
        else:  # the embedded payload as a path, or a path as the payload
            embedded = "ep_cache_context" in attrs and base.embed == 1
            _set_int(node, "embed_mode", 0 if embedded else 1)
            what = f"embed_mode flipped to {0 if embedded else 1}"
        (folder / _CTX).write_bytes(proto.SerializeToString())
        return _Mutated(f"attr_edit {node.name}: {what}")

    def _path_attack(self, rng: np.random.Generator, base: _Base, folder: Path) -> _Mutated:
        proto = onnx.ModelProto.FromString(base.files[_CTX])
        node = next(n for n in proto.graph.node if n.op_type == "EPContext")
        choice = int(rng.integers(16))
        outside = self.workdir / "outside.bin"
        if not outside.exists():
            outside.write_bytes(self.foreign)
        if choice == 0:
            path = b"model_Example\x00ExecutionProvider.bin"
        elif choice == 1:
            path = b"../" + _BIN.encode()
        elif choice == 2:
            path = str(outside).encode()
        elif choice == 3:
            os.symlink("loop_b", folder / "loop_a")
            os.symlink("loop_a", folder / "loop_b")
            path = b"loop_a"
        elif choice == 4:
            path = b"n" * int(rng.integers(256, 5000))
        elif choice == 5:
            path = b"d/" * int(rng.integers(100, 3000)) + b"x.bin"
        elif choice == 6:
            path = bytes(rng.integers(128, 256, int(rng.integers(1, 40)), dtype=np.uint8))
        elif choice == 7:
            os.symlink(outside, folder / "link.bin")
            path = b"link.bin"
        elif choice == 8:
            os.mkfifo(folder / "fifo.bin")
            path = b"fifo.bin"
        elif choice == 9:
            (folder / "sub").mkdir()
            path = b"sub"
        elif choice == 10:
            path = _CTX.encode()  # a file that is not a binary
        elif choice == 11:
            path = b"./" + _BIN.encode()
        elif choice == 12:
            path = b"C:\\x\\" + _BIN.encode()
        elif choice == 13:
            path = b"sub\\..\\..\\" + _BIN.encode()
        elif choice == 14:
            os.symlink("/dev/zero", folder / "zero.bin")
            path = b"zero.bin"
        else:
            path = _random_text(rng)
        _set_bytes(node, "ep_cache_context", path)
        _set_int(node, "embed_mode", 0)
        (folder / _CTX).write_bytes(proto.SerializeToString())
        return _Mutated(f"path_attack {path[:60]!r}")

    def _foreign_bin(self, rng: np.random.Generator, base: _Base, folder: Path) -> _Mutated:
        """A valid binary made by the same EP for a model of the same structure, other weights: in place of
        the model's own (embed_mode=0), or embedded in its place (embed_mode=1). Only an identity check on
        the payload (issue 7: identity binding) can tell."""
        if _BIN in base.files:
            (folder / _BIN).write_bytes(self.foreign)
            return _Mutated("foreign_bin: another model's binary under this model's .bin name")
        proto = onnx.ModelProto.FromString(base.files[_CTX])
        node = next(n for n in proto.graph.node if n.op_type == "EPContext")
        _set_bytes(node, "ep_cache_context", self.foreign)
        (folder / _CTX).write_bytes(proto.SerializeToString())
        return _Mutated("foreign_bin: another model's binary embedded in this model's main node")


# -- byte-level mutations ---------------------------------------------------------------------------------
def _flip(data: bytes, rng: np.random.Generator) -> tuple[bytes, list[int]]:
    buf = bytearray(data)
    count = 1 if rng.random() < 0.7 else int(rng.integers(2, 9))
    offsets = [int(o) for o in rng.integers(0, len(buf), count)]
    for o in offsets:
        buf[o] ^= 1 << int(rng.integers(8))
    return bytes(buf), offsets


def _in(ranges: list[tuple[int, int]], offsets: list[int]) -> bool:
    return any(a <= o < b for o in offsets for a, b in ranges)


def _bitflip_onnx(rng: np.random.Generator, base: _Base, folder: Path) -> _Mutated:
    data, offsets = _flip(base.files[_CTX], rng)
    (folder / _CTX).write_bytes(data)
    return _Mutated(f"bitflip_onnx at {offsets}", _in(base.uncovered, offsets))


def _bin_or_onnx(base: _Base) -> str:
    return _BIN if _BIN in base.files else _CTX


def _bitflip_bin(rng: np.random.Generator, base: _Base, folder: Path) -> _Mutated:
    file = _bin_or_onnx(base)
    data, offsets = _flip(base.files[file], rng)
    (folder / file).write_bytes(data)
    return _Mutated(f"bitflip {file} at {offsets}", file == _CTX and _in(base.uncovered, offsets))


def _truncate(rng: np.random.Generator, base: _Base, folder: Path, file: str) -> _Mutated:
    data = base.files[file]
    cut = int(rng.integers(0, len(data)))
    (folder / file).write_bytes(data[:cut])
    return _Mutated(f"truncate {file} at {cut} of {len(data)}")


def _truncate_onnx(rng: np.random.Generator, base: _Base, folder: Path) -> _Mutated:
    return _truncate(rng, base, folder, _CTX)


def _truncate_bin(rng: np.random.Generator, base: _Base, folder: Path) -> _Mutated:
    return _truncate(rng, base, folder, _bin_or_onnx(base))


def _bytes_bin(rng: np.random.Generator, base: _Base, folder: Path) -> _Mutated:
    """Random bytes over a range, zeros over a range, garbage appended, or an empty file."""
    file = _bin_or_onnx(base)
    buf = bytearray(base.files[file])
    choice = int(rng.integers(4))
    start = int(rng.integers(0, len(buf)))
    length = int(rng.integers(1, 64))
    if choice == 0:
        buf[start : start + length] = bytes(rng.integers(0, 256, length, dtype=np.uint8))[: len(buf) - start]
        what = f"random bytes at {start}+{length}"
    elif choice == 1:
        buf[start : start + length] = bytes(min(length, len(buf) - start))
        what = f"zeros at {start}+{length}"
    elif choice == 2:
        buf += bytes(rng.integers(0, 256, length, dtype=np.uint8))
        what = f"{length} bytes appended"
    else:
        buf = bytearray()
        what = "emptied"
    (folder / file).write_bytes(bytes(buf))
    touched = list(range(start, min(start + length, len(base.files[file])))) if choice < 2 else []
    return _Mutated(f"{file}: {what}", file == _CTX and _in(base.uncovered, touched))


def _name_bytes(rng: np.random.Generator, base: _Base, folder: Path) -> _Mutated:
    """Overwrite one string of the .onnx (a name, attribute, metadata) in place with random bytes of the same
    length: non-UTF-8, NUL, anything. The protobuf framing stays valid."""
    data = bytearray(base.files[_CTX])
    candidates = [s for s in base.strings if 0 < len(s) < 128]
    target = candidates[int(rng.integers(len(candidates)))]
    # Occurrences preceded by their length byte (a string field), one of them at random.
    marker = bytes([len(target)]) + target
    starts = []
    at = data.find(marker)
    while at >= 0:
        starts.append(at + 1)
        at = data.find(marker, at + 1)
    if not starts:
        return _Mutated(f"name_bytes: {target!r} not found (unchanged)")
    start = starts[int(rng.integers(len(starts)))]
    if rng.random() < 0.5:
        new = bytes(rng.integers(0, 256, len(target), dtype=np.uint8))
    else:  # mostly the same name, one byte changed to a non-UTF-8 or NUL byte
        new = bytearray(target)
        new[int(rng.integers(len(new)))] = int(rng.choice([0x00, 0x80, 0xC3, 0xFF, 0xED]))
        new = bytes(new)
    data[start : start + len(target)] = new
    (folder / _CTX).write_bytes(bytes(data))
    offsets = list(range(start, start + len(target)))
    return _Mutated(f"name_bytes {target[:40]!r} -> {new[:40]!r}", _in(base.uncovered, offsets))


# -- helpers --------------------------------------------------------------------------------------------
def _strings(proto: onnx.ModelProto) -> Iterator[bytes]:
    yield proto.producer_name.encode()
    for prop in proto.metadata_props:
        yield prop.key.encode()
        yield prop.value.encode()
    graph = proto.graph
    yield graph.name.encode()
    for value in (*graph.input, *graph.output, *graph.value_info):
        yield value.name.encode()
    for init in graph.initializer:
        yield init.name.encode()
    for node in graph.node:
        yield from (node.name.encode(), node.op_type.encode(), node.domain.encode())
        yield from (v.encode() for v in (*node.input, *node.output))
        for attr in node.attribute:
            yield attr.name.encode()
            # String attributes; of ep_cache_context only a path (embedded payloads are long).
            if attr.type == onnx.AttributeProto.STRING and (
                attr.name != "ep_cache_context" or len(attr.s) < 128
            ):
                yield attr.s
    for opset in proto.opset_import:
        yield opset.domain.encode()


def _random_text(rng: np.random.Generator) -> bytes:
    choice = int(rng.integers(4))
    n = int(rng.integers(0, 48))
    if choice == 0:
        return bytes(rng.integers(0, 256, n, dtype=np.uint8))
    if choice == 1:
        return b"\xff\xfe" + b"x" * n
    if choice == 2:
        return b"a" * int(rng.integers(1000, 70000))
    return "".join(chr(int(c)) for c in rng.integers(0x20, 0x2FFF, n)).encode("utf-8", "surrogatepass")


def _set_int(node: onnx.NodeProto, name: str, value: int) -> None:
    for a in list(node.attribute):
        if a.name == name:
            node.attribute.remove(a)
    node.attribute.append(onnx.helper.make_attribute(name, value))


def _set_bytes(node: onnx.NodeProto, name: str, value: bytes) -> None:
    for a in list(node.attribute):
        if a.name == name:
            node.attribute.remove(a)
    attr = onnx.AttributeProto(name=name, type=onnx.AttributeProto.STRING)
    attr.s = value
    node.attribute.append(attr)


def summarize(results: list[CaseResult]) -> str:
    """A table: mutation x outcome counts, and the totals."""
    by = Counter((r.mutation, r.outcome) for r in results)
    mutations = sorted({r.mutation for r in results})
    head = f"{'mutation':<14}" + "".join(f"{o:>10}" for o in OUTCOMES) + f"{'total':>8}"
    lines = [head]
    for m in mutations:
        row = [by[(m, o)] for o in OUTCOMES]
        lines.append(f"{m:<14}" + "".join(f"{c:>10}" for c in row) + f"{sum(row):>8}")
    totals = Counter(r.outcome for r in results)
    lines.append(f"{'all':<14}" + "".join(f"{totals[o]:>10}" for o in OUTCOMES) + f"{len(results):>8}")
    slowest = max(results, key=lambda r: r.seconds, default=None)
    if slowest is not None:
        lines.append(
            f"slowest case: seed {slowest.seed} ({slowest.mutation}) {slowest.seconds * 1000:.1f} ms"
        )
    return "\n".join(lines)
