"""``epctx merge MODEL MODEL... -o OUT [--force]``: combine context models into one (values connect by name).

OUT's folder must exist; an existing OUT is replaced only with ``--force`` (checked before merging)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from epctx.cli.outputs import check_outputs

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("merge", help="merge context models made with different --prefix values")
    p.add_argument("models", nargs="+")
    p.add_argument("-o", "--output", required=True, help="the merged model (its folder must exist)")
    p.add_argument("--force", action="store_true", help="overwrite an existing output")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=merge)


def merge(args: argparse.Namespace) -> int:
    from epctx.epcontext.merge import merge_context_models

    check_outputs([Path(args.output)], force=args.force)
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
