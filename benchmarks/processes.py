"""Fresh-process timing helpers shared by the benchmarks: bytecode compiled once, and children that import this
checkout's epctx with bytecode reading on (this machine sets PYTHONDONTWRITEBYTECODE=1; a pip install does not)."""

from __future__ import annotations

import compileall
import os
from pathlib import Path

__all__ = ["child_env", "compile_bytecode"]

ROOT = Path(__file__).resolve().parents[1]


def compile_bytecode(src: Path = ROOT / "src") -> None:
    compileall.compile_dir(str(src), quiet=1)


def child_env(src: Path = ROOT / "src") -> dict[str, str]:
    """The environment of a child that imports epctx from ``src`` (this checkout's by default)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")])
    return env
