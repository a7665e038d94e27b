"""``epctx check MODEL [-p EP] [--json]``: will this context model load here, and load well?

Prints the compatibility verdict of every EPContext node, per device its EP offers here (onnxruntime's four
states, each explained: what differs, compiled -> here), then what to do. Only the model's metadata, its
EPContext nodes and the binaries' headers are read; no backend loads anything.

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
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=check)


def check(args: argparse.Namespace) -> int:
    from epctx.cache.verdicts import check_model

    verdict = check_model(args.model, args.provider)
    if args.json:
        print(json.dumps(verdict.to_dict(), indent=2))
    else:
        print("\n".join(verdict.lines()))
    return 1 if verdict.findings else 0
