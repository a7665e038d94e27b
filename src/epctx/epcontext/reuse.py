"""The graphs of a context model opened for reuse: a refit (``epctx.refit_context``) generates a context for a
model with the same graph and other weights from the code of an existing one, through the same checks as a load
(binary, identity, SDK and hardware verdict) but without loading anything into a backend."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from epctx.ep._context_node import is_ep_context
from epctx.epcontext.load import ContextLoader
from epctx.errors import InvalidArgument, InvalidGraph
from epctx.model.load import load_model

if TYPE_CHECKING:
    from epctx.ep import ContextReader, ExecutionProvider
    from epctx.options import SessionConfig

__all__ = ["reusable_graphs"]


def reusable_graphs(
    path: str | os.PathLike[str], providers: Sequence[ExecutionProvider], config: SessionConfig
) -> dict[str, list[ContextReader]]:
    """EP name -> the graphs of the context model at ``path`` that EP made (each checked as a load checks it).
    An EP of the session that would have to compile, yet cannot refit, is InvalidArgument."""
    loaded = load_model(path)
    graph = loaded.model.graph
    nodes = [node for node in graph if is_ep_context(node)]
    if not nodes:
        raise InvalidGraph(f"refit: {os.fspath(path)!r} has no EPContext node: it is not a context model")
    loader = ContextLoader(
        model_path=Path(path), config=config, metadata=loaded.model.metadata_props, read_func=None
    )
    routed = loader.route(graph, providers)
    found: dict[str, list[ContextReader]] = {}
    for node in nodes:
        ep = routed[node]
        if not ep.refits:
            raise InvalidArgument(
                f"refit: {os.fspath(path)!r} holds code of {ep.name}, whose compiled code holds its weights: "
                "it cannot be refit, compile the model instead"
            )
        recorded = loaded.model.metadata_props.get(f"ep_compatibility_info.{ep.name}")
        if recorded is not None and recorded != ep.compatibility_info():
            raise InvalidArgument(
                f"refit: {ep.name} with these options would record {ep.compatibility_info()!r}, the context was "
                f"compiled with {recorded!r}: pass the options it was compiled with"
            )
        source, _ = loader.open_graph(ep, node)
        found.setdefault(ep.name, []).append(source)
    return found
