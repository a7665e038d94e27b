"""The EP conformance suite: one set of EP context cache cases, run on any compiling EP.

In the spirit of ExecuTorch's backend test flows: every case builds its models with ``onnx.helper``, runs them
through the EP under test, compares every output with onnxruntime (CPU) as the oracle, and reports which nodes
the EP took (``delegated_nodes`` of ``total_nodes``) and the largest absolute error. A case never raises: a
failure is a :class:`CaseResult` with ``passed=False`` and the reason in ``detail``.

From pytest (an EP author's own test module)::

    from epctx.testing.conformance import CASES, run_conformance

    @pytest.mark.parametrize("case", CASES)
    def test_conformance(tmp_path, case):
        (result,) = run_conformance("MyExecutionProvider", tmp_dir=tmp_path, cases=[case])
        assert result.passed, result.detail

From a shell: ``python -m epctx.testing.conformance --provider MyExecutionProvider [--json]``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from epctx import options as opt
from epctx.ep.context_node import DOMAIN, OP_TYPE
from epctx.epcontext.container import ContextBinary
from epctx.epcontext.merge import merge_context_models
from epctx.epcontext.writer import ContextBinaryWriter
from epctx.errors import EPCtxError, InvalidGraph, ModelRequiresCompilation
from epctx.session.builder import NO_COMPILE_ENV, no_compile
from epctx.testing.conformance import models

if TYPE_CHECKING:
    import onnx

    from epctx.session import InferenceSession

__all__ = ["CASES", "CaseResult", "compiling_providers", "format_table", "run_conformance"]

CASES = (
    "round_trip_embed0",
    "round_trip_embed1",
    "partial_model",
    "prefix_merge",
    "weight_sharing",
    "corrupted_binary",
    "foreign_binary",
    "sdk_version_mismatch",
    "hardware_mismatch",
    "no_compile_on_load",
)


@dataclasses.dataclass(frozen=True)
class CaseResult:
    """One case on one EP. ``delegated_nodes``: the names of the source models' nodes the EP took when the
    case generated its context models (of ``total_nodes``); ``max_error``: the largest absolute difference from
    onnxruntime over every output the case ran (None for cases that expect an error)."""

    case: str
    passed: bool
    delegated_nodes: tuple[str, ...]
    total_nodes: int
    max_error: float | None
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"delegated_nodes": list(self.delegated_nodes)}


class _CaseFailed(Exception):
    """A conformance check that did not hold (never escapes ``run_conformance``)."""


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise _CaseFailed(message)


@dataclasses.dataclass
class _Record:
    delegated: list[str] = dataclasses.field(default_factory=list)
    total: int = 0
    errors: list[float] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class _Generated:
    folder: Path
    ctx: Path
    source: Path
    delegated: tuple[str, ...]
    total: int
    output: np.ndarray


def compiling_providers() -> list[str]:
    """The compiling EPs usable here (built-in, entry-point or registered), in precedence order."""
    from epctx.providers.registry import available_providers, create_provider

    found = []
    for name in available_providers():
        try:
            if create_provider(name).compiles:
                found.append(name)
        except EPCtxError:  # listed but not usable here (e.g. no device): nothing to test
            continue
    return found


def run_conformance(
    ep_name: str,
    ep_options: Mapping[str, str] | None = None,
    *,
    tmp_dir: str | os.PathLike[str] | None = None,
    cases: Iterable[str] | None = None,
    atol: float = 1e-4,
    rtol: float = 1e-4,
    case_options: Mapping[str, Mapping[str, str]] | None = None,
    fresh_process_setup: str = "",
) -> list[CaseResult]:
    """Run the conformance cases (all of ``CASES`` by default, in that order) on ``ep_name``.

    ``ep_options`` go to the EP in every session; ``case_options`` adds options for one case (e.g. OpenVINO's
    ``{"partial_model": {"disabled_ops": "LayerNormalization"}}``, since OpenVINO takes LayerNormalization
    itself). Outputs match onnxruntime when ``|ours - ort| <= atol + rtol * |ort|``. ``tmp_dir`` (a fresh
    temporary folder by default) receives one folder per case, left in place for inspection.
    ``fresh_process_setup``: Python code run first in the fresh processes the round-trip cases start (for an
    EP that a fresh process only finds once registered, e.g. a plugin library registered by path)."""
    chosen = list(CASES if cases is None else cases)
    unknown = [c for c in chosen if c not in CASES]
    if unknown:
        raise ValueError(f"unknown conformance case(s) {unknown}; known: {list(CASES)}")
    with contextlib.ExitStack() as stack:
        if tmp_dir is None:
            tmp_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="epctx-conformance-"))
        suite = _Suite(
            ep_name,
            dict(ep_options or {}),
            Path(tmp_dir),
            atol,
            rtol,
            case_options or {},
            fresh_process_setup,
        )
        return [suite.run_case(case) for case in chosen]


class _Suite:
    def __init__(
        self,
        ep_name: str,
        ep_options: dict[str, str],
        tmp: Path,
        atol: float,
        rtol: float,
        case_options: Mapping[str, Mapping[str, str]],
        setup: str,
    ) -> None:
        self.ep = ep_name
        self.ep_options = ep_options
        self.tmp = tmp
        self.atol = atol
        self.rtol = rtol
        self.case_options = case_options
        self.setup = setup
        self._base: dict[str, _Generated] = {}
        self._oracle: dict[str, list[np.ndarray]] = {}
        self.case = ""

    # -- running a case ------------------------------------------------------------------------------------
    def run_case(self, case: str) -> CaseResult:
        self.case = case
        record = _Record()
        body: Callable[[_Suite, _Record], None] = _CASE_BODIES[case]
        try:
            body(self, record)
            passed, detail = True, "; ".join(record.notes)
        except _CaseFailed as exc:
            passed, detail = False, str(exc)
        except Exception as exc:  # an EP's or epctx's error where the case expected none
            passed, detail = False, f"{type(exc).__name__}: {exc}"
        return CaseResult(
            case=case,
            passed=passed,
            delegated_nodes=tuple(record.delegated),
            total_nodes=record.total,
            max_error=max(record.errors) if record.errors else None,
            detail=detail,
        )

    def folder(self, name: str) -> Path:
        path = self.tmp / self.case / name
        path.mkdir(parents=True, exist_ok=False)
        return path

    def options(self) -> dict[str, str]:
        return {**self.ep_options, **self.case_options.get(self.case, {})}

    def session(self, source: Path | bytes, *, load: bool = False, **config: str) -> InferenceSession:
        """A session on the EP under test (then the CPU EP). ``load``: inside no_compile(). Config keys are
        written with ``__`` for ``.``: ``ep__context_enable="1"``."""
        return self._session(source, load, config)

    def _session(self, source: Path | bytes, load: bool, config: Mapping[str, str]) -> InferenceSession:
        from epctx.session import InferenceSession

        so = opt.SessionOptions()
        for key, value in config.items():
            so.add_session_config_entry(key.replace("__", "."), value)
        data = source if isinstance(source, bytes) else str(source)
        providers: list[Any] = [(self.ep, self.options())]
        if not load:
            return InferenceSession(data, so, providers=providers)
        with no_compile():
            return InferenceSession(data, so, providers=providers)

    def oracle(self, key: str, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        if key not in self._oracle:
            import onnxruntime as ort

            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            self._oracle[key] = [np.asarray(v) for v in sess.run(None, dict(feeds))]
        return self._oracle[key]

    def compare(
        self, record: _Record, ours: Sequence[Any], expected: Sequence[np.ndarray], what: str
    ) -> None:
        _expect(len(ours) == len(expected), f"{what}: {len(ours)} outputs, onnxruntime gives {len(expected)}")
        for k, (a, b) in enumerate(zip(ours, expected)):
            a = np.asarray(a)
            _expect(a.dtype == b.dtype and a.shape == b.shape,
                    f"{what}: output {k} is {a.dtype}{list(a.shape)}, onnxruntime's {b.dtype}{list(b.shape)}")  # fmt: skip
            error = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0
            record.errors.append(error)
            ok = np.allclose(a, b, atol=self.atol, rtol=self.rtol) and not np.isnan(a).any()
            _expect(bool(ok), f"{what}: output {k} differs from onnxruntime by up to {error:.3g}")

    def generate(
        self,
        record: _Record,
        folder: Path,
        stem: str,
        model: onnx.ModelProto,
        feeds: Mapping[str, np.ndarray] | None = None,
        **config: str,
    ) -> _Generated:
        """Save ``model`` as ``folder/stem.onnx`` and run a generating session on it; returns its context model
        (written later by a sharing group's last session)."""
        import onnx

        source = folder / f"{stem}.onnx"
        onnx.save(model, source)
        sess = self._session(source, False, {"ep__context_enable": "1", **config})
        delegated = tuple(n for ep, names in sess.get_partitions() if ep == self.ep for n in names)
        total = len(model.graph.node)
        record.delegated.extend(delegated)
        record.total += total
        _expect(bool(delegated), f"{self.ep} took none of the {total} nodes of {stem}.onnx: nothing to cache")
        ctx = folder / f"{stem}_ctx.onnx"
        if "ep__share_ep_contexts" not in config:
            _expect(ctx.is_file(), f"no context model {ctx.name} was written")
        output = np.asarray(sess.run(None, dict(feeds or models.feeds()))[0])
        return _Generated(folder, ctx, source, delegated, total, output)

    def base(self, record: _Record, key: str, seed: int = 0) -> _Generated:
        """A context model of ``models.chain(seed)`` (embed mode 0) made once per run; cases copy it."""
        if key not in self._base:
            folder = self.tmp / "_base" / key
            folder.mkdir(parents=True)
            self._base[key] = self.generate(_Record(), folder, "model", models.chain(seed))
        made = self._base[key]
        record.delegated.extend(made.delegated)
        record.total += made.total
        return made

    def copy_base(self, record: _Record, key: str = "chain0", seed: int = 0) -> tuple[Path, Path]:
        """A private copy of a base context model folder: (context model, its binary)."""
        made = self.base(record, key, seed)
        folder = self.tmp / self.case / key
        shutil.copytree(made.folder, folder)
        ctx = folder / made.ctx.name
        nodes = _ctx_nodes(ctx)
        _expect(bool(nodes), f"{ctx.name} has no EPContext node")
        path = _attr(nodes[0], "ep_cache_context")
        _expect(
            isinstance(path, bytes) and _attr(nodes[0], "embed_mode") == 0, "expected an embed_mode=0 node"
        )
        return ctx, folder / bytes(path).decode()

    def expect_invalid_graph(self, record: _Record, ctx: Path, what: str) -> None:
        """Loading ``ctx`` (or running it) must be InvalidGraph: never an output, never another error."""
        feeds = models.feeds()
        try:
            sess = self.session(ctx, load=True)
            outputs = sess.run(None, feeds)
        except InvalidGraph as exc:
            record.notes.append(f"InvalidGraph: {_reason(exc)}")
            return
        except ModelRequiresCompilation as exc:
            raise _CaseFailed(f"{what}: the session tried to compile instead of refusing: {exc}") from None
        except EPCtxError as exc:
            raise _CaseFailed(f"{what}: expected InvalidGraph, got {type(exc).__name__}: {exc}") from None
        expected = self.oracle("chain0", models.chain(0), feeds)
        error = float(np.max(np.abs(np.asarray(outputs[0]) - expected[0])))
        raise _CaseFailed(f"{what}: loaded and ran (max error {error:.3g}) instead of raising InvalidGraph")

    def fresh_process(self, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Run ``jobs`` in a new interpreter with EPCTX_NO_COMPILE=1: each loads ``model``, runs it on
        ``models.feeds()`` and saves output 0 to ``out``, or reports the epctx error it raised."""
        folder = self.folder("fresh_process")
        np.save(folder / "x.npy", models.feeds()["x"])
        spec = {"ep": self.ep, "options": self.options(), "setup": self.setup, "x": str(folder / "x.npy"),
                "jobs": jobs, "report": str(folder / "report.json")}  # fmt: skip
        env = {**os.environ, NO_COMPILE_ENV: "1"}
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, json.dumps(spec)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        _expect(done.returncode == 0, f"fresh process failed (exit {done.returncode}): {done.stderr[-2000:]}")
        report: list[dict[str, Any]] = json.loads((folder / "report.json").read_text())
        return report


_CHILD = """
import json, sys
import numpy as np
spec = json.loads(sys.argv[1])
exec(spec["setup"])
from epctx.errors import EPCtxError
from epctx.session import InferenceSession
report = []
for job in spec["jobs"]:
    try:
        sess = InferenceSession(job["model"], providers=[(spec["ep"], spec["options"])])
        np.save(job["out"], sess.run(None, {"x": np.load(spec["x"])})[0])
        report.append({"ok": True})
    except EPCtxError as exc:
        report.append({"ok": False, "error": type(exc).__name__, "message": str(exc)})
with open(spec["report"], "w") as fh:
    json.dump(report, fh)
"""


# -- helpers over context models ------------------------------------------------------------------------------
def _ctx_nodes(path: Path) -> list[onnx.NodeProto]:
    import onnx

    graph = onnx.load(path, load_external_data=False).graph
    return [n for n in graph.node if n.op_type == OP_TYPE and n.domain == DOMAIN]


def _attr(node: onnx.NodeProto, name: str) -> Any:
    from onnx import helper

    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), None)


def _reason(exc: BaseException) -> str:
    """An error's message without its status and the node it names (the table has room for the reason)."""
    text = re.sub(r"^\[\w+\] (EPContext node '[^']*' \(source '[^']*'\):? ?)?", "", str(exc))
    text = re.sub(r"'(?:/|[A-Za-z]:\\)[^']*[/\\]([^'/\\]+)'", r"'\1'", text)  # absolute paths: file names
    return text.splitlines()[0] if text else type(exc).__name__


def _graph_of(node: onnx.NodeProto) -> str:
    name = _attr(node, "partition_name")
    return bytes(name).decode() if name else node.name


def _rewrite_binary(binary_path: Path, ctx: Path, *, sdk_version: str | None = None,
                    hardware: str | None = None) -> None:  # fmt: skip
    """Give the binary's header and every EPContext node of ``ctx`` another SDK version or hardware."""
    import onnx
    from onnx import helper

    with ContextBinary.from_bytes(binary_path.read_bytes()) as binary:
        writer = ContextBinaryWriter(
            ep_name=binary.ep_name,
            sdk_version=binary.sdk_version if sdk_version is None else sdk_version,
            hardware=binary.hardware if hardware is None else hardware,
            metadata=binary.metadata,
            alignment=binary.alignment,
            checksum=binary.checksum_algorithm,
        )
        writer.add_from(binary)
        writer.write(binary_path)
    model = onnx.load(ctx, load_external_data=False)
    for node in model.graph.node:
        if node.op_type != OP_TYPE or node.domain != DOMAIN:
            continue
        for name, value in (("ep_sdk_version", sdk_version), ("hardware_architecture", hardware)):
            if value is None:
                continue
            kept = [a for a in node.attribute if a.name != name]
            del node.attribute[:]
            node.attribute.extend([*kept, helper.make_attribute(name, value)])
    onnx.save(model, ctx)


@contextlib.contextmanager
def _counting_binary_opens() -> Iterator[list[str]]:
    """Records every context binary file opened inside the block."""
    opened: list[str] = []
    original = ContextBinary.__dict__["open"]

    def counting(cls: type[ContextBinary], path: str | os.PathLike[str]) -> ContextBinary:
        opened.append(os.fspath(path))
        binary: ContextBinary = original.__func__(cls, path)
        return binary

    ContextBinary.open = classmethod(counting)  # type: ignore[assignment,method-assign]
    try:
        yield opened
    finally:
        ContextBinary.open = original  # type: ignore[method-assign]


# -- the cases ---------------------------------------------------------------------------------------------------
def _round_trip(suite: _Suite, record: _Record, embed: str) -> None:
    folder = suite.folder("model")
    made = suite.generate(record, folder, "model", models.chain(), ep__context_embed_mode=embed)
    feeds = models.feeds()
    expected = suite.oracle("chain0", models.chain(), feeds)
    suite.compare(record, [made.output], expected[:1], "generating session")
    nodes = _ctx_nodes(made.ctx)
    _expect(bool(nodes), f"{made.ctx.name} has no EPContext node")
    for node in nodes:
        _expect(_attr(node, "embed_mode") == int(embed), f"node {node.name!r}: embed_mode is not {embed}")
        source = _attr(node, "source")
        _expect(bool(source), f"node {node.name!r} records no source")
    produced = {p.name for p in folder.iterdir()} - {"model.onnx"}
    binaries = {p for p in produced if p.endswith(".bin")}
    if embed == "1":
        _expect(
            produced == {made.ctx.name}, f"embed_mode=1 wrote {sorted(produced)}, expected only the model"
        )
        main = next(n for n in nodes if _attr(n, "main_context") in (None, 1))
        blob = _attr(main, "ep_cache_context")
        _expect(isinstance(blob, bytes) and blob.startswith(b"EPCTXBIN"), "the embedded context is no binary")
    else:
        _expect(len(binaries) == 1 and produced == {made.ctx.name, *binaries},
                f"embed_mode=0 wrote {sorted(produced)}, expected the model and one binary")  # fmt: skip
    loaded = suite.session(made.ctx, load=True)
    parts = loaded.get_partitions()
    ours = [n for ep, names in parts if ep == suite.ep for n in names]
    _expect(set(ours) == {n.name for n in nodes}, f"the loaded session runs {ours} on {suite.ep}")
    suite.compare(record, loaded.run(None, feeds), expected, "loaded in this process")
    if embed == "1":  # an embedded context needs no file: it loads from bytes
        suite.compare(record, suite.session(made.ctx.read_bytes(), load=True).run(None, feeds), expected,
                      "loaded from bytes")  # fmt: skip
    (result,) = suite.fresh_process([{"model": str(made.ctx), "out": str(folder / "fresh.npy")}])
    _expect(result["ok"], f"fresh process with {NO_COMPILE_ENV}=1: {result.get('message')}")
    suite.compare(record, [np.load(folder / "fresh.npy")], expected[:1], "loaded in a fresh process")
    record.notes.append(f"{len(nodes)} EPContext node(s), fresh process ok")


def _case_round_trip_embed0(suite: _Suite, record: _Record) -> None:
    _round_trip(suite, record, "0")


def _case_round_trip_embed1(suite: _Suite, record: _Record) -> None:
    _round_trip(suite, record, "1")


def _case_partial_model(suite: _Suite, record: _Record) -> None:
    folder = suite.folder("model")
    model = models.partial()
    made = suite.generate(record, folder, "model", model)
    feeds = models.feeds()
    expected = suite.oracle("partial", model, feeds)
    suite.compare(record, [made.output], expected[:1], "generating session")
    _expect("ln" not in made.delegated,
            f"{suite.ep} took LayerNormalization: no CPU node between its partitions (give case_options "
            "for 'partial_model' that leave LayerNormalization to the CPU EP)")  # fmt: skip
    import onnx

    graph = onnx.load(made.ctx, load_external_data=False).graph
    nodes = _ctx_nodes(made.ctx)
    others = [n.op_type for n in graph.node if n.op_type != OP_TYPE]
    _expect(len(nodes) >= 2, f"expected two EP partitions around the CPU node, found {len(nodes)}")
    _expect("LayerNormalization" in others, f"the CPU node is missing from the context model: {others}")
    mains = [n for n in nodes if _attr(n, "main_context") in (None, 1)]
    _expect(len(mains) == 1, f"{len(mains)} main contexts for one EP and one binary")
    loaded = suite.session(made.ctx, load=True)
    on_cpu = [n for ep, names in loaded.get_partitions() if ep != suite.ep for n in names]
    _expect("ln" in on_cpu, f"the loaded session does not run 'ln' on the CPU EP: {on_cpu}")
    suite.compare(record, loaded.run(None, feeds), expected, "loaded")
    record.notes.append(f"{len(nodes)} partitions around {others}")


def _case_prefix_merge(suite: _Suite, record: _Record) -> None:
    folder = suite.folder("models")
    first = suite.generate(record, folder, "first", models.chain(), ep__context_node_name_prefix="a_")
    feeds = models.feeds()
    y = suite.oracle("chain0", models.chain(), feeds)[0]
    second = suite.generate(record, folder, "second", models.second_stage(), {"y": y},
                            ep__context_node_name_prefix="b_")  # fmt: skip
    for made, prefix in ((first, "a_"), (second, "b_")):
        nodes = _ctx_nodes(made.ctx)
        names = [n.name for n in nodes] + [_graph_of(n) for n in nodes]
        _expect(
            all(n.startswith(prefix) for n in names), f"{made.ctx.name}: names without {prefix!r}: {names}"
        )
        for node in nodes:
            if _attr(node, "main_context") in (None, 1):
                with ContextBinary.open(
                    made.folder / bytes(_attr(node, "ep_cache_context")).decode()
                ) as binary:
                    graphs = binary.names()
                _expect(
                    all(g.startswith(prefix) for g in graphs), f"binary entries without {prefix!r}: {graphs}"
                )
    merged = folder / "merged.onnx"
    merge_context_models([first.ctx, second.ctx], merged)
    sess = suite.session(merged, load=True)
    _expect([i.name for i in sess.get_inputs()] == ["x"] and [o.name for o in sess.get_outputs()] == ["z"],
            "the merged model's inputs and outputs are not x -> z")  # fmt: skip
    expected = suite.oracle("second", models.second_stage(), {"y": y})
    suite.compare(record, sess.run(None, feeds), expected, "merged model")
    record.notes.append(f"merged {len(_ctx_nodes(merged))} EPContext nodes")


def _case_weight_sharing(suite: _Suite, record: _Record) -> None:
    folder = suite.folder("models")
    n = 3
    made = []
    for k in range(n):
        stop = "1" if k == n - 1 else "0"  # the last model of the group writes the files
        model = models.shared_variant(k)
        made.append(
            suite.generate(
                record, folder, f"m{k}", model, ep__share_ep_contexts="1", ep__stop_share_ep_contexts=stop
            )
        )
    feeds = models.feeds()
    for k, g in enumerate(made):
        expected = suite.oracle(f"shared{k}", models.shared_variant(k), feeds)
        suite.compare(record, [g.output], expected[:1], f"generating session {k}")
    produced = sorted({p.name for p in folder.iterdir()} - {f"m{k}.onnx" for k in range(n)})
    binaries = [p for p in produced if p.endswith(".bin")]
    _expect(
        len(produced) == n + 1 and len(binaries) == 1, f"{n} models wrote {produced}, expected {n + 1} files"
    )
    # Shared weights are stored once: one payload of kind "weights" serves the graphs of every model.
    graphs_of = {k: {_graph_of(node) for node in _ctx_nodes(g.ctx)} for k, g in enumerate(made)}
    with ContextBinary.open(folder / binaries[0]) as binary:
        users: dict[tuple[int, int], set[int]] = {}
        for name in binary.names():
            info = binary.entry(name)
            if info.kind != "weights" or info.size == 0:
                continue
            for k, graphs in graphs_of.items():
                if any(name.startswith(f"{graph}/") for graph in graphs):
                    users.setdefault((info.offset, info.size), set()).add(k)
    shared = [size for (_, size), ks in users.items() if len(ks) == n]
    _expect(
        bool(shared),
        f"no payload of kind 'weights' is stored once for all {n} models (W1 and B1 are the same)",
    )
    # Inference: the sessions of the group open the shared binary once.
    sessions = []
    with _counting_binary_opens() as opened:
        for k, g in enumerate(made):
            stop = "1" if k == n - 1 else "0"
            sessions.append(
                suite.session(g.ctx, load=True, ep__share_ep_contexts="1", ep__stop_share_ep_contexts=stop)
            )
    _expect(len(opened) == 1, f"{n} sharing sessions opened the binary {len(opened)} times")
    del sessions[0]  # the session that opened it closes first; the others still run
    for k, sess in enumerate(sessions, start=1):
        suite.compare(record, sess.run(None, feeds), suite.oracle(f"shared{k}", models.shared_variant(k), feeds),
                      f"sharing session {k}")  # fmt: skip
    record.notes.append(f"{n + 1} files, {len(shared)} weight payload(s) stored once, binary opened once")


def _case_corrupted_binary(suite: _Suite, record: _Record) -> None:
    ctx, binary_path = suite.copy_base(record)
    with ContextBinary.open(binary_path) as binary:
        largest = max((binary.entry(name) for name in binary.names()), key=lambda e: e.size)
    _expect(largest.size > 0, "the binary holds no payload")
    data = bytearray(binary_path.read_bytes())
    data[largest.offset + largest.size // 2] ^= 0x10
    binary_path.write_bytes(bytes(data))
    suite.expect_invalid_graph(record, ctx, f"a bit flipped in payload {largest.name!r}")


def _case_foreign_binary(suite: _Suite, record: _Record) -> None:
    ctx, binary_path = suite.copy_base(record)
    other = suite.base(_Record(), "chain1", seed=1)  # the same graph with other weights
    (foreign,) = [p for p in other.folder.iterdir() if p.suffix == ".bin"]
    shutil.copyfile(foreign, binary_path)
    suite.expect_invalid_graph(record, ctx, "another model's binary")


def _case_sdk_version_mismatch(suite: _Suite, record: _Record) -> None:
    ctx, binary_path = suite.copy_base(record)
    with ContextBinary.open(binary_path) as binary:
        made_with = binary.sdk_version
    _rewrite_binary(binary_path, ctx, sdk_version=f"{made_with}-conformance.other")
    suite.expect_invalid_graph(record, ctx, "a binary of another SDK version")


def _case_hardware_mismatch(suite: _Suite, record: _Record) -> None:
    ctx, binary_path = suite.copy_base(record)
    _rewrite_binary(binary_path, ctx, hardware="conformance/other-hardware")
    suite.expect_invalid_graph(record, ctx, "a binary for other hardware")


def _case_no_compile_on_load(suite: _Suite, record: _Record) -> None:
    made = suite.base(record, "chain0")
    # The guard holds: a session that must compile raises, naming the EP.
    try:
        suite.session(made.source, load=True)
    except ModelRequiresCompilation as exc:
        _expect(suite.ep in str(exc), f"the no-compile error does not name {suite.ep}: {exc}")
    else:
        raise _CaseFailed("a session on the source model compiled inside no_compile()")
    # Loading the context model compiles nothing, here and in a fresh process with EPCTX_NO_COMPILE=1.
    feeds = models.feeds()
    expected = suite.oracle("chain0", models.chain(), feeds)
    suite.compare(record, suite.session(made.ctx, load=True).run(None, feeds), expected, "loaded")
    out = suite.tmp / suite.case / "fresh.npy"
    guard, load = suite.fresh_process(
        [{"model": str(made.source), "out": str(out)}, {"model": str(made.ctx), "out": str(out)}]
    )
    _expect(not guard["ok"] and guard["error"] == "ModelRequiresCompilation",
            f"{NO_COMPILE_ENV}=1 did not stop a compile: {guard}")  # fmt: skip
    _expect(load["ok"], f"fresh process with {NO_COMPILE_ENV}=1: {load.get('message')}")
    suite.compare(record, [np.load(out)], expected[:1], "loaded in a fresh process")
    record.notes.append(f"{NO_COMPILE_ENV}=1 and no_compile() both refuse to compile")


_CASE_BODIES: dict[str, Callable[[_Suite, _Record], None]] = {
    "round_trip_embed0": _case_round_trip_embed0,
    "round_trip_embed1": _case_round_trip_embed1,
    "partial_model": _case_partial_model,
    "prefix_merge": _case_prefix_merge,
    "weight_sharing": _case_weight_sharing,
    "corrupted_binary": _case_corrupted_binary,
    "foreign_binary": _case_foreign_binary,
    "sdk_version_mismatch": _case_sdk_version_mismatch,
    "hardware_mismatch": _case_hardware_mismatch,
    "no_compile_on_load": _case_no_compile_on_load,
}


def format_table(results: Mapping[str, Sequence[CaseResult]]) -> str:
    """EP x case: passed, delegated nodes (of the total), max abs error vs onnxruntime."""
    rows = [("EP", "case", "passed", "delegated", "max error", "detail")]
    for ep, found in results.items():
        for r in found:
            error = "-" if r.max_error is None else f"{r.max_error:.2e}"
            detail = r.detail if len(r.detail) <= 100 else r.detail[:97] + "..."
            rows.append((ep, r.case, "yes" if r.passed else "NO", f"{len(r.delegated_nodes)}/{r.total_nodes}",
                         error, detail))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:5], widths)) + "  " + row[5] for row in rows]
    return "\n".join(line.rstrip() for line in lines)
