"""``epctx conformance [-p EP[:k=v,...]]... [--case CASE]... [--json]``: run the EP conformance suite and print
the table (EP x case: passed, delegated nodes, max error vs onnxruntime). Without ``-p``, every compiling EP
found here. Each EP runs with the profile its folder declares (``EP_CONFORMANCE``: options, tolerance, case
options), under what the command line gives. Exit status 1 when a case fails. Also
``python -m epctx.cli conformance``."""

from __future__ import annotations

import argparse
import json
import tempfile
from typing import TYPE_CHECKING, Any

from epctx.cli.provider_args import add_provider_arguments, providers_from_args

if TYPE_CHECKING:
    from epctx.testing.conformance import Profile

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
    parser.add_argument(
        "--atol", type=float, help="absolute tolerance (default: the EP's profile's, else 1e-4)"
    )
    parser.add_argument(
        "--rtol", type=float, help="relative tolerance (default: the EP's profile's, else 1e-4)"
    )
    parser.add_argument("--keep", metavar="DIR", help="write the cases' files under DIR and keep them")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


def run(args: argparse.Namespace) -> int:
    from epctx.providers.selection import parse_provider_spec
    from epctx.testing.conformance import CASES, CaseResult, format_table, run_profile

    case_options: dict[str, dict[str, str]] = {}
    for text in args.case_option:
        case, options = parse_provider_spec(text)
        if case not in CASES:
            raise ValueError(f"--case-option names unknown case {case!r}; known: {list(CASES)}")
        case_options.setdefault(case, {}).update(options)
    results: dict[str, list[CaseResult]] = {}
    for profile in _profiles(providers_from_args(args)):
        profile = _with(profile, {}, case_options, args.atol, args.rtol)
        with tempfile.TemporaryDirectory(prefix="epctx-conformance-") as tmp:
            where = f"{args.keep}/{profile.ep}" if args.keep else tmp
            results[profile.ep] = run_profile(profile, tmp_dir=where, cases=args.case)
    if args.json:
        print(json.dumps({ep: [r.as_dict() for r in found] for ep, found in results.items()}, indent=2))
    else:
        print(format_table(results))
    return 0 if all(r.passed for found in results.values() for r in found) else 1


def _profiles(given: list[tuple[str, dict[str, str]]]) -> list[Profile]:
    """The EPs given (each with its folder's profile, if it declares one, under the given options), or every
    compiling EP found here with its profile."""
    from epctx.testing.conformance import Profile, conformance_profiles, declared_profiles

    if not given:
        return conformance_profiles()
    declared = {p.ep: p for p in declared_profiles()}
    return [_with(declared.get(name) or Profile(name), options, {}) for name, options in given]


def _with(
    profile: Profile,
    options: dict[str, str],
    case_options: dict[str, dict[str, str]],
    atol: float | None = None,
    rtol: float | None = None,
) -> Profile:
    """``profile`` under the command line's options, case options and tolerances."""
    import dataclasses

    cases = {case: dict(opts) for case, opts in profile.case_options.items()}
    for case, opts in case_options.items():
        cases.setdefault(case, {}).update(opts)
    return dataclasses.replace(
        profile,
        options={**profile.options, **options},
        case_options=cases,
        atol=profile.atol if atol is None else atol,
        rtol=profile.rtol if rtol is None else rtol,
    )
