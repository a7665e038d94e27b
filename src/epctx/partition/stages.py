"""Stage results of session creation, as immutable values the later stages take (never the session itself)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx_ir as ir

    from epctx.ep._contract import CompiledPartition
    from epctx.options import SessionConfig
    from epctx.partition.partitioner import Unit

__all__ = ["CompiledModel"]


@dataclasses.dataclass(frozen=True, slots=True)
class CompiledModel:
    """A model split among EPs after compiling: what generation writes as a context model."""

    model: ir.Model
    source_path: Path | None  # the file the model was loaded from (None: from bytes)
    units: tuple[Unit, ...]  # in execution order
    compiled: Mapping[int, CompiledPartition]  # partitions compiled by this session, by unit index
    config: SessionConfig  # the session config, parsed
    # node -> (EP name, why): nodes refused to an EP that claims them (the measured rule's hand-backs), which
    # the context model records (``epctx.partition.measured.REFUSALS_KEY``)
    refused: Mapping[ir.Node, tuple[str, str]] = dataclasses.field(default_factory=dict)
