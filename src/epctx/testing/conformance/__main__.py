"""``python -m epctx.testing.conformance``: the same as ``epctx conformance`` (see ``epctx.cli.conformance``)."""

from __future__ import annotations

import sys

from epctx.cli import main

if __name__ == "__main__":
    sys.exit(main(["conformance", *sys.argv[1:]]))
