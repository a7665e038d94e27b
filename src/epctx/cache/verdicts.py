"""Verdicts per EPContext node and per device: what ``epctx check`` prints and what a session enforces.

A node is judged on the compatibility string of its EP in the model's metadata (``ep_compatibility_info.<EP>``)
or, for a model without one (written by onnxruntime, or by an older epctx), on its binary header's SDK version
and hardware. The header must agree with the metadata (else the binary was replaced: UNSUPPORTED). Only the
model's top-level message, its EPContext nodes and the binaries' headers are read.

A session (``ContextLoader``) judges every node before its EP loads it: ``EP_UNSUPPORTED`` is an InvalidGraph
whose message is the verdict's explanation; ``EP_SUPPORTED_PREFER_RECOMPILATION`` is a warning, or a Fail with
``session.fail_on_suboptimal_compiled_model=1`` (onnxruntime's option).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from epctx.ep._compatibility import (
    METADATA_PREFIX,
    CompatibilityVerdict,
    OrtCompiledModelCompatibility,
    judge_node,
    node_info,
)
from epctx.errors import EPCtxError, InvalidGraph

if TYPE_CHECKING:
    from epctx.ep._context_node import EPContextNode
    from epctx.ep._devices import HardwareDevice

__all__ = ["DeviceVerdict", "ModelVerdict", "NodeVerdict", "check_model", "device_label", "serves_here"]

_FINDINGS = (
    OrtCompiledModelCompatibility.EP_SUPPORTED_PREFER_RECOMPILATION,
    OrtCompiledModelCompatibility.EP_UNSUPPORTED,
)


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceVerdict:
    device: str  # how the device is shown
    verdict: CompatibilityVerdict


@dataclasses.dataclass(frozen=True, slots=True)
class NodeVerdict:
    node: str
    ep_name: str
    binary: str  # the binary's file, or "embedded"
    info: str  # the string judged
    from_metadata: bool
    devices: tuple[DeviceVerdict, ...]

    @property
    def verdict(self) -> CompatibilityVerdict:
        return CompatibilityVerdict.worst(d.verdict for d in self.devices)


@dataclasses.dataclass(frozen=True, slots=True)
class ModelVerdict:
    model: str
    nodes: tuple[NodeVerdict, ...]

    @property
    def status(self) -> OrtCompiledModelCompatibility:
        """The worst verdict (``EP_NOT_APPLICABLE`` for a model without EPContext nodes)."""
        return max(
            (n.verdict.status for n in self.nodes), default=OrtCompiledModelCompatibility.EP_NOT_APPLICABLE
        )

    @property
    def findings(self) -> bool:
        return self.status in _FINDINGS

    def to_dict(self) -> dict[str, object]:
        def verdict(v: CompatibilityVerdict) -> dict[str, object]:
            return {"status": v.status.name, "reasons": list(v.reasons), "advice": v.advice}

        return {
            "model": self.model,
            "status": self.status.name,
            "nodes": [
                {
                    "node": n.node,
                    "ep": n.ep_name,
                    "binary": n.binary,
                    "compatibility_info": n.info,
                    "from_metadata": n.from_metadata,
                    "status": n.verdict.status.name,
                    "devices": [{"device": d.device, **verdict(d.verdict)} for d in n.devices],
                }
                for n in self.nodes
            ],
        }

    def lines(self) -> list[str]:
        """The report: per node, per device, the verdict explained; then what to do."""
        if not self.nodes:
            return [f"{self.model}: no EPContext node: nothing compiled to judge (NOT_APPLICABLE)"]
        out = [f"{self.model}: {self.status.name.removeprefix('EP_')}"]
        for node in self.nodes:
            source = "metadata" if node.from_metadata else "binary header (no compatibility metadata)"
            out.append(f"  node {node.node!r} ({node.ep_name}, binary {node.binary}; judged on the {source})")
            out += [f"    {d.device}: {d.verdict.summary()}" for d in node.devices]
        advice = dict.fromkeys(
            d.verdict.advice
            for n in self.nodes
            for d in n.devices
            if d.verdict.status in _FINDINGS and d.verdict.advice
        )
        if advice:
            out.append("what to do: " + "; ".join(advice))
        return out


def device_label(device: HardwareDevice) -> str:
    name = device.metadata.get("model_name") or device.vendor
    target = device.metadata.get("target")
    virtual = (
        f" (virtual, target {target})"
        if device.is_virtual and target
        else (" (virtual)" if device.is_virtual else "")
    )
    return f"{device.type.name} {name}{virtual}"


def check_model(model: str | Path, ep_name: str | None = None) -> ModelVerdict:
    """Judge every EPContext node of the model at ``model`` (only those of EP ``ep_name`` when given) against
    each device its EP offers here."""
    from epctx.cache.scan import read_mapped, scan_model
    from epctx.ep._context_node import EPContextNode

    path = Path(model)
    scanned = read_mapped(path, scan_model)
    metadata = scanned.metadata
    views = [
        (EPContextNode.from_parts(n.name, n.inputs, n.outputs, n.attributes), n.header) for n in scanned.nodes
    ]
    nodes = []
    mains: dict[str, EPContextNode] = {}  # EP -> its first main context node (main_context=0 nodes use it)
    headers: dict[str, tuple[str, str] | str | None] = {}  # embedded binaries' headers, by node name
    for view, header in views:
        headers[view.name] = header
        routed = _ep_for(view.source or "") or (view.source or "")
        if view.main_context:
            mains.setdefault(routed, view)
        if ep_name is not None and routed != ep_name:
            continue
        main = mains.get(routed, view)
        nodes.append(_judge_view(view, main, headers.get(main.name), routed, metadata, path.parent))
    return ModelVerdict(str(path), tuple(nodes))


def serves_here(ctx: Path, what: str) -> bool:
    """Whether the context model at ``ctx`` may be served as it is: its verdict here is optimal (or not
    applicable); otherwise a warning, ``what`` naming it ("epctx.context_cache: the cached context"), says why
    it is compiled again."""
    import logging

    verdict = check_model(ctx)
    if verdict.status in (OrtCompiledModelCompatibility.EP_SUPPORTED_OPTIMAL,
                          OrtCompiledModelCompatibility.EP_NOT_APPLICABLE):  # fmt: skip
        return True
    logging.getLogger("epctx").warning(
        "%s %s is %s here; compiling it again: %s",
        what, ctx, verdict.status.name, " | ".join(verdict.lines()[1:]),
    )  # fmt: skip
    return False


def _ep_for(source: str) -> str | None:
    """The EP here that accepts an EPContext node's ``source`` (its name, or a class's ``sources``)."""
    from epctx.providers.registry import factories, provider_class

    names = [f.ep_name for f in factories()]
    exact = next((n for n in names if n.lower() == source.lower()), None)
    if exact is not None:
        return exact
    for name in names:
        cls = provider_class(name)
        if cls is not None and cls.sources and cls.accepts_source(source):
            return name
    return None


def _judge_view(
    view: EPContextNode,
    main: EPContextNode,
    embedded: tuple[str, str] | str | None,
    ep_name: str,
    metadata: Mapping[str, str],
    folder: Path,
) -> NodeVerdict:
    """``main``: the node whose binary holds ``view``'s graph (itself when it is a main context); ``embedded``:
    that binary's header when embedded (or why it cannot be read)."""
    from epctx.cache.compatibility import validate_for_ep

    binary_name = "embedded" if main.embed_mode == 1 else main.cache_path
    devices = _devices_for(ep_name)

    def validate(info: str, hw: Sequence[HardwareDevice]) -> CompatibilityVerdict:
        return validate_for_ep(ep_name, info, hw)

    try:
        sdk, hardware = _header(main, embedded, folder)
    except (EPCtxError, OSError) as exc:
        foreign = isinstance(exc, InvalidGraph) and "not an epctx context binary" in str(exc)
        if not foreign or METADATA_PREFIX + ep_name not in metadata:
            bad = CompatibilityVerdict.unsupported(f"its binary cannot be read: {exc}")
            return NodeVerdict(view.name, ep_name, binary_name, "", False, (DeviceVerdict("-", bad),))
        sdk, hardware = "", ""  # a payload epctx does not wrap (onnxruntime's EPs): judged on the metadata
    info, from_metadata = node_info(ep_name, metadata, sdk, hardware)
    rows = [
        DeviceVerdict(device_label(d), judge_node(info, from_metadata, sdk, validate, [d])) for d in devices
    ]
    if not rows:
        rows = [DeviceVerdict("this machine", judge_node(info, from_metadata, sdk, validate, []))]
    return NodeVerdict(view.name, ep_name, binary_name, info, from_metadata, tuple(rows))


def _header(view: EPContextNode, embedded: tuple[str, str] | str | None, folder: Path) -> tuple[str, str]:
    """(SDK version, hardware) from the node's binary header (main context), else the node's attributes."""
    from epctx.epcontext.container import ContextBinary
    from epctx.epcontext.paths import resolve_context_file

    if not view.main_context:
        return view.ep_sdk_version or "", view.hardware_architecture or ""
    if view.embed_mode == 1:
        if not isinstance(embedded, tuple):
            raise InvalidGraph(embedded or f"EPContext node {view.name!r}: its embedded binary was not read")
        sdk, hardware = embedded
    else:
        with ContextBinary.open(resolve_context_file(folder, view.cache_path, node=view.name)) as binary:
            sdk, hardware = binary.sdk_version, binary.hardware
    if view.ep_sdk_version is not None and view.ep_sdk_version != sdk:
        raise InvalidGraph(
            f"ep_sdk_version {view.ep_sdk_version!r} of the node disagrees with its binary's {sdk!r}"
        )
    return sdk, hardware


def _devices_for(ep_name: str) -> list[HardwareDevice]:
    """The devices EP ``ep_name`` offers here. Built-in EPs without their own device discovery are offered
    this machine's CPU only (no backend is imported to list devices for them)."""
    from epctx.ep._hardware import cpu_device
    from epctx.providers.builtin import builtin
    from epctx.providers.registry import discover_hardware, factories

    factory = next((f for f in factories() if f.ep_name == ep_name), None)
    if factory is None:
        return []
    decl = builtin(ep_name)
    hardware = [cpu_device()] if decl is not None and decl.hardware is None else discover_hardware()
    try:
        return [d.device for d in factory.get_supported_devices(hardware)]
    except Exception:  # a factory that cannot list its devices: judged against this machine
        return []
