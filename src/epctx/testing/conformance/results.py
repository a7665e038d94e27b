"""What the conformance suite reports: the cases, one result per case, and the table of results."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["CASES", "CaseFailed", "CaseResult", "Generated", "Record", "expect", "format_table"]

CASES = (
    "round_trip_embed0",
    "round_trip_embed1",
    "partial_model",
    "prefix_merge",
    "weight_sharing",
    "corrupted_binary",
    "foreign_binary",
    "sdk_version_mismatch",
    "hardware_mismatch",
    "no_compile_on_load",
)


@dataclasses.dataclass(frozen=True)
class CaseResult:
    """One case on one EP. ``delegated_nodes``: the names of the source models' nodes the EP took when the
    case generated its context models (of ``total_nodes``); ``max_error``: the largest absolute difference from
    onnxruntime over every output the case ran (None for cases that expect an error)."""

    case: str
    passed: bool
    delegated_nodes: tuple[str, ...]
    total_nodes: int
    max_error: float | None
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"delegated_nodes": list(self.delegated_nodes)}


class CaseFailed(Exception):
    """A conformance check that did not hold (never escapes ``run_conformance``)."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CaseFailed(message)


@dataclasses.dataclass
class Record:
    delegated: list[str] = dataclasses.field(default_factory=list)
    total: int = 0
    errors: list[float] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Generated:
    folder: Path
    ctx: Path
    source: Path
    delegated: tuple[str, ...]
    total: int
    output: np.ndarray


def format_table(results: Mapping[str, Sequence[CaseResult]]) -> str:
    """EP x case: passed, delegated nodes (of the total), max abs error vs onnxruntime."""
    rows = [("EP", "case", "passed", "delegated", "max error", "detail")]
    for ep, found in results.items():
        for r in found:
            error = "-" if r.max_error is None else f"{r.max_error:.2e}"
            detail = r.detail if len(r.detail) <= 100 else r.detail[:97] + "..."
            rows.append((ep, r.case, "yes" if r.passed else "NO", f"{len(r.delegated_nodes)}/{r.total_nodes}",
                         error, detail))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:5], widths)) + "  " + row[5] for row in rows]
    return "\n".join(line.rstrip() for line in lines)
