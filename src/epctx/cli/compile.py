"""``epctx compile MODEL [-p EP[:k=v,...] [--option k=v]...]... [--dim NAME=N]... [--shape NAME[d0,...]]...
[-o OUT] [--embed] [--prefix P] [--force]``: write a context model.

``--dim NAME=N`` compiles for a stated size of a dynamic dimension (onnxruntime's free dimension override by
name; ``INPUT:AXIS=N`` for a dimension without a name): a compiler then sees static shapes (IREE takes a model
with dynamic dimensions whole only where it can; the log names the ``--dim`` or ``--shape`` that would help).
``--shape NAME[d0,d1,...]`` states an input's whole shape (session config ``epctx.input_shapes``, as
onnxruntime's OpenVINO EP's ``reshape_input``), anonymous dimensions included (Paddle's ``?``, ``-1``). The
context model's inputs carry the stated sizes, so a warm load states nothing.

The output (default ``<stem>_ctx.onnx`` beside MODEL) is checked before compiling: its folder must exist (it is
not created) and an existing output is replaced only with ``--force``. Without ``-p`` the compiling EP is the one
the MAX_PERFORMANCE selection policy picks among the EPs found here (never the Example EP, a template); the
command says which, and fails when no compiling EP is available."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from epctx.cli.outputs import check_outputs, file_sizes, written_files
from epctx.cli.placement import placement_lines
from epctx.cli.progress import progress_lines
from epctx.cli.provider_args import add_provider_arguments, providers_from_args

__all__ = ["add_parser", "parse_provider"]

_POLICY = "MAX_PERFORMANCE"


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "compile",
        help="compile a model into a context model (<stem>_ctx.onnx + .bin)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model")
    add_provider_arguments(p)
    p.add_argument("-o", "--output", help="output model path (default: <stem>_ctx.onnx beside MODEL)")
    p.add_argument(
        "--dim",
        action="append",
        default=[],
        metavar="NAME=N",
        help="compile for this size of a dynamic dimension (repeatable): NAME=N or INPUT:AXIS=N",
    )
    p.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME[d0,d1,...]",
        help="compile for this whole shape of an input (repeatable), anonymous dimensions included",
    )
    p.add_argument("--embed", action="store_true", help="embed binaries in the model (embed mode 1)")
    p.add_argument("--prefix", default="", help="ep.context_node_name_prefix (for merging)")
    p.add_argument("--force", action="store_true", help="overwrite an existing output")
    p.add_argument(
        "--sign", metavar="KEY", help="sign the output's folder with this EC private key (epctx sign)"
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    p.add_argument("--json", action="store_true", help="machine-readable output (implies --quiet)")
    p.set_defaults(func=compile_model)


def parse_provider(spec: str) -> tuple[str, dict[str, str]]:
    """``Name`` or ``Name:key=value,key=value`` (a value with commas quoted); the library's one parser."""
    from epctx.providers.selection import parse_provider_spec

    return parse_provider_spec(spec)


def dimension_sizes(items: list[str]) -> dict[str, int]:
    """``--dim NAME=N`` arguments as sizes; a malformed, repeated or negative one is a usage error."""
    from epctx.cli.failures import UsageError

    sizes: dict[str, int] = {}
    for item in items:
        name, _, text = item.partition("=")
        if not name or not text.isdigit():
            raise UsageError(f"--dim expects NAME=N (N an integer >= 0), got {item!r}", "epctx compile")
        if name in sizes:
            raise UsageError(f"--dim gives {name!r} twice", "epctx compile")
        sizes[name] = int(text)
    return sizes


def check_dimension_names(source: Path, sizes: dict[str, int]) -> None:
    """A ``--dim`` that names no dynamic dimension of the model's inputs is a usage error listing those there are
    (onnxruntime ignores such an override silently; a typo would compile for dynamic shapes)."""
    import onnx

    from epctx.cli.failures import UsageError

    try:
        graph = onnx.load(str(source), load_external_data=False).graph
    except Exception:  # the compile itself reports an unreadable model, with its own message
        return
    keys: list[str] = []  # accepted: a dynamic dimension's name, or INPUT:AXIS for any dynamic dimension
    shown: list[str] = []  # listed: the name where it is one, else INPUT:AXIS
    for value in graph.input:
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value >= 0:
                continue
            keys.append(f"{value.name}:{axis}")
            named = dim.dim_param and dim.dim_param != "?"
            keys += [dim.dim_param] if named else []
            shown.append(dim.dim_param if named else f"{value.name}:{axis}")
    unknown = [name for name in sizes if name not in keys]
    if unknown:
        there = ", ".join(dict.fromkeys(shown)) or "none"
        raise UsageError(
            f"--dim {', '.join(unknown)}: no dynamic dimension of the model's inputs has that name; they are: "
            f"{there}",
            "epctx compile",
        )


def input_shapes(source: Path, items: list[str], sizes: dict[str, int]) -> str:
    """``--shape NAME[d0,...]`` arguments as the ``epctx.input_shapes`` value, checked against the model's inputs
    and the ``--dim`` sizes: malformed text, an input the model lacks, a wrong rank, a size other than a fixed
    dimension's or than a ``--dim`` of the same dimension is a usage error."""
    import onnx

    from epctx.cli.failures import UsageError
    from epctx.config import parse_shapes
    from epctx.errors import InvalidArgument
    from epctx.model.dims import state_input_shapes

    try:
        shapes = parse_shapes(",".join(items), "--shape")
        graph = onnx.load(str(source), load_external_data=False).graph
    except InvalidArgument as exc:
        raise UsageError(str(exc.args[0]), "epctx compile") from exc
    except Exception:  # the compile itself reports an unreadable model, with its own message
        return ",".join(items)
    try:
        state_input_shapes(graph, shapes, sizes, {}, what="--shape")
    except InvalidArgument as exc:
        raise UsageError(
            str(exc.args[0]).replace("free dimension override", "--dim"), "epctx compile"
        ) from exc
    return ",".join(f"{name}[{','.join(map(str, dims))}]" for name, dims in shapes)


def default_compiling_providers() -> list[str]:
    """The compiling EPs the selection policy picks here (the CPU EP is appended by the session)."""
    import epctx
    from epctx.errors import Fail
    from epctx.providers.selection import resolve_providers

    so = epctx.SessionOptions()
    so.set_provider_selection_policy(getattr(epctx.OrtExecutionProviderDevicePolicy, _POLICY))
    names = [ep.name for ep in resolve_providers(None, None, so) if ep.compiles]
    if not names:
        found = ", ".join(epctx.get_available_providers())
        raise Fail(
            f"no compiling EP is available here for the {_POLICY} policy (found: {found}); name one with -p "
            "(e.g. -p ExampleExecutionProvider) or install one (pip install 'epctx[openvino]')"
        )
    return names


def _check_outputs(source: Path, output: Path, providers: list[str], args: argparse.Namespace) -> None:
    """Before compiling: no output is an input (``--force`` or not), and each can be written."""
    from epctx.epcontext.paths import binary_file_name, check_not_inputs, model_name_for

    binaries = [] if args.embed else [binary_file_name(model_name_for(output), name) for name in providers]
    check_not_inputs([source], [output, *(output.parent / name for name in binaries)])
    check_outputs([output], force=args.force)


def compile_model(args: argparse.Namespace) -> int:
    import epctx
    from epctx.epcontext.paths import context_model_path

    source = Path(args.model)
    output = Path(args.output) if args.output else context_model_path(source)
    so = epctx.SessionOptions()
    if args.prefix:
        so.add_session_config_entry("ep.context_node_name_prefix", args.prefix)
    if args.sign:
        so.add_session_config_entry("epctx.trust.sign_key", args.sign)
    sizes = dimension_sizes(args.dim)
    if sizes:
        check_dimension_names(source, sizes)
    for name, size in sizes.items():
        so.add_free_dimension_override_by_name(name, size)
    if args.shape:
        so.add_session_config_entry("epctx.input_shapes", input_shapes(source, args.shape, sizes))
    providers = providers_from_args(args)
    talk = not (args.quiet or args.json)
    if not providers:
        providers = [(name, {}) for name in default_compiling_providers()]
        if talk:
            picked = ", ".join(name for name, _ in providers)
            print(
                f"epctx: compiling EP {picked} (picked by the {_POLICY} policy; -p names another)",
                file=sys.stderr,
            )
    _check_outputs(source, output, [name for name, _ in providers], args)
    for name, options in providers:
        so.add_provider(name, options)
    flags = epctx.CompileFlags.NONE if args.force else epctx.CompileFlags.ERROR_IF_OUTPUT_FILE_EXISTS
    started = time.perf_counter()
    compiler = epctx.ModelCompiler(so, str(source), embed_compiled_data_into_model=args.embed, flags=flags)
    with progress_lines(talk):
        compiler.compile_to_file(str(output))
    seconds = time.perf_counter() - started
    from epctx.partition.placement import placement_summary

    placement = placement_summary(compiler.get_node_placement())
    files = written_files(output)
    if args.json:
        report = {
            "output": str(output),
            "providers": [name for name, _ in providers],
            "seconds": seconds,
            "files": file_sizes(files),
            "placement": placement,
        }
        print(json.dumps(report, indent=2))
        return 0
    print(f"wrote {output} in {seconds:.2f} s")
    for path in files:
        print(f"  {path.name}  {path.stat().st_size} bytes")
    print("\n".join(placement_lines(placement)))
    return 0
