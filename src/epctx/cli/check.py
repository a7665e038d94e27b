"""``epctx check MODEL [-p EP] [--json]``: will this context model load here, and load well?

Prints the compatibility verdict of every EPContext node, per device its EP offers here (onnxruntime's four
states, each explained: what differs, compiled -> here), then what to do, and for a stale context whether it
can heal (``epctx.self_heal``): its source, found and bound by digest, or why not (``--source`` as
``ep.context_source_model_path``). Only the model's metadata, its EPContext nodes, the binaries' headers (and
the source's files, hashed, for a stale context) are read; no backend loads anything.

Exit status (as ``inspect --verify``): 0 every node loads optimally (or nothing is compiled); 1 a finding
(a node is UNSUPPORTED or would run better recompiled) or the model cannot be read; 2 the command line is wrong.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("check", help="judge a context model's compiled nodes against this machine's devices")
    p.add_argument("model")
    p.add_argument("-p", "--provider", help="judge only the nodes of this execution provider")
    p.add_argument(
        "--source", help="the source model a stale context would heal from (ep.context_source_model_path)"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=check)


def check(args: argparse.Namespace) -> int:
    from epctx.cache.verdicts import check_model

    verdict = check_model(args.model, args.provider)
    heal = _heal(args) if verdict.findings and verdict.nodes else None
    if args.json:
        print(json.dumps({**verdict.to_dict(), **({"self_heal": heal} if heal else {})}, indent=2))
    else:
        lines = verdict.lines()
        if heal is not None:  # before "what to do", which stays the last line
            at = len(lines) - 1 if lines[-1].startswith("what to do") else len(lines)
            lines.insert(
                at,
                f"self-heal: {heal['why']}; a session with epctx.self_heal=foreground|background compiles it again"
                if heal["source"]
                else f"self-heal: not possible: {heal['why']}",
            )
        print("\n".join(lines))
    return 1 if verdict.findings else 0


def _heal(args: argparse.Namespace) -> dict[str, Any]:
    from pathlib import Path

    from epctx.cache.heal import find_source
    from epctx.options import EP_CONTEXT_SOURCE_MODEL_PATH, SessionConfig

    config = SessionConfig({EP_CONTEXT_SOURCE_MODEL_PATH: args.source} if args.source else {})
    source, why = find_source(Path(args.model), config)
    return {"source": str(source) if source else None, "why": why}
