"""What the command-line tests check: a command's result, and the shape of a user error."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Result:
    status: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


Cli = Callable[..., "Result"]


def assert_one_error_line(result: Result, status: int, *words: str) -> None:
    """A user error: the exit status, one line on stderr naming the problem, no traceback."""
    assert result.status == status, result
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert " error: " in lines[0] and "Traceback" not in result.err
    for word in words:
        assert word in lines[0], lines[0]
