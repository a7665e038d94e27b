"""``epctx conformance [-p EP[:k=v,...]]... [--case CASE]... [--json]``: run the EP conformance suite and print
the table (EP x case: passed, delegated nodes, max error vs onnxruntime). Without ``-p``, every compiling EP
found here. Exit status 1 when a case fails. Also ``python -m epctx.cli conformance``."""

from __future__ import annotations

import argparse
import json
import tempfile
from typing import Any

from epctx.cli.provider_args import add_provider_arguments, providers_from_args

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "conformance", help="run the EP conformance suite on compiling EPs", description=__doc__
    )
    configure(p)
    p.set_defaults(func=run)


def configure(parser: argparse.ArgumentParser) -> None:
    from epctx.testing.conformance import CASES

    add_provider_arguments(parser)
    parser.add_argument("--case", action="append", choices=CASES, help="run only these cases")
    parser.add_argument("--case-option", action="append", default=[], metavar="CASE:k=v,...",
                        help="EP options for one case, e.g. partial_model:disabled_ops=LayerNormalization")  # fmt: skip
    parser.add_argument("--atol", type=float, default=1e-4)
    parser.add_argument("--rtol", type=float, default=1e-4)
    parser.add_argument("--keep", metavar="DIR", help="write the cases' files under DIR and keep them")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


def run(args: argparse.Namespace) -> int:
    from epctx.providers.selection import parse_provider_spec
    from epctx.testing.conformance import (
        CASES,
        CaseResult,
        compiling_providers,
        format_table,
        run_conformance,
    )

    providers = providers_from_args(args) or [(name, {}) for name in compiling_providers()]
    case_options: dict[str, dict[str, str]] = {}
    for text in args.case_option:
        case, options = parse_provider_spec(text)
        if case not in CASES:
            raise ValueError(f"--case-option names unknown case {case!r}; known: {list(CASES)}")
        case_options.setdefault(case, {}).update(options)
    results: dict[str, list[CaseResult]] = {}
    for name, options in providers:
        with tempfile.TemporaryDirectory(prefix="epctx-conformance-") as tmp:
            results[name] = run_conformance(
                name,
                options,
                tmp_dir=f"{args.keep}/{name}" if args.keep else tmp,
                cases=args.case,
                atol=args.atol,
                rtol=args.rtol,
                case_options=case_options,
            )
    if args.json:
        print(json.dumps({ep: [r.as_dict() for r in found] for ep, found in results.items()}, indent=2))
    else:
        print(format_table(results))
    return 0 if all(r.passed for found in results.values() for r in found) else 1
