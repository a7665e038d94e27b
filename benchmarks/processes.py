"""Fresh-process timing helpers shared by the benchmarks: bytecode compiled once, and children that import this
checkout's epctx with bytecode reading on (this machine sets PYTHONDONTWRITEBYTECODE=1; a pip install does not)."""

from __future__ import annotations

import compileall
import os
from pathlib import Path

__all__ = ["child_env", "compile_bytecode"]

ROOT = Path(__file__).resolve().parents[1]


def compile_bytecode() -> None:
    compileall.compile_dir(str(ROOT / "src"), quiet=1)


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return env
