"""Inspect a context model: its EPContext nodes, the binaries they carry or name, and what is left for the CPU.

``inspect_model(path)`` returns a :class:`ModelReport` (frozen dataclasses, ``to_dict()`` for JSON); problems
that would stop a session from loading the model (bad attributes, absolute / ``..`` / escaping / missing binary
paths, corrupt epctx containers, version disagreements) are :class:`Finding` entries, never exceptions. Only a
file that is not an ONNX model at all raises (InvalidGraph / NoSuchFile / InvalidArgument).

Payload formats are told apart by their bytes: the framework reads epctx containers, each EP recognises its own
payloads (the EP named by the node's ``source`` asked first), then the table of formats of onnxruntime EPs epctx
does not have; see :mod:`epctx.tools.payload_formats`.
"""

from __future__ import annotations

import collections
import mmap
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from epctx.ep._context_node import DOMAIN, OP_TYPE, EPContextNode
from epctx.epcontext.container import ContextBinary
from epctx.epcontext.header import MAGIC
from epctx.epcontext.identity import IDENTITY_ATTRIBUTE, graph_identity
from epctx.epcontext.paths import resolve_context_file
from epctx.errors import InvalidGraph
from epctx.tools.payload_formats import (
    FORMAT_EPCTX,
    FORMAT_OPENVINO,
    FORMAT_OPENVINO_BIN,
    FORMAT_QNN,
    FORMAT_TENSORRT,
    FORMAT_UNKNOWN,
    Payload,
    PayloadEntry,
    container_payload,
    detect_payload,
)

__all__ = [
    "FORMAT_EPCTX", "FORMAT_OPENVINO", "FORMAT_OPENVINO_BIN", "FORMAT_QNN", "FORMAT_TENSORRT", "FORMAT_UNKNOWN",
    "BinaryFile", "EPContextInfo", "Finding", "ModelReport", "Payload", "PayloadEntry", "detect_payload",
    "inspect_model",
]  # fmt: skip

COMPATIBILITY_PREFIX = "ep_compatibility_info."
_INT_ATTRS = {"main_context": 1, "embed_mode": 1, "max_size": 0}
_STRING_ATTRS = frozenset(
    ("ep_cache_context", "ep_sdk_version", "onnx_model_filename", "hardware_architecture", "partition_name",
     "source", "notes")
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Finding:
    """A problem found. ``severity`` is "error" (a session would refuse the model) or "warning"."""

    severity: str
    message: str
    node: str | None = None


@dataclass(frozen=True, slots=True)
class BinaryFile:
    """A context binary named by ``ep_cache_context`` (embed_mode=0). ``status``: "ok", "missing" or
    "rejected" (absolute, ``..`` or a symlink leaving the model folder; such files are never read)."""

    reference: str
    path: str
    status: str
    exists: bool
    size: int | None
    payload: Payload | None
    nodes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class EPContextInfo:
    """One EPContext node. ``attributes`` has every attribute present, display-ready (``ep_cache_context`` is the
    path with embed_mode=0, ``"<N bytes embedded>"`` with embed_mode=1); ``graph`` is "main" or the subgraph's
    location (``main/<node>.<attribute>``)."""

    name: str
    graph: str
    source: str | None
    main_context: int
    embed_mode: int
    partition_name: str | None
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: Mapping[str, Any]
    file: str | None = None
    payload: Payload | None = None


@dataclass(frozen=True, slots=True)
class ModelReport:
    path: str
    ir_version: int
    producer: str
    opset_imports: Mapping[str, int]
    ep_compatibility_info: Mapping[str, str]
    ep_context_nodes: tuple[EPContextInfo, ...]
    binary_files: tuple[BinaryFile, ...]
    other_nodes: Mapping[str, int]
    findings: tuple[Finding, ...]

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "error")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (no bytes), keys as in the dataclasses."""
        return asdict(self)


def inspect_model(path: str | os.PathLike[str], *, verify: bool = False) -> ModelReport:
    """Report on the context model at ``path``. ``verify=True`` also checks every entry checksum of epctx
    containers (reads all their bytes)."""
    from epctx.model.load import parse_model_proto, read_model_file

    model_path = Path(path)
    data = read_model_file(model_path)
    proto = parse_model_proto(data, repr(str(model_path)))
    del data
    inspector = _Inspector(model_path.resolve().parent, verify=verify)
    for graph_at, node in _walk(proto.graph, "main"):
        if node.op_type == OP_TYPE and node.domain == DOMAIN:
            inspector.add_node(node, graph_at)
        else:
            key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
            inspector.op_counts[key] += 1
    inspector.cross_check()

    meta = {p.key: p.value for p in proto.metadata_props}
    return ModelReport(
        path=str(model_path.resolve()),
        ir_version=int(proto.ir_version),
        producer=" ".join(s for s in (proto.producer_name, proto.producer_version) if s),
        opset_imports={(o.domain or "ai.onnx"): int(o.version) for o in proto.opset_import},
        ep_compatibility_info={
            k[len(COMPATIBILITY_PREFIX) :]: v for k, v in meta.items() if k.startswith(COMPATIBILITY_PREFIX)
        },
        ep_context_nodes=tuple(inspector.nodes),
        binary_files=tuple(inspector.files()),
        other_nodes=dict(sorted(inspector.op_counts.items(), key=lambda kv: (-kv[1], kv[0]))),
        findings=tuple(inspector.findings),
    )


def _walk(graph: Any, where: str) -> Iterator[tuple[str, Any]]:
    """Every node of ``graph`` and of its subgraphs (If / Loop / Scan bodies), with the graph's location."""
    from onnx import AttributeProto

    for i, node in enumerate(graph.node):
        yield where, node
        for attr in node.attribute:
            label = f"{where}/{node.name or f'{node.op_type}#{i}'}.{attr.name}"
            if attr.type == AttributeProto.GRAPH:
                yield from _walk(attr.g, label)
            elif attr.type == AttributeProto.GRAPHS:
                for j, sub in enumerate(attr.graphs):
                    yield from _walk(sub, f"{label}[{j}]")


class _Inspector:
    def __init__(self, base_dir: Path, *, verify: bool) -> None:
        self.base_dir = base_dir
        self.verify = verify
        self.nodes: list[EPContextInfo] = []
        self.findings: list[Finding] = []
        self.op_counts: collections.Counter[str] = collections.Counter()
        self._files: dict[str, dict[str, Any]] = {}  # display path -> BinaryFile fields

    def add_node(self, node: Any, graph_at: str) -> None:
        name = node.name
        values, extra, display = self._attributes(node)
        embed_mode = values.get("embed_mode", 1)
        cache = values.get("ep_cache_context")
        if "ep_cache_context" in display:
            display["ep_cache_context"] = (
                _text(cache) if embed_mode == 0 else f"<{len(cache or b'')} bytes embedded>"
            )
        view = EPContextNode(
            name=name, inputs=tuple(node.input), outputs=tuple(node.output), extra=extra, **values
        )
        try:
            view.validate()
        except InvalidGraph as exc:
            self._error(str(exc), name)
        file_ref, payload = None, None
        if cache and embed_mode == 0:
            file_ref = _text(cache)
            if file_ref.encode("utf-8", "surrogatepass") != cache:
                self._error(f"ep_cache_context is not a UTF-8 path: {file_ref!r}", name)
            payload = self._file(file_ref, name, view.source)
        elif cache:
            where = f"embedded context of EPContext node {name!r}"
            payload, problems = detect_payload(cache, verify=self.verify, where=where, source=view.source)
            for problem in problems:
                self._error(problem, name)
        info = EPContextInfo(
            name=name, graph=graph_at, source=view.source, main_context=view.main_context,
            embed_mode=view.embed_mode, partition_name=view.partition_name, inputs=view.inputs,
            outputs=view.outputs, attributes=display, file=file_ref, payload=payload,
        )  # fmt: skip
        self.nodes.append(info)

    def _attributes(self, node: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """Typed EPContext attributes (wrong types become findings), the unknown ones, and all for display."""
        from onnx import AttributeProto

        values: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        display: dict[str, Any] = {}
        for attr in node.attribute:
            shown = _display(attr)
            display[attr.name] = shown
            if attr.name in _INT_ATTRS:
                if attr.type != AttributeProto.INT:
                    self._error(f"attribute {attr.name!r} must be INT, not {_type_name(attr)}", node.name)
                    continue
                values[attr.name] = int(attr.i)
            elif attr.name in _STRING_ATTRS:
                if attr.type != AttributeProto.STRING:
                    self._error(f"attribute {attr.name!r} must be STRING, not {_type_name(attr)}", node.name)
                    continue
                raw = bytes(attr.s)
                values[attr.name] = raw if attr.name == "ep_cache_context" else _text(raw)
            else:
                extra[attr.name] = shown
        return values, extra, display

    def _file(self, reference: str, node: str, source: str | None) -> Payload | None:
        status = "ok"
        try:
            target = resolve_context_file(self.base_dir, reference, node=node)
        except InvalidGraph as exc:
            self._error(str(exc), node)
            target, inside = _locate(self.base_dir, reference)
            status = "missing" if inside and not target.is_file() else "rejected"
        key = str(target)
        entry = self._files.get(key)
        if entry is None:
            exists = target.is_file()
            size = target.stat().st_size if exists else None
            payload = self._read_file(target, node, source) if status == "ok" else None
            entry = dict(reference=reference, path=key, status=status, exists=exists, size=size,
                         payload=payload, nodes=[])  # fmt: skip
            self._files[key] = entry
        entry["nodes"].append(node)
        payload = entry["payload"]
        return payload if isinstance(payload, Payload) else None

    def _read_file(self, target: Path, node: str, source: str | None) -> Payload:
        problems: list[str] = []
        try:
            with open(target, "rb") as fh:
                if os.fstat(fh.fileno()).st_size == 0:
                    self._error(f"the context binary {str(target)!r} is empty", node)
                    return Payload(FORMAT_UNKNOWN, 0)
                if fh.read(len(MAGIC)) == MAGIC:  # the container's own reader maps it
                    payload = container_payload(
                        lambda: ContextBinary.open(target),
                        target.stat().st_size,
                        problems,
                        verify=self.verify,
                    )
                else:
                    with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                        payload, problems = detect_payload(mapped, source=source)
        except OSError as exc:
            self._error(f"cannot read the context binary {str(target)!r}: {exc}", node)
            return Payload(FORMAT_UNKNOWN, 0)
        for problem in problems:
            self._error(problem, node)
        return payload

    def files(self) -> Iterator[BinaryFile]:
        for entry in self._files.values():
            yield BinaryFile(**{**entry, "nodes": tuple(entry["nodes"])})

    def cross_check(self) -> None:
        """What a session would also refuse: duplicate names, SDK versions that disagree with the binary's,
        graphs an epctx container does not hold."""
        seen = collections.Counter(n.name for n in self.nodes)
        for name, count in seen.items():
            if count > 1:
                self._error(f"{count} EPContext nodes are named {name!r}; node names must be unique", name)
        mains: dict[str, list[Payload]] = {}
        for info in self.nodes:
            payload = info.payload
            if (
                info.main_context
                and payload is not None
                and payload.format == FORMAT_EPCTX
                and payload.details
            ):
                mains.setdefault(info.source or "", []).append(payload)
                sdk = info.attributes.get("ep_sdk_version")
                found, ep_name = payload.details.get("sdk_version"), payload.details.get("ep_name")
                if sdk is not None and sdk != found:
                    self._error(f"ep_sdk_version {sdk!r} disagrees with its binary's {found!r}", info.name)
                if ep_name != info.source:
                    self._warn(
                        f"source {info.source!r} differs from the binary's ep_name {ep_name!r}", info.name
                    )
        main_sources = {n.source for n in self.nodes if n.main_context}
        for info in self.nodes:
            graph = info.partition_name or info.name
            if not info.main_context and info.source not in main_sources:
                self._error(f"main_context=0 but no main context node has source {info.source!r}", info.name)
                continue
            candidates = (
                [info.payload]
                if info.main_context and info.payload is not None
                else mains.get(info.source or "", [])
            )
            epctx = [p for p in candidates if p.format == FORMAT_EPCTX and p.details]
            holders = [p for p in epctx if any(e.name.startswith(f"{graph}/") for e in p.entries)]
            if epctx and not holders:
                where = "its binary" if info.main_context else "no main context of the same source"
                self._error(f"{where} holds no graph named {graph!r}", info.name)
            if holders:
                self._check_binding(info, graph, holders[0])

    def _check_binding(self, info: EPContextInfo, graph: str, payload: Payload) -> None:
        """The node's recorded payload identity and hardware_architecture against the binary holding its graph."""
        hardware, found_hw = info.attributes.get("hardware_architecture"), payload.details.get("hardware")
        if hardware is not None and hardware != found_hw:
            self._error(
                f"hardware_architecture {hardware!r} disagrees with its binary's {found_hw!r}", info.name
            )
        recorded = info.attributes.get(IDENTITY_ATTRIBUTE)
        if recorded is None:
            self._error(f"no {IDENTITY_ATTRIBUTE!r} attribute binds the node to its epctx binary", info.name)
            return
        rows = [(e.name, e.kind, e.size, e.checksum, e.attrs) for e in payload.entries]
        found = graph_identity(graph, rows, payload.details.get("checksum", ""))
        if found != recorded:
            self._error(
                f"the binary is not the one this model was made with: graph {graph!r} has identity {found}, "
                f"the node records {recorded}",
                info.name,
            )

    def _error(self, message: str, node: str | None) -> None:
        text = re.sub(r"^\[[A-Z_]+\] ", "", message)  # no "[STATUS] " nor "EPContext node 'name': " prefix
        self.findings.append(Finding("error", text.removeprefix(f"EPContext node {node!r}: "), node))

    def _warn(self, message: str, node: str | None) -> None:
        self.findings.append(Finding("warning", message, node))


def _locate(base_dir: Path, reference: str) -> tuple[Path, bool]:
    """Where a reference that failed to resolve points (for display, never read), and whether it stays in the
    model folder (relative, no ``..``, no symlink leaving it), i.e. whether the file is just missing."""
    pure = PurePosixPath(reference.replace("\\", "/"))
    if Path(reference).is_absolute() or pure.is_absolute() or (len(reference) > 1 and reference[1] == ":"):
        return Path(reference), False
    root = base_dir.resolve()
    target = Path(os.path.normpath((root / Path(*pure.parts)).resolve()))
    inside = bool(reference) and ".." not in pure.parts and (target == root or root in target.parents)
    return target, inside


def _text(raw: bytes | None) -> str:
    if raw is None:
        return ""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("utf-8", "backslashreplace")


def _type_name(attr: Any) -> str:
    from onnx import AttributeProto

    return str(AttributeProto.AttributeType.Name(attr.type))


def _display(attr: Any) -> Any:
    """An attribute value as plain JSON data: numbers, text, lists; tensors and graphs summarized."""
    from onnx import AttributeProto as A
    from onnx import TensorProto

    kind = attr.type
    if kind == A.STRING:
        raw = bytes(attr.s)
        text = _text(raw)
        return text if text.encode("utf-8", "surrogatepass") == raw else f"<{len(raw)} bytes, not UTF-8>"
    if kind in (A.INT, A.FLOAT):
        return int(attr.i) if kind == A.INT else float(attr.f)
    if kind in (A.INTS, A.FLOATS, A.STRINGS):
        values = attr.ints if kind == A.INTS else attr.floats if kind == A.FLOATS else attr.strings
        return [_text(v) if isinstance(v, bytes) else v for v in values]
    if kind == A.TENSOR:
        return f"<tensor {TensorProto.DataType.Name(attr.t.data_type).lower()} {list(attr.t.dims)}>"
    if kind == A.GRAPH:
        return f"<graph {attr.g.name!r}: {len(attr.g.node)} nodes>"
    return f"<{_type_name(attr).lower()}>"
