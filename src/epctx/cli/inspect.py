"""``epctx inspect MODEL [--json] [--verify]``: what a context model holds, the binaries it needs, what it lacks.
``epctx inspect --placement MODEL -p EP ... [--json] [--html PAGE]``: where each node runs and why the EPs ahead
declined it (``epctx.cli.placement``)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from epctx.cli.provider_args import add_provider_arguments

__all__ = ["add_parser", "format_report"]

_MAX_VALUE = 96  # characters of an attribute value shown in text mode
_MAX_ENTRIES = 20  # container entries listed in text mode (--json lists all)
_MAX_OPSETS = 4


def add_parser(sub: Any) -> None:
    p = sub.add_parser("inspect", help="list a context model's EPContext nodes, binaries and findings")
    p.add_argument("model")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--verify",
        action="store_true",
        help="also verify every checksum of epctx binaries; exit 1 when it reports a finding (error or warning)",
    )
    p.add_argument(
        "--placement",
        action="store_true",
        help="where each node runs on the -p providers and why the EPs ahead declined it (creates a session)",
    )
    add_provider_arguments(p)
    p.add_argument(
        "--html", metavar="PAGE", help="with --placement: write the graph as a self-contained page"
    )
    p.set_defaults(func=inspect)


def inspect(args: argparse.Namespace) -> int:
    from epctx.tools.inspect import inspect_model

    if args.placement:
        from epctx.cli.placement import inspect_placement

        return inspect_placement(args)
    if args.html or args.provider:
        from epctx.cli.failures import UsageError

        raise UsageError("-p and --html go with --placement", "epctx inspect")

    report = inspect_model(args.model, verify=args.verify)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(format_report(report))
    return 1 if args.verify and report.findings else 0


def format_report(report: Any) -> str:
    """The human-readable form of a ModelReport."""
    out: list[str] = []
    domains = sorted(report.opset_imports, key=lambda d: d not in ("ai.onnx", "com.microsoft"))  # stable
    opsets = ", ".join(f"{d} {report.opset_imports[d]}" for d in domains[:_MAX_OPSETS])
    if len(report.opset_imports) > _MAX_OPSETS:
        opsets += f" (+{len(report.opset_imports) - _MAX_OPSETS} more)"
    out.append(f"model    {report.path}")
    out.append(f"         IR {report.ir_version}, producer {report.producer or '-'}; opsets {opsets}")
    for ep, info in report.ep_compatibility_info.items():
        out.append(f"compat   {ep}: {info}")

    nodes = report.ep_context_nodes
    out.extend(_node_lines(nodes))
    out.extend(_binary_lines(report.binary_files))
    for node in nodes:  # embedded containers list their entries too
        if node.embed_mode == 1 and node.payload is not None and node.payload.entries:
            out.append(f"  entries embedded in {node.name}:")
            out.extend(_entries(node.payload.entries))

    out.append("")
    total = sum(report.other_nodes.values())
    if total:
        out.append(f"other nodes (run by the CPU EP or other EPs): {total}")
        out.append("  " + ", ".join(f"{op} {n}" for op, n in report.other_nodes.items()))
    else:
        out.append("other nodes: none")

    out.append("")
    out.append(f"findings: {len(report.findings)}" if report.findings else "findings: none")
    for f in report.findings:
        node = f" [{f.node}]" if f.node else ""
        out.append(f"  {f.severity:<8}{node} {f.message}")
    return "\n".join(out)


def _node_lines(nodes: Any) -> list[str]:
    """The EPContext nodes section of the report."""
    out = ["", f"EPContext nodes: {len(nodes)}" if nodes else "EPContext nodes: none (not a context model)"]
    for i, node in enumerate(nodes, 1):
        where = "" if node.graph == "main" else f"  (in {node.graph})"
        out.append(f"  [{i}] {node.name or '<unnamed>'}{where}")
        rows = {k: _short(v) for k, v in node.attributes.items()}
        if node.embed_mode == 1 and node.payload is not None and "ep_cache_context" in rows:
            rows["ep_cache_context"] = f"{rows['ep_cache_context']} {node.payload.format}"
        rows["inputs"] = ", ".join(node.inputs)
        rows["outputs"] = ", ".join(node.outputs)
        if node.payload is not None and node.file is not None:
            rows["payload"] = f"{node.payload.format}, {node.payload.size:,} bytes (in {node.file})"
        elif node.payload is not None:
            rows["payload"] = _payload_line(node.payload)
        out.extend(_table(rows, indent=6))
    return out


def _binary_lines(files: Any) -> list[str]:
    """The context binaries section of the report (none when the nodes embed their payloads)."""
    out = ["", f"context binaries: {len(files)}"] if files else []
    for file in files:
        out.append(f"  {file.reference}")
        size = "" if file.size is None else f", {file.size:,} bytes"
        rows = {"path": file.path, "status": f"{file.status}{size}", "used by": ", ".join(file.nodes)}
        if file.payload is not None:
            rows["format"] = _payload_line(file.payload, with_size=False)
        out.extend(_table(rows, indent=6))
        if file.payload is not None and file.payload.entries:
            out.extend(_entries(file.payload.entries))
    return out


def _payload_line(payload: Any, *, with_size: bool = True) -> str:
    text = payload.format + (f", {payload.size:,} bytes" if with_size else "")
    details = ", ".join(f"{k}={v}" for k, v in payload.details.items())
    return f"{text} ({details})" if details else text


def _table(rows: Mapping[str, str], *, indent: int) -> list[str]:
    width = max((len(k) for k in rows), default=0)
    return [f"{' ' * indent}{k:<{width}}  {v}" for k, v in rows.items()]


def _entries(entries: Any) -> list[str]:
    shown = list(entries)[:_MAX_ENTRIES]
    name_w = max(len("entry"), *(len(e.name) for e in shown))
    kind_w = max(len("kind"), *(len(e.kind) for e in shown))
    lines = [f"      {'entry':<{name_w}}  {'kind':<{kind_w}}  {'bytes':>12}"]
    lines += [f"      {e.name:<{name_w}}  {e.kind:<{kind_w}}  {e.size:>12,}" for e in shown]
    if len(entries) > len(shown):
        lines.append(f"      ... {len(entries) - len(shown)} more (--json lists all)")
    return lines


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= _MAX_VALUE else text[: _MAX_VALUE - 3] + "..."
