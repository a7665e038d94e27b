"""Load a context model's EPContext nodes: route them to EPs by ``source``, find and verify their binaries."""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from epctx import options as opt
from epctx.ep.context_node import EPContextNode, is_ep_context
from epctx.ep.contract import CompiledPartition, ExecutionProvider, Partition
from epctx.epcontext.container import ContextBinary
from epctx.epcontext.identity import IDENTITY_ATTRIBUTE, graph_identity
from epctx.epcontext.io_names import IO_KEY, check_io_names
from epctx.epcontext.paths import resolve_context_file
from epctx.epcontext.store import ContextSource
from epctx.errors import EPCtxError, Fail, InvalidArgument, InvalidGraph

if TYPE_CHECKING:
    import onnx_ir as ir

__all__ = ["ContextLoader"]

_Node = TypeVar("_Node", bound=Hashable)
logger = logging.getLogger("epctx")


class ContextLoader:
    """One per session. ``route`` assigns EPContext nodes to EPs; ``load`` rebuilds one compiled partition."""

    def __init__(
        self, *, model_path: Path | None, config: Mapping[str, str], metadata: Mapping[str, str] | None = None
    ) -> None:
        if model_path is not None:
            self._base: Path | None = model_path.resolve().parent
        elif config.get(opt.EP_CONTEXT_FILE_PATH):
            self._base = Path(config[opt.EP_CONTEXT_FILE_PATH]).resolve().parent
        else:
            self._base = None
        self._views: dict[Hashable, EPContextNode] = {}  # node (onnx-ir's or the lean reader's) -> its view
        self._mains: dict[str, list[EPContextNode]] = {}  # EP name -> its main context nodes
        self._binaries: dict[str, ContextBinary] = {}  # resolved path or node name -> opened binary
        self._share = opt.config_flag(config, opt.SHARE_EP_CONTEXTS)
        self._stop_share = opt.config_flag(config, opt.STOP_SHARE_EP_CONTEXTS)
        self._metadata = dict(metadata or {})  # the model's: ep_compatibility_info.<EP> (verdicts)
        self._fail_on_suboptimal = opt.config_flag(config, opt.FAIL_ON_SUBOPTIMAL_COMPILED_MODEL)
        self._warned: set[str] = set()  # EPs whose suboptimal contexts were logged

    def route(
        self, graph: ir.Graph, providers: Sequence[ExecutionProvider]
    ) -> dict[ir.Node, ExecutionProvider]:
        """Each EPContext node goes to the first EP that accepts its ``source``; none is InvalidGraph."""
        views = ((node, EPContextNode.from_ir(node)) for node in graph if is_ep_context(node))
        return self.route_views(views, providers)

    def route_views(
        self, views: Iterable[tuple[_Node, EPContextNode]], providers: Sequence[ExecutionProvider]
    ) -> dict[_Node, ExecutionProvider]:
        """``route`` for nodes already read (the lean reader's): keyed by the caller's node objects."""
        routed: dict[_Node, ExecutionProvider] = {}
        for node, view in views:
            source = view.source or ""
            ep = next((p for p in providers if p.compiles and p.accepts_source(source)), None)
            if ep is None:
                names = ", ".join(p.name for p in providers)
                hint = (
                    f"pass the EP that loads it: providers=[{source!r}] (-p {source} on the command line)"
                    if source
                    else "the node names no source EP: pass the EP that made it in providers="
                )
                raise InvalidGraph(
                    f"EPContext node {view.name!r} was made by {source!r}, which none of this session's "
                    f"execution providers ({names}) accepts; {hint}"
                )
            self._views[node] = view
            routed[node] = ep
            if view.main_context:
                self._mains.setdefault(ep.name, []).append(view)
        return routed

    def load(self, ep: ExecutionProvider, node: Hashable, partition: Partition) -> CompiledPartition:
        view = self._views[node]
        graph_name = view.partition_name or view.name
        binary = self._binary_for(ep, view, graph_name)
        where = f"EPContext node {view.name!r} (source {view.source!r})"
        if not ep.accepts_source(binary.ep_name):
            raise InvalidGraph(f"{where}: its binary was made by {binary.ep_name!r}, not by {ep.name}")
        if view.ep_sdk_version is not None and view.ep_sdk_version != binary.sdk_version:
            raise InvalidGraph(
                f"{where}: ep_sdk_version {view.ep_sdk_version!r} disagrees with its binary's "
                f"{binary.sdk_version!r}"
            )
        if view.hardware_architecture is not None and view.hardware_architecture != binary.hardware:
            raise InvalidGraph(
                f"{where}: hardware_architecture {view.hardware_architecture!r} disagrees with its binary's "
                f"{binary.hardware!r}"
            )
        _check_identity(view, binary, graph_name, where)
        self._judge(ep, binary, where)
        reason = ep.check_context(view, binary.sdk_version, binary.hardware)
        if reason is not None:
            raise InvalidGraph(f"{where} cannot be loaded by this {ep.name}: {reason}")
        source = ContextSource(binary, graph_name)
        try:
            check_io_names(source.read(IO_KEY) if IO_KEY in source else None, view, where)
            return ep.load_partition(source, view, partition)
        except InvalidGraph as exc:  # e.g. a checksum mismatch in the binary: say which node it broke
            message = str(exc.args[0]) if exc.args else str(exc)
            raise InvalidGraph(message if message.startswith(where) else f"{where}: {message}") from exc
        except EPCtxError:
            raise
        except Exception as exc:  # a backend's own error while importing: keep it as the cause
            raise InvalidGraph(f"{where}: {ep.name} failed to load graph {graph_name!r}: {exc}") from exc

    def _judge(self, ep: ExecutionProvider, binary: ContextBinary, where: str) -> None:
        """The EP's compatibility verdict on the node (``ep/compatibility.py``), before its EP loads anything:
        UNSUPPORTED refuses the model, PREFER_RECOMPILATION warns (or refuses, as onnxruntime does, with
        ``session.fail_on_suboptimal_compiled_model=1``). The message is ``epctx check``'s explanation."""
        from epctx.ep.compatibility import OrtCompiledModelCompatibility as Compat
        from epctx.ep.compatibility import judge_node, node_info

        info, from_metadata = node_info(ep.name, self._metadata, binary.sdk_version, binary.hardware)
        verdict = judge_node(
            info, from_metadata, binary.sdk_version, type(ep).validate_compatibility_info, ()
        )
        if verdict.status == Compat.EP_UNSUPPORTED:
            raise InvalidGraph(f"{where} cannot be loaded by this {ep.name}: {verdict.explain()}")
        if verdict.status != Compat.EP_SUPPORTED_PREFER_RECOMPILATION:
            return
        message = f"{where}: the compiled model is suboptimal for this {ep.name}: {verdict.explain()}"
        if self._fail_on_suboptimal:
            raise Fail(f"{message} ({opt.FAIL_ON_SUBOPTIMAL_COMPILED_MODEL}=1)")
        if ep.name not in self._warned:
            self._warned.add(ep.name)
            logger.warning("%s", message)

    def _binary_for(self, ep: ExecutionProvider, view: EPContextNode, graph_name: str) -> ContextBinary:
        if view.main_context:
            return self._open(view)
        # main_context=0: the graph lives in the binary of one of the EP's main context nodes.
        for main in self._mains.get(ep.name, []):
            binary = self._open(main)
            if ContextSource(binary, graph_name).keys():
                return binary
        raise InvalidGraph(
            f"EPContext node {view.name!r} (main_context=0) names graph {graph_name!r}, which no main context "
            f"of {ep.name} in this model holds"
        )

    def _open(self, view: EPContextNode) -> ContextBinary:
        if view.embed_mode == 1:
            key = f"node:{view.name}"
            if key not in self._binaries:
                self._binaries[key] = ContextBinary.from_bytes(
                    view.ep_cache_context or b"", where=f"embedded context of EPContext node {view.name!r}"
                )
            return self._binaries[key]
        if self._base is None:
            raise InvalidArgument(
                f"EPContext node {view.name!r} refers to the file {view.cache_path!r} and the model comes from "
                f"bytes: set {opt.EP_CONTEXT_FILE_PATH} so the binary can be found beside it"
            )
        reference = f"file:{view.cache_path}"  # nodes naming one file resolve it once
        binary = self._binaries.get(reference)
        if binary is None:
            path = resolve_context_file(self._base, view.cache_path, node=view.name)
            key = str(path)
            if key not in self._binaries:
                if self._share:  # weight sharing: the group's sessions open a shared binary once
                    from epctx.epcontext.workspace import workspace

                    self._binaries[key] = workspace(view.source or "").open(path)
                else:
                    self._binaries[key] = ContextBinary.open(path)
            binary = self._binaries[reference] = self._binaries[key]
        return binary

    def finish(self) -> None:
        """After every node is loaded: the last session of a sharing group releases the workspace."""
        if self._share and self._stop_share:
            from epctx.epcontext.workspace import workspace

            for ep_name in self._mains:
                workspace(ep_name).release_loaded()


def _check_identity(view: EPContextNode, binary: ContextBinary, graph_name: str, where: str) -> None:
    """The binary holds the graph the node was made with (``identity.py``): its identity is recorded by
    epctx; a node without one (made by onnxruntime's EPs) is checked by its EP alone."""
    source = ContextSource(binary, graph_name)
    keys = list(source.keys())
    if not keys:
        raise InvalidGraph(f"{where}: {binary.where} holds no graph named {graph_name!r}")
    recorded = view.extra.get(IDENTITY_ATTRIBUTE)
    if recorded is None:
        return
    if not isinstance(recorded, str):
        raise InvalidGraph(f"{where}: attribute {IDENTITY_ATTRIBUTE!r} must be a STRING")
    rows = [(info.name, info.kind, info.size, info.checksum, info.attrs) for info in map(source.entry, keys)]
    found = graph_identity(graph_name, rows, binary.checksum_algorithm)
    if found != recorded:
        raise InvalidGraph(
            f"{where}: {binary.where} is not the binary this model was made with: graph {graph_name!r} there "
            f"has identity {found}, the node records {recorded} (was the binary regenerated or replaced? "
            "regenerate the context model with it)"
        )
