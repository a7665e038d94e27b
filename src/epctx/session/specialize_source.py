"""How a specialized session is made (``epctx.session.specialize``): from which model, with which options.

The source: the session's own model, or, for a session over a context model (``<stem>_ctx.onnx``), the source model
its ``epctx.source_files`` record binds (``epctx.cache.heal.find_source``: ``ep.context_source_model_path``, else
the EPContext nodes' ``onnx_model_filename`` beside it, its files as compiled from); none when that is not there.
The options: the user's, with ``epctx.input_shapes`` set to the signature and the transparent cache's folder
(``epctx.context_cache`` as given, else ``<user cache>/specialized``, bounded to 2 GB), so that a later process loads what this one
compiled; nothing that writes beside the user's model (context generation, the optimized model, profiles, signing)
and no specialization of its own."""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from epctx import options as opt

if TYPE_CHECKING:
    from epctx.cache.scan import ScannedModel

__all__ = [
    "CACHE_FOLDER",
    "DEFAULT_MAX_MB",
    "Source",
    "shapes_text",
    "source_megabytes",
    "specialized_options",
    "specialization_source",
]

Source = str | os.PathLike[str] | bytes
CACHE_FOLDER = "specialized"  # under epctx.ep.user_cache_dir() when the user set no epctx.context_cache
DEFAULT_MAX_MB = 2048  # that folder's bound (epctx.context_cache_max_mb) unless the user gives one

# What a specialized session must not inherit: it writes nothing beside the user's model, joins no sharing group,
# heals or reuses nothing in place, reads its source as a plain model, and specializes nothing itself.
_DROPPED = (
    opt.EP_CONTEXT_ENABLE,
    opt.EP_CONTEXT_FILE_PATH,
    opt.EP_CONTEXT_EMBED_MODE,
    opt.EP_CONTEXT_NODE_NAME_PREFIX,
    opt.EP_CONTEXT_EXTERNAL_INITIALIZERS_FILE,
    opt.EP_CONTEXT_SOURCE_MODEL_PATH,
    opt.EP_ENABLE_WEIGHTLESS_MODE,
    opt.SHARE_EP_CONTEXTS,
    opt.STOP_SHARE_EP_CONTEXTS,
    opt.SELF_HEAL,
    opt.CONTEXT_REUSE,
    opt.REFIT_CONTEXT,
    opt.TRUST_SIGN_KEY,
    opt.SPECIALIZE_SHAPES_MAX,
    opt.SPECIALIZE_SHAPES_MAX_MB,
)


def shapes_text(names: Sequence[str], shapes: Sequence[tuple[int, ...]]) -> str:
    """The ``epctx.input_shapes`` value stating ``shapes`` for ``names``: ``x[1,3,48,192],mask[1,128]``."""
    return ",".join(f"{name}[{','.join(map(str, shape))}]" for name, shape in zip(names, shapes))


def specialized_options(options: opt.SessionOptions, config: opt.SessionConfig) -> opt.SessionOptions:
    """The user's options as a specialized session takes them, but for the signature (``with_config`` adds
    ``epctx.input_shapes`` per signature). A copy: the user's object is not changed."""
    from epctx.ep import user_cache_dir

    changes: dict[str, str | None] = dict.fromkeys(_DROPPED)
    changes[opt.SPECIALIZE_SHAPES] = "off"
    changes[opt.CONTEXT_CACHE] = config.context_cache or str(user_cache_dir(CACHE_FOLDER))
    if not config.context_cache and config.context_cache_max_mb is None:
        # epctx's own folder, which the user did not ask for: bounded (least recently used keys go first)
        changes[opt.CONTEXT_CACHE_MAX_MB] = str(DEFAULT_MAX_MB)
    derived = opt.with_config(options, changes)
    derived = copy.copy(derived)
    derived.enable_profiling = (
        False  # its runs are recorded in the owner's profile (InferenceSession._execute)
    )
    derived.optimized_model_filepath = ""
    return derived


def specialization_source(source: Source, config: opt.SessionConfig) -> tuple[Source | None, str]:
    """(the model a specialized session compiles from, or None; why not). A source model is itself; a context
    model's source is the one its record binds, when it is there unchanged."""
    from epctx.cache.scan import read_mapped, scan_model

    if isinstance(source, (bytes, bytearray, memoryview)):
        if _is_context(scan_model(memoryview(source))):
            return None, "the context model was given as bytes: it names no source model to specialize from"
        return bytes(source), ""
    path = Path(source)
    if not _is_context(read_mapped(path, scan_model)):
        return source, ""
    from epctx.cache.heal import find_source

    found, why = find_source(path, config)
    return found, why


def source_megabytes(source: Source, config: opt.SessionConfig) -> float:
    """The size of a specialization's source model in MB: its bytes and its external data files (looked for in
    ``session.model_external_initializers_file_folder_path`` when set, else beside the model; a missing one
    counts nothing, the compile says so). What each specialization compiles a copy of."""
    from epctx.cache.key import external_data_files
    from epctx.cache.scan import read_mapped

    if isinstance(source, (bytes, bytearray, memoryview)):
        locations = external_data_files(memoryview(source))
        total, folder = len(source), Path(config.external_initializers_folder or Path.cwd())
    else:
        path = Path(source)
        locations = read_mapped(path, external_data_files)
        total, folder = (
            path.stat().st_size,
            Path(config.external_initializers_folder or path.resolve().parent),
        )
    for location in locations:
        file = folder / location
        if file.is_file():
            total += file.stat().st_size
    return total / (1 << 20)


def _is_context(scanned: ScannedModel) -> bool:
    """Whether a model is a context model: EPContext nodes, or what epctx's generation records (its source's
    files, the measured rule's refusals: a context whose partitions were all handed back has no EPContext node,
    and compiling from it would refuse them again)."""
    from epctx.epcontext.identity import SOURCE_FILES_KEY
    from epctx.partition.measured import REFUSALS_KEY

    return bool(scanned.nodes) or SOURCE_FILES_KEY in scanned.metadata or REFUSALS_KEY in scanned.metadata
