"""``epctx refit CTX --weights SOURCE -o OUT [-p EP[:k=v,...]] [--weightless 0|1|2] [--embed] [--force]``: a
context for SOURCE (same graph and shapes as the model CTX was compiled from, other weights: a fine-tune) made
from CTX's compiled code, without compiling (EPs whose code does not hold its weights: IREE).

The EPs and their options default to those CTX records (``ep_compatibility_info.<EP>``); the weightless mode to
CTX's ``weightless_mode`` (then OUT's weights are mapped from SOURCE's external data). A node, shape or type that
differs, or a tensor compiled into the code with other values, is refused naming it."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from epctx.cli.outputs import check_outputs, file_sizes, written_files
from epctx.cli.provider_args import add_provider_arguments, providers_from_args

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "refit",
        help="a context for a model with other weights, from an existing context's code (no compile)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("context", help="the context model whose code is reused")
    p.add_argument("--weights", required=True, metavar="SOURCE", help="the model with the new weights")
    p.add_argument("-o", "--output", required=True, help="the context model to write")
    add_provider_arguments(p)
    p.add_argument("--weightless", choices=["0", "1", "2"], help="ep.enable_weightless_mode (default: CTX's)")
    p.add_argument("--embed", action="store_true", help="embed binaries in the model (embed mode 1)")
    p.add_argument("--force", action="store_true", help="overwrite an existing output")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=refit)


def _recorded(context: Path) -> dict[str, str]:
    import onnx

    return {p.key: p.value for p in onnx.load(context, load_external_data=False).metadata_props}


def _providers(args: argparse.Namespace, metadata: dict[str, str]) -> list[tuple[str, dict[str, str]]]:
    from epctx.providers.registry import create_provider

    given = providers_from_args(args)
    if given:
        return [(name, dict(opts)) for name, opts in given]
    prefix = "ep_compatibility_info."
    found = []
    for key, info in sorted(metadata.items()):
        if key.startswith(prefix):
            name = key[len(prefix) :]
            found.append((name, type(create_provider(name)).options_from_compatibility_info(info)))
    return found


def refit(args: argparse.Namespace) -> int:
    import epctx
    from epctx.errors import NoSuchFile

    context, source, output = Path(args.context), Path(args.weights), Path(args.output)
    for path in (context, source):
        if not path.is_file():
            raise NoSuchFile(f"{str(path)!r} not found")
    check_outputs([output], force=args.force)
    metadata = _recorded(context)
    so = epctx.SessionOptions()
    so.add_session_config_entry("epctx.refit_context", str(context))
    so.add_session_config_entry(
        "ep.enable_weightless_mode", args.weightless or metadata.get("weightless_mode", "0")
    )
    for name, opts in _providers(args, metadata):
        so.add_provider(name, opts)
    start = time.perf_counter()
    compiler = epctx.ModelCompiler(so, str(source), embed_compiled_data_into_model=args.embed)
    compiler.compile_to_file(str(output))
    seconds = time.perf_counter() - start
    files = written_files(output)
    if args.json:
        print(json.dumps({"output": str(output), "seconds": seconds, "files": file_sizes(files)}))
    else:
        print(f"refit {source} from {context} -> {output} in {seconds:.2f} s (nothing compiled)")
    return 0
