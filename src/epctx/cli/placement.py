"""Where each node runs, on the command line: ``epctx compile``'s summary lines and ``epctx inspect
--placement MODEL -p EP ... [--json] [--html PAGE]`` (a session is created on the providers, as ``epctx run``
does; the page is self-contained: open it in any browser)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["inspect_placement", "placement_lines"]

_REASON_CHARS = 160


def placement_lines(summary: Mapping[str, Any]) -> list[str]:
    """The summary (``placement_summary``) as text: nodes (and partitions) per EP, then the largest reasons."""
    parts = summary["partitions_per_provider"]
    counts = ", ".join(
        f"{ep} {n}" + (f" in {parts[ep]} partition{'s' * (parts[ep] != 1)}" if ep in parts else "")
        for ep, n in summary["nodes_per_provider"].items()
    )
    lines = [f"nodes per EP: {counts}"]
    if summary["top_reasons"]:
        lines.append("largest reasons nodes went further down the provider list:")
    for r in summary["top_reasons"]:
        reason = r["reason"]
        if len(reason) > _REASON_CHARS:
            reason = reason[: _REASON_CHARS - 3] + "..."
        lines.append(f"  {r['nodes']:>5} nodes  {r['provider']}: {reason}")
    return lines


def inspect_placement(args: argparse.Namespace) -> int:
    import epctx
    from epctx.cli.provider_args import providers_from_args
    from epctx.partition.placement import placement_summary

    providers: list[Any] = list(providers_from_args(args))
    session = epctx.InferenceSession(args.model, providers=providers or None)
    placement = session.get_node_placement()
    summary = placement_summary(placement)
    if args.html:
        from epctx.partition.placement_page import render_placement_page

        page = render_placement_page(session.model.graph, placement, title=Path(args.model).name)
        Path(args.html).write_text(page, encoding="utf-8")
    if args.json:
        report = {"model": args.model, "providers": session.get_providers(), "summary": summary}
        report["nodes"] = [p.to_dict() for p in placement]
        print(json.dumps(report, indent=2))
        return 0
    print(f"model    {args.model}")
    print(f"EPs      {', '.join(session.get_providers())}")
    print("\n".join(placement_lines(summary)))
    graph = ""
    for p in placement:
        if p.graph != graph:
            graph = p.graph
            print(f"  in {'the body ' + graph if graph else 'the main graph'}:")
        where = p.provider + (f" [{p.partition}]" if p.partition else "")
        print(f"  {p.index:>5} {p.name or '(unnamed)'} ({p.op_type}) -> {where}")
        for ep, why in p.declined:
            print(f"          {ep} declined it: {why}")
    if args.html:
        print(f"wrote {args.html}")
    return 0
