"""``epctx share (-p EP[:k=v,...] | -e EP [-i "k|v ..."]) [-C "k|v ..."] [-o DIR] [--force] [-q] [--json]
MODEL[,MODEL...]...``: context models that share one binary (weight sharing).

Like onnxruntime's ep_weight_sharing_ctx_gen: embed mode 0, ep.share_ep_contexts=1 and
ep.stop_share_ep_contexts=1 on the last model; N models -> N+1 files: ``<stem>_ctx.onnx`` for each model (beside
it, or in ``-o DIR``, which must exist) and ``<first stem>_<EP>.bin`` beside the first. Outputs that exist are
refused before anything is compiled unless ``--force``; an output that is an input (a model, or a file one
reads) is refused even then. Progress (model by model, partition by partition) goes to stderr unless ``-q``.

"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from epctx.cli import share_ort_args as ort
from epctx.cli.failures import UsageError
from epctx.cli.outputs import check_folder, check_outputs, file_sizes, written_files
from epctx.cli.progress import progress_lines
from epctx.cli.provider_args import add_provider_arguments, providers_from_args

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "share",
        help="compile several models into context models sharing one binary",
        description=(__doc__ or "") + (ort.__doc__ or ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("models", nargs="+", metavar="MODEL[,MODEL...]")
    add_provider_arguments(p)
    p.add_argument("-e", dest="ort_ep", metavar="EP", help="the EP, as ep_weight_sharing_ctx_gen's -e")
    p.add_argument("-i", dest="ort_options", action="append", default=[], metavar='"K|V ..."',
                   help="options of the -e EP, as ep_weight_sharing_ctx_gen's -i")  # fmt: skip
    p.add_argument("-C", dest="ort_config", action="append", default=[], metavar='"K|V ..."',
                   help="session config entries, as ep_weight_sharing_ctx_gen's -C")  # fmt: skip
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    p.add_argument("-v", "--verbose", action="store_true", help="progress lines (the default unless -q)")
    p.add_argument(
        "-o", "--output-dir", metavar="DIR", help="write the files in DIR (default: beside the models)"
    )
    p.add_argument("--force", action="store_true", help="overwrite existing outputs")
    p.add_argument("--json", action="store_true", help="machine-readable output (implies --quiet)")
    p.set_defaults(func=share)


def _is_config(spec: str) -> bool:
    """``-p FILE.json``: ep_weight_sharing_ctx_gen's plugin EP config, not an ``EP:k=v`` spec."""
    return spec.lower().endswith(".json") and (":" not in spec or Path(spec).is_file())


def _providers(args: argparse.Namespace, so: Any) -> str:
    """Add the EP the command line names to ``so``; its name (the shared binary is named after it)."""
    configs = [spec for spec, _ in args.provider if _is_config(spec)]
    args.provider = [item for item in args.provider if not _is_config(item[0])]
    if configs:
        if len(configs) > 1 or args.provider:
            raise UsageError(
                "-p FILE.json (a plugin EP config) names the EP alone; give one, without -p EP", ort.PROG
            )
        if args.ort_ep or args.ort_options:
            print(f"{ort.PROG}: -e/-i ignored: -p {configs[0]} takes precedence over them", file=sys.stderr)
        return ort.PluginConfig(configs[0]).add_to(so)
    providers = providers_from_args(args)
    extra = ort.pipe_pairs(args.ort_options, "-i", unique=False)
    if args.ort_ep:
        if providers:
            raise UsageError("-e and -p both name EPs; use one of them", ort.PROG)
        providers = [(ort.ep_from_e(args.ort_ep), extra)]
    elif extra:
        if len(providers) != 1:
            raise UsageError("-i gives the options of the -e EP (or of a single -p EP)", ort.PROG)
        providers[0][1].update(extra)
    if not providers:
        raise UsageError(
            "name the EP: -p EP or -e EP (ep_weight_sharing_ctx_gen's default, qnn, is not in epctx)",
            ort.PROG,
        )
    for name, options in providers:
        so.add_provider(name, options)
    return providers[0][0]


def share(args: argparse.Namespace) -> int:
    import epctx
    from epctx.epcontext.paths import binary_file_name, check_not_inputs, context_model_path, model_name_for
    from epctx.errors import InvalidArgument

    models = ort.model_paths(args.models)
    out_dir = Path(args.output_dir) if args.output_dir else None
    if out_dir is not None:
        check_folder(out_dir, flag="-o/--output-dir")
    outputs = [out_dir / f"{m.stem}_ctx.onnx" if out_dir else context_model_path(m, {}) for m in models]
    clash = next((p for k, p in enumerate(outputs) if p in outputs[:k]), None)
    if clash is not None:
        raise InvalidArgument(f"two models would both write {str(clash)!r}; give models with different names")
    so = epctx.SessionOptions()
    for key, value in ort.session_entries(args.ort_config).items():
        so.add_session_config_entry(key, value)
    so.add_session_config_entry("ep.share_ep_contexts", "1")
    ep_name = _providers(args, so)
    binary = outputs[0].parent / binary_file_name(model_name_for(outputs[0]), ep_name)
    check_not_inputs(models, [*outputs, binary])
    check_outputs([*outputs, binary], force=args.force, flag="-o/--output-dir")
    flags = epctx.CompileFlags.ERROR_IF_NO_NODES_COMPILED
    if not args.force:
        flags |= epctx.CompileFlags.ERROR_IF_OUTPUT_FILE_EXISTS
    started = time.perf_counter()
    talk = not (args.quiet or args.json)
    with progress_lines(talk):
        for k, (model, output) in enumerate(zip(models, outputs)):
            if k == len(models) - 1:
                so.add_session_config_entry("ep.stop_share_ep_contexts", "1")
            if talk:
                print(f"epctx: model {k + 1}/{len(models)}: {model} -> {output}", file=sys.stderr)
            epctx.ModelCompiler(so, str(model), flags=flags).compile_to_file(str(output))
    seconds = time.perf_counter() - started
    files = list(dict.fromkeys(f for output in outputs for f in written_files(output)))
    if args.json:
        report = {
            "ep": ep_name,
            "models": [str(m) for m in models],
            "seconds": seconds,
            "files": file_sizes(files),
        }
        print(json.dumps(report, indent=2))
        return 0
    print(f"{len(models)} model(s) sharing one {ep_name} binary in {seconds:.2f} s:")
    for path in files:
        print(f"  {path}  {path.stat().st_size} bytes")
    return 0
