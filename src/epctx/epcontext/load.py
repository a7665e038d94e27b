"""Load a context model's EPContext nodes: route them to EPs by ``source``, find and verify their binaries."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from epctx import options as opt
from epctx.ep._context_node import EPContextNode, is_ep_context
from epctx.ep._contract import CompiledPartition, ExecutionProvider, Partition
from epctx.epcontext.container import ContextBinary
from epctx.epcontext.identity import IDENTITY_ATTRIBUTE, graph_identity
from epctx.epcontext.io_names import IO_KEY, check_io_names
from epctx.epcontext.paths import resolve_context_file
from epctx.epcontext.store import ContextSource
from epctx.errors import EPCtxError, Fail, InvalidArgument, InvalidGraph

if TYPE_CHECKING:
    import mmap

    from epctx.model.view import GraphView, NodeView
    from epctx.trust.hooks import ReadFunc

__all__ = ["ContextLoader"]

logger = logging.getLogger("epctx")


class ContextLoader:
    """One per session. ``route`` assigns EPContext nodes to EPs; ``load`` rebuilds one compiled partition."""

    def __init__(
        self,
        *,
        model_path: Path | None,
        config: opt.SessionConfig,
        metadata: Mapping[str, str] | None = None,
        read_func: ReadFunc | None = None,
    ) -> None:
        self._model_path = model_path
        self._read = read_func  # the EPContext data read callback (``epctx.trust.hooks``): binaries by name
        self._config = config
        if model_path is not None:
            self._base: Path | None = model_path.resolve().parent
        elif config.ep_context_file_path:
            self._base = Path(config.ep_context_file_path).resolve().parent
        else:
            self._base = None
        self._views: dict[NodeView, EPContextNode] = {}  # node (onnx-ir's or the lean reader's) -> its view
        self._mains: dict[str, list[EPContextNode]] = {}  # EP name -> its main context nodes
        self._binaries: dict[str, ContextBinary] = {}  # resolved path or node name -> opened binary
        self._share = config.share_ep_contexts
        self._stop_share = config.stop_share_ep_contexts
        self._metadata = dict(metadata or {})  # the model's: ep_compatibility_info.<EP> (verdicts)
        self._fail_on_suboptimal = config.fail_on_suboptimal_compiled_model
        self._warned: set[str] = set()  # EPs whose suboptimal contexts were logged
        self._copy = config.context_binary_copy
        self._verified: dict[str, list[int] | None] = {}  # trust policy: file -> stamp when verified
        self._resolved: dict[str, Path] = {}  # trust policy: a node's cache path -> the file checked

    def route(
        self, graph: GraphView, providers: Sequence[ExecutionProvider]
    ) -> dict[NodeView, ExecutionProvider]:
        """Each EPContext node of ``graph`` (either loader's) goes to the first EP that accepts its
        ``source``; none is InvalidGraph. With a trust policy (``epctx.trust``), the files the nodes reference
        (and the graph's external data) are checked here, before any EP or backend reads a byte of them."""
        views = [(node, EPContextNode.from_node(node)) for node in graph if is_ep_context(node)]
        if views and self._config.trust_policy != "off":  # the fallback's external data is covered too
            self._check_trust([view for _, view in views], _external_files(graph))
        routed: dict[NodeView, ExecutionProvider] = {}
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

    def _check_trust(self, views: list[EPContextNode], external: Sequence[Path]) -> None:
        from epctx.trust.policy import carries_native_code, check_context_files

        files: dict[Path, bool] = dict.fromkeys(external, False)
        from_callback: dict[str, bool] = {}  # read callback: no file a signature could cover
        model_native = False
        for view in views:
            native = carries_native_code(view.source)
            if view.embed_mode == 1:
                model_native = model_native or native
            elif view.main_context and self._read is not None:
                from_callback[view.cache_path] = from_callback.get(view.cache_path, False) or native
            elif view.main_context and self._base is not None and view.cache_path:
                path = resolve_context_file(self._base, view.cache_path, node=view.name)
                self._resolved[view.cache_path] = path  # the file verified is the file opened (resolved once)
                files[path] = files.get(path, False) or native
        self._verified = check_context_files(
            self._model_path,
            files,
            model_native,
            self._config,
            from_callback=from_callback,
            hasher=_SharedPass(),
        )

    def load(self, ep: ExecutionProvider, node: NodeView, partition: Partition) -> CompiledPartition:
        view = self._views[node]
        source, where = self.open_graph(ep, node)
        try:
            check_io_names(source.read(IO_KEY) if IO_KEY in source else None, view, where)
            return ep.load_partition(source, view, partition)
        except InvalidGraph as exc:  # e.g. a checksum mismatch in the binary: say which node it broke
            message = str(exc.args[0]) if exc.args else str(exc)
            raise InvalidGraph(message if message.startswith(where) else f"{where}: {message}") from exc
        except EPCtxError:
            raise
        except Exception as exc:  # a backend's own error while importing: keep it as the cause
            raise InvalidGraph(
                f"{where}: {ep.name} failed to load graph {source.graph_name!r}: {exc}"
            ) from exc

    def open_graph(self, ep: ExecutionProvider, node: NodeView) -> tuple[ContextSource, str]:
        """The entries of a routed node's graph, once its binary, identity and verdict are checked (what
        ``load`` hands the EP; a refit reads the code from it), and the node's name for errors."""
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
        return ContextSource(binary, graph_name), where

    def _judge(self, ep: ExecutionProvider, binary: ContextBinary, where: str) -> None:
        """The EP's compatibility verdict on the node (``ep/compatibility.py``), before its EP loads anything:
        UNSUPPORTED refuses the model, PREFER_RECOMPILATION warns (or refuses, as onnxruntime does, with
        ``session.fail_on_suboptimal_compiled_model=1``). The message is ``epctx check``'s explanation."""
        from epctx.ep._compatibility import OrtCompiledModelCompatibility as Compat
        from epctx.ep._compatibility import judge_node, node_info

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
        if self._read is not None:
            return self._from_callback(self._read, view)
        if self._base is None:
            raise InvalidArgument(
                f"EPContext node {view.name!r} refers to the file {view.cache_path!r} and the model comes from "
                f"bytes: set {opt.EP_CONTEXT_FILE_PATH} so the binary can be found beside it"
            )
        reference = f"file:{view.cache_path}"  # nodes naming one file resolve it once
        binary = self._binaries.get(reference)
        if binary is None:
            path = self._resolved.get(view.cache_path) or resolve_context_file(
                self._base, view.cache_path, node=view.name
            )
            key = str(path)
            if key not in self._binaries:
                if self._share:  # weight sharing: the group's sessions open a shared binary once
                    from epctx.epcontext.workspace import workspace

                    self._binaries[key] = workspace(view.source or "").open(path, copy=self._copy)
                else:
                    self._binaries[key] = ContextBinary.open(path, copy=self._copy)
                if self._verified:
                    self._check_unchanged(path)
            binary = self._binaries[reference] = self._binaries[key]
        return binary

    def _from_callback(self, read: ReadFunc, view: EPContextNode) -> ContextBinary:
        name = view.cache_path
        key = f"callback:{name}"
        if key not in self._binaries:
            if self._share:  # weight sharing: the group's sessions ask the callback for a shared binary once
                from epctx.epcontext.workspace import workspace

                self._binaries[key] = workspace(view.source or "").from_callback(read, name)
                return self._binaries[key]
            from epctx.trust.hooks import read_named_buffer

            data = read_named_buffer(read, name)
            self._binaries[key] = ContextBinary.from_bytes(
                data, where=f"context binary {name!r} (from the EPContext data read callback)"
            )
        return self._binaries[key]

    def _check_unchanged(self, path: Path) -> None:
        """Under a trust policy: the binary just opened is the file that was verified (no write since)."""
        from epctx.errors import Untrusted
        from epctx.trust.record import stamp

        expected = self._verified.get(str(path))
        if expected is not None and stamp(path) != expected:
            raise Untrusted(
                f"{opt.TRUST_POLICY}: the context binary {str(path)!r} changed between its verification and its "
                "load (written or replaced meanwhile); expected the verified file"
            )

    def finish(self) -> None:
        """After every node is loaded: the last session of a sharing group releases the workspace."""
        if self._share and self._stop_share:
            from epctx.epcontext.workspace import workspace

            for ep_name in self._mains:
                workspace(ep_name).release_loaded()


class _SharedPass:
    """The trust check's hashing, in one pass with the container's checks (``shared_hash.py``, imported only
    when a file is hashed: a warm session's check, a few stats, does not pay for it), and what a verification
    record says that pass found for a file version unchanged since (its intact payloads): remembered for the
    session's reads, which then skip them (``digests.Hasher``)."""

    @staticmethod
    def sha256(
        mapping: mmap.mmap, fd: int, version: tuple[int, int, int, int], path: str
    ) -> tuple[str, list[list[object]]] | None:
        from epctx.epcontext.shared_hash import sha256_verifying

        return sha256_verifying(mapping, fd, version, path)

    @staticmethod
    def remember(version: tuple[int, int, int, int], notes: object) -> None:
        from epctx.epcontext.checksums import remember_verified

        if not isinstance(notes, list):
            return
        payloads = [
            (n[0], n[1], n[2])
            for n in notes
            if isinstance(n, list) and len(n) == 3 and type(n[0]) is int and type(n[1]) is int
            and isinstance(n[2], str)
        ]  # fmt: skip
        if payloads:
            remember_verified(version, payloads)


def _check_identity(view: EPContextNode, binary: ContextBinary, graph_name: str, where: str) -> None:
    """The binary holds the graph the node was made with (``identity.py``). Every binary read here is an epctx
    container, and epctx records the identity of every node it writes: a node without one is InvalidGraph
    (deleting the attribute must not switch the binding off)."""
    source = ContextSource(binary, graph_name)
    keys = list(source.keys())
    if not keys:
        raise InvalidGraph(f"{where}: {binary.where} holds no graph named {graph_name!r}")
    recorded = view.extra.get(IDENTITY_ATTRIBUTE)
    if recorded is None:
        raise InvalidGraph(
            f"{where}: {binary.where} is an epctx context binary, and the node has no {IDENTITY_ATTRIBUTE!r} "
            "attribute binding it to its graph (epctx writes one on every node it makes; expected one, found "
            "none: regenerate the context model)"
        )
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


def _external_files(graph: GraphView) -> list[Path]:
    if not hasattr(graph, "subgraphs"):  # the lean reader's graph: no initializers (and no onnx-ir import)
        return []
    import onnx_ir as ir

    if not isinstance(graph, ir.Graph):
        return []

    found: dict[str, Path] = {}
    for g in (graph, *graph.subgraphs()):
        for value in g.initializers.values():
            tensor = value.const_value
            if isinstance(tensor, ir.ExternalTensor):
                path = Path(tensor.base_dir) / str(tensor.location)
                found.setdefault(str(path), path)
    return list(found.values())
