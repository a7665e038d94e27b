"""The ``epctx`` command line (thin over the library).

Exit status: 0 done; 1 the command failed on the files it was given; 2 the command line is wrong in itself.
Errors are one line on stderr (and JSON on stdout with ``--json``); see :mod:`epctx.cli.failures`.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    from epctx import __version__
    from epctx.cli import (
        cache,
        check,
        compile,
        conformance,
        demo,
        devices,
        inspect,
        merge,
        refit,
        run,
        share,
        sign,
        verify,
    )
    from epctx.cli.failures import Parser

    parser = Parser(
        prog="epctx",
        description="ONNX runtime built around the EP context cache",
        epilog="exit status: 0 done, 1 the command failed, 2 the command line is wrong",
    )
    parser.add_argument("--version", action="version", version=f"epctx {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for verb in (
        compile,
        run,
        merge,
        share,
        inspect,
        check,
        cache,
        devices,
        conformance,
        demo,
        sign,
        verify,
        refit,
    ):
        verb.add_parser(sub)
    from epctx.cli import package  # epctx package select|build|inspect|validate

    package.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from epctx.cli.failures import is_user_error, report
    from epctx.cli.progress import warning_lines

    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv
    prog = "epctx"
    try:
        with warning_lines(lambda: prog):
            parser = build_parser()
            args = parser.parse_args(argv)
            prog = f"epctx {args.command}"
            return int(args.func(args))
    except SystemExit as exc:  # --help and --version print and exit 0
        return exc.code if isinstance(exc.code, int) else 0
    except Exception as exc:
        if not is_user_error(exc):
            raise  # a bug in epctx: the traceback is what a report needs
        return report(exc, prog=prog, as_json=as_json)


if __name__ == "__main__":
    sys.exit(main())
