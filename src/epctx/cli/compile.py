"""``epctx compile MODEL [-p EP[:k=v,...] [--option k=v]...]... [-o OUT] [--embed] [--prefix P]``: write a context model."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from epctx.cli.provider_args import add_provider_arguments, providers_from_args

__all__ = ["add_parser", "parse_provider"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("compile", help="compile a model into a context model (<stem>_ctx.onnx + .bin)")
    p.add_argument("model")
    add_provider_arguments(p)
    p.add_argument("-o", "--output", help="output model path (default: <stem>_ctx.onnx beside MODEL)")
    p.add_argument("--embed", action="store_true", help="embed binaries in the model (embed mode 1)")
    p.add_argument("--prefix", default="", help="ep.context_node_name_prefix (for merging)")
    p.add_argument("--force", action="store_true", help="overwrite an existing output")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    p.add_argument("--json", action="store_true", help="machine-readable output (implies --quiet)")
    p.set_defaults(func=compile_model)


def parse_provider(spec: str) -> tuple[str, dict[str, str]]:
    """``Name`` or ``Name:key=value,key=value`` (a value with commas quoted); the library's one parser."""
    from epctx.providers.selection import parse_provider_spec

    return parse_provider_spec(spec)


def compile_model(args: argparse.Namespace) -> int:
    import epctx
    from epctx.epcontext.paths import context_model_path

    if not (args.quiet or args.json):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("epctx: %(message)s"))
        log = logging.getLogger("epctx")
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    so = epctx.SessionOptions()
    if args.prefix:
        so.add_session_config_entry("ep.context_node_name_prefix", args.prefix)
    providers = providers_from_args(args) or [("ExampleExecutionProvider", {})]
    for name, options in providers:
        so.add_provider(name, options)
    source = Path(args.model)
    output = Path(args.output) if args.output else context_model_path(source, {})
    flags = epctx.CompileFlags.NONE if args.force else epctx.CompileFlags.ERROR_IF_OUTPUT_FILE_EXISTS
    started = time.perf_counter()
    epctx.ModelCompiler(
        so, str(source), embed_compiled_data_into_model=args.embed, flags=flags
    ).compile_to_file(str(output))
    seconds = time.perf_counter() - started
    files = [output, *_binaries_of(output)]
    if args.json:
        report = {
            "output": str(output),
            "seconds": seconds,
            "files": {str(p): p.stat().st_size for p in files},
        }
        print(json.dumps(report, indent=2))
        return 0
    print(f"wrote {output} in {seconds:.2f} s")
    for path in files:
        print(f"  {path.name}  {path.stat().st_size} bytes")
    return 0


def _binaries_of(model_path: Path) -> list[Path]:
    """The files a context model refers to (binaries of embed_mode=0 EPContext nodes, external initializers)."""
    import onnx

    from epctx.epcontext.transaction import model_references

    model = onnx.load(model_path, load_external_data=False)
    return sorted(model_path.parent / name for name in model_references(model))
