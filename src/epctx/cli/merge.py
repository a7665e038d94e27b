"""``epctx merge MODEL MODEL... -o OUT``: combine context models into one (values connect by name)."""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("merge", help="merge context models made with different --prefix values")
    p.add_argument("models", nargs="+")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=merge)


def merge(args: argparse.Namespace) -> int:
    from epctx.epcontext.merge import merge_context_models

    merged = merge_context_models(args.models, args.output)
    nodes = sum(1 for n in merged.graph.node if n.op_type == "EPContext")
    if args.json:
        report = {
            "output": args.output,
            "ep_context_nodes": nodes,
            "other_nodes": len(merged.graph.node) - nodes,
            "inputs": [i.name for i in merged.graph.input],
            "outputs": [o.name for o in merged.graph.output],
        }
        print(json.dumps(report, indent=2))
        return 0
    print(f"wrote {args.output}: {nodes} EPContext node(s), {len(merged.graph.node) - nodes} other node(s)")
    return 0
