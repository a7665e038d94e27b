"""``python -m epctx.testing.conformance [--provider NAME[:k=v,...]]... [--case CASE]... [--json]``: run the EP
conformance suite and print the table (EP x case: passed, delegated nodes, max error vs onnxruntime).
Without ``--provider``, every compiling EP found here. Exit status 1 when a case fails."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence

from epctx.testing.conformance import CASES, CaseResult, compiling_providers, format_table, run_conformance


def _provider(text: str) -> tuple[str, dict[str, str]]:
    name, _, rest = text.partition(":")
    options = {}
    for item in filter(None, rest.split(";" if ";" in rest else ",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"provider option {item!r} is not key=value")
        options[key.strip()] = value.strip()
    return name, options


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m epctx.testing.conformance", description=__doc__)
    parser.add_argument("--provider", "-p", action="append", type=_provider, default=[],
                        help="EP name, options after ':' as k=v separated by ',' (or ';' when values hold ',')")  # fmt: skip
    parser.add_argument("--case", action="append", choices=CASES, help="run only these cases")
    parser.add_argument("--case-option", action="append", type=_provider, default=[], metavar="CASE:k=v,...",
                        help="EP options for one case, e.g. partial_model:disabled_ops=LayerNormalization")  # fmt: skip
    parser.add_argument("--atol", type=float, default=1e-4)
    parser.add_argument("--rtol", type=float, default=1e-4)
    parser.add_argument("--keep", metavar="DIR", help="write the cases' files under DIR and keep them")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    providers = args.provider or [(name, {}) for name in compiling_providers()]
    unknown = sorted({case for case, _ in args.case_option} - set(CASES))
    if unknown:
        parser.error(f"--case-option names unknown case(s) {unknown}; known: {list(CASES)}")
    case_options: dict[str, dict[str, str]] = {}
    for case, options in args.case_option:
        case_options.setdefault(case, {}).update(options)
    results: dict[str, list[CaseResult]] = {}
    for name, options in providers:
        with tempfile.TemporaryDirectory(prefix="epctx-conformance-") as tmp:
            folder = args.keep and f"{args.keep}/{name}"
            results[name] = run_conformance(
                name,
                options,
                tmp_dir=folder or tmp,
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


if __name__ == "__main__":
    sys.exit(main())
