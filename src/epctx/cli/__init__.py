"""The ``epctx`` command line (thin over the library)."""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="epctx", description="ONNX runtime built around the EP context cache"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    from epctx.cli import compile, conformance, demo, devices, inspect, merge, run, share

    compile.add_parser(sub)
    run.add_parser(sub)
    merge.add_parser(sub)
    share.add_parser(sub)
    inspect.add_parser(sub)
    devices.add_parser(sub)
    conformance.add_parser(sub)
    demo.add_parser(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except Exception as exc:  # a typed epctx error or a bad argument: one line, no traceback
        from epctx.errors import EPCtxError

        if not isinstance(exc, (EPCtxError, OSError, ValueError)):
            raise
        print(f"epctx: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
