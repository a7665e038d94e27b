"""How the command line fails: one line on stderr naming the problem and the fix, never a traceback for a user
error; exit status 2 for a command line that is wrong in itself (argparse's convention: an unknown option, a
malformed ``NAME=VALUE``, options that contradict each other), 1 for a command that failed on the files it was
given (a model without that input, an output that exists, a binary that does not match). With ``--json`` the
error is also printed on stdout as ``{"error": {"type", "message", "exit_status"}}``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, NoReturn

__all__ = ["EXIT_FAILURE", "EXIT_USAGE", "Parser", "UsageError", "is_user_error", "report"]

EXIT_FAILURE = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """The command line itself is wrong (exit status 2); ``prog`` is the verb's ``epctx run`` and so on."""

    def __init__(self, message: str, prog: str = "epctx") -> None:
        super().__init__(message)
        self.prog = prog


class Parser(argparse.ArgumentParser):
    """argparse, but its errors are :class:`UsageError` (reported on one line by ``main``, JSON with --json)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, self.prog)


def is_user_error(exc: BaseException) -> bool:
    """Errors a user causes (bad files, bad options): reported on one line. Anything else is a bug: traceback."""
    from google.protobuf.message import DecodeError

    from epctx.errors import EPCtxError

    return isinstance(exc, (UsageError, EPCtxError, OSError, ValueError, DecodeError))


def report(exc: BaseException, *, prog: str, as_json: bool) -> int:
    """Print ``exc`` as the command line's one error line (and as JSON on stdout with --json); its exit status."""
    status = EXIT_USAGE if isinstance(exc, UsageError) else EXIT_FAILURE
    prog = exc.prog if isinstance(exc, UsageError) else prog
    message = " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__
    if isinstance(exc, UsageError):
        message += f" (see '{prog} --help')"
    if as_json:
        error: dict[str, Any] = {"type": type(exc).__name__, "message": message, "exit_status": status}
        print(json.dumps({"error": error}, indent=2))
    print(f"{prog}: error: {message}", file=sys.stderr)
    return status
