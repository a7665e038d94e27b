"""Weights stored once: the context binaries of variants that differ only in target become one binary.

A compiled variant is a context model and its binaries (``<stem>_<EP>.bin``). The code of each target is small;
its weights are the same bytes in every target's binary. Variants of one component whose binaries come from the
same EP and SDK are written into one binary: each variant's graphs are renamed ``<variant>.<graph>`` (the
EPContext nodes' ``partition_name`` follows; a node's payload identity covers the entry names *below* its graph,
so it still holds), and the container stores identical payloads once, so the weights are there once.

The binary header holds one ``hardware`` string, which the EP checks before it loads a graph (each graph then
checks its own target). Hardware strings of the form ``<triple>;<features>`` (IREE's) share one binary: with one
triple, its header lists the features all of them need; with several (x86-64 and aarch64), the header's hardware
is empty and each graph's own target is what the EP checks. Other hardware strings share a binary only when equal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import onnx

from epctx.errors import InvalidGraph

__all__ = ["Compiled", "share_binaries"]


@dataclasses.dataclass(frozen=True)
class Compiled:
    """One compiled variant: its context model and the folder it was written to (binaries beside it)."""

    variant: str
    model: Path


@dataclasses.dataclass
class _Group:
    ep: str
    sdk: str
    family: str
    hardware: list[str] = dataclasses.field(default_factory=list)
    members: list[tuple[str, Path]] = dataclasses.field(default_factory=list)  # (variant, binary)


def _family(hardware: str) -> tuple[str, frozenset[str] | None]:
    triple, sep, features = hardware.partition(";")
    if sep and triple and " " not in triple:
        return triple, frozenset(f for f in features.split(",") if f)
    return hardware, None


def _common_hardware(strings: Sequence[str]) -> str:
    families = {_family(s)[0] for s in strings}
    if len(families) > 1:
        return ""  # several triples: the graphs record their own
    family, first = _family(strings[0])
    if first is None:
        return strings[0]
    common = set(first)
    for s in strings[1:]:
        common &= _family(s)[1] or set()
    return f"{family};{','.join(sorted(common))}"


def _binaries(model: onnx.ModelProto) -> list[str]:
    names = []
    for node in model.graph.node:
        if node.op_type == "EPContext":
            attrs = {a.name: a for a in node.attribute}
            embed = attrs["embed_mode"].i if "embed_mode" in attrs else 1
            main = attrs["main_context"].i if "main_context" in attrs else 1
            if embed == 0 and main == 1 and "ep_cache_context" in attrs:
                names.append(attrs["ep_cache_context"].s.decode("utf-8"))
    return list(dict.fromkeys(names))


def _groups(compiled: Sequence[Compiled]) -> list[_Group]:
    from epctx.epcontext.container import ContextBinary

    groups: list[_Group] = []
    for item in compiled:
        for name in _binaries(onnx.load(str(item.model), load_external_data=False)):
            path = item.model.parent / name
            with ContextBinary.open(path) as binary:
                ep, sdk, hardware = binary.ep_name, binary.sdk_version, binary.hardware
            triple, features = _family(hardware)
            family = "<triple>;<features>" if features is not None else triple
            group = next((g for g in groups if (g.ep, g.sdk, g.family) == (ep, sdk, family)), None)
            if group is None:
                group = _Group(ep, sdk, family)
                groups.append(group)
            group.hardware.append(hardware)
            group.members.append((item.variant, path))
    return groups


def _write_group(group: _Group, out: Path, name: str) -> dict[tuple[str, str], tuple[str, str]]:
    """Write the group's binary as ``out/name``; (variant, old binary name) -> (new name, header hardware)."""
    from epctx.epcontext.container import ContextBinary
    from epctx.epcontext.writer import ContextBinaryWriter

    hardware = _common_hardware(group.hardware)
    opened = [ContextBinary.open(path) for _, path in group.members]
    try:
        writer = ContextBinaryWriter(ep_name=group.ep, sdk_version=group.sdk, hardware=hardware,
                                     metadata=dict(opened[0].metadata))  # fmt: skip
        for (variant, _), binary in zip(group.members, opened):
            for entry in binary.names():
                info = binary.entry(entry)
                writer.add(f"{variant}.{entry}", binary.read(entry), kind=info.kind, attrs=dict(info.attrs))
        writer.write(out / name)
    finally:
        for binary in opened:
            binary.close()
    return {(variant, path.name): (name, hardware) for variant, path in group.members}


def _rewrite(model: onnx.ModelProto, variant: str, renamed: dict[tuple[str, str], tuple[str, str]]) -> None:
    """Point the model's EPContext nodes at the shared binary and their graphs' new names."""
    mains: dict[str, tuple[str, str]] = {}  # source -> (new binary, hardware)
    for node in model.graph.node:
        if node.op_type != "EPContext":
            continue
        attrs = {a.name: a for a in node.attribute}
        source = attrs["source"].s.decode() if "source" in attrs else ""
        main = attrs["main_context"].i if "main_context" in attrs else 1
        target = None
        if main == 1 and "ep_cache_context" in attrs:
            key = (variant, attrs["ep_cache_context"].s.decode("utf-8"))
            target = renamed.get(key)
            if target is not None:
                mains[source] = target
        elif main == 0:
            target = mains.get(source)
        if target is None:
            continue
        graph = attrs["partition_name"].s.decode() if "partition_name" in attrs else node.name
        _set(node, "partition_name", f"{variant}.{graph}")
        if main == 1:
            _set(node, "ep_cache_context", target[0])
        if "hardware_architecture" in attrs and target[1]:
            _set(node, "hardware_architecture", target[1])
        elif "hardware_architecture" in attrs:  # several targets: each graph records its own
            node.attribute.remove(attrs["hardware_architecture"])


def _set(node: onnx.NodeProto, name: str, value: str) -> None:
    for attr in node.attribute:
        if attr.name == name:
            attr.s = value.encode("utf-8")
            return
    node.attribute.append(onnx.helper.make_attribute(name, value))


def share_binaries(compiled: Sequence[Compiled], out: Path, stem: str) -> dict[str, str]:
    """Write the variants' context models (``<variant>_ctx.onnx``) and their shared binaries into ``out``
    (``<stem>_<EP>[_<n>].bin``); variant -> its context model's file name."""
    groups = _groups(compiled)
    renamed: dict[tuple[str, str], tuple[str, str]] = {}
    counts: dict[str, int] = {}
    for group in groups:
        n = counts[group.ep] = counts.get(group.ep, 0) + 1
        name = f"{stem}_{group.ep}.bin" if n == 1 else f"{stem}_{group.ep}_{n}.bin"
        renamed.update(_write_group(group, out, name))
    files = {}
    for item in compiled:
        model = onnx.load(str(item.model), load_external_data=False)
        _rewrite(model, item.variant, renamed)
        files[item.variant] = f"{item.variant}_ctx.onnx"
        data = model.SerializeToString(deterministic=True)
        if not data:
            raise InvalidGraph(f"variant {item.variant!r}: its context model is empty")
        (out / files[item.variant]).write_bytes(data)
    return files
