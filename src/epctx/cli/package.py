"""``epctx package select|build|inspect|validate``: model packages in onnxruntime's format.

- ``select PKG [-c COMPONENT] [-p EP ...] [--json]``: every variant of each component ranked for this machine
  (verdict from the manifest, the device judged, why), the chosen one first;
- ``build SPEC -o PKG [--workers N] [--ray ADDRESS] [--cache DIR] [--json]``: compile the SPEC's (component,
  target) jobs (a local process pool, or Ray with --ray or RAY_ADDRESS), skip those whose content key is cached,
  and commit the package atomically; a table per job (where it ran, time, size, verdict here);
- ``inspect PKG [--json]``: components, variants, shared assets and sizes;
- ``validate PKG [--json]``: shared-asset hashes recomputed and every variant's context model verified as
  ``inspect --verify`` does; exit 1 on a finding.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("package", help="model packages: select, build, inspect, validate")
    verbs = p.add_subparsers(dest="package_command", required=True, metavar="VERB")
    s = verbs.add_parser("select", help="rank each component's variants for this machine")
    s.add_argument("package")
    s.add_argument("-c", "--component", help="only this component")
    s.add_argument("-p", "--provider", action="append", help="the session's providers, in order (repeat)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=select)
    b = verbs.add_parser("build", help="compile a SPEC's components for its targets into a package")
    b.add_argument("spec")
    b.add_argument("-o", "--output", required=True, help="the package folder (replaced atomically)")
    b.add_argument("--workers", type=int, help="local worker processes (default: by cores and memory)")
    b.add_argument(
        "--ray", metavar="ADDRESS", help="run the jobs on this Ray cluster (default: $RAY_ADDRESS)"
    )
    b.add_argument("--cache", help="the job cache folder (default: PKG.jobs beside the package)")
    b.add_argument("--json", action="store_true", help="machine-readable output")
    b.set_defaults(func=build)
    for name, func, text in (
        ("inspect", inspect, "what a package holds"),
        ("validate", validate, "verify a package"),
    ):
        v = verbs.add_parser(name, help=text)
        v.add_argument("package")
        v.add_argument("--json", action="store_true", help="machine-readable output")
        v.set_defaults(func=func)


def select(args: argparse.Namespace) -> int:
    from epctx.package.layout import read_package
    from epctx.package.select import rank_variants

    package = read_package(args.package)
    components = [package.component(args.component)] if args.component else list(package.components)
    report = {c.name: rank_variants(c, args.provider) for c in components}
    if args.json:
        print(json.dumps({name: [r.to_dict() for r in ranked] for name, ranked in report.items()}, indent=2))
        return 0
    for name, ranked in report.items():
        print(f"component {name}:")
        for n, r in enumerate(ranked, 1):
            mark = "*" if n == 1 and r.eligible else " "
            status = r.verdict.status.name.removeprefix("EP_")
            print(f" {mark}{n}. {r.variant.name:<20} {r.variant.ep or '-':<24} {status:<30} {r.device}")
            if r.eligible:
                print(f"      {r.why}" + (f": {'; '.join(r.verdict.reasons)}" if r.verdict.reasons else ""))
            else:
                print(f"      refused: {r.why}")
    return 0


def _executor(args: argparse.Namespace) -> Any:
    from epctx.farm.executors import LocalPool, RayExecutor

    address = args.ray or os.environ.get("RAY_ADDRESS")
    return RayExecutor(address) if address else LocalPool(args.workers)


def build(args: argparse.Namespace) -> int:
    from epctx.farm.run import build as run_build

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    report = run_build(args.spec, args.output, _executor(args), cache=args.cache, progress=progress)
    if args.json:
        rows = [vars(r) for r in report.rows]
        print(json.dumps({"package": str(report.package), "executor": report.executor, "jobs": rows,
                          "seconds": round(report.seconds, 3)}, indent=2))  # fmt: skip
    else:
        print("\n".join(report.table()))
        print(f"package {report.package} written in {report.seconds:.1f} s")
    return 0


def inspect(args: argparse.Namespace) -> int:
    from epctx.package.tools import inspect_package

    report = inspect_package(args.package)
    print(json.dumps(report, indent=2) if args.json else "\n".join(_inspect_lines(report)))
    return 0


def _inspect_lines(report: dict[str, Any]) -> list[str]:
    lines = [
        f"package {report['root']} ({report.get('name') or 'unnamed'} {report.get('version') or ''})".rstrip()
    ]
    for component in report["components"]:
        lines.append(f"  component {component['name']}:")
        for v in component["variants"]:
            lines.append(
                f"    {v['name']:<20} {v['ep'] or '-':<24} {v['device'] or '-':<4} model {v['model_file']}"
            )
    for asset in report["assets"]:
        lines.append(f"  shared asset {asset['uri']}: {asset['files']} files, {asset['bytes']:,} bytes")
    lines.append(f"  on disk: {report['bytes']:,} bytes")
    return lines


def validate(args: argparse.Namespace) -> int:
    from epctx.package.tools import validate_package

    findings = validate_package(args.package)
    if args.json:
        print(json.dumps({"package": args.package, "findings": findings}, indent=2))
    elif findings:
        print("\n".join(f"FINDING: {f}" for f in findings))
    else:
        print(f"{args.package}: valid (asset hashes and every variant's context verified)")
    return 1 if findings else 0
