"""``epctx share -p EP[:k=v,...] MODEL MODEL...``: context models that share one binary (weight sharing).

Like onnxruntime's ep_weight_sharing_ctx_gen: forces ep.context_enable=1, embed mode 0,
ep.share_ep_contexts=1, and ep.stop_share_ep_contexts=1 on the last model. N models -> N+1 files.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from epctx.cli.provider_args import add_provider_arguments, providers_from_args

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("share", help="compile several models into context models sharing one binary")
    p.add_argument("models", nargs="+")
    add_provider_arguments(p, required=True)
    p.set_defaults(func=share)


def share(args: argparse.Namespace) -> int:
    import epctx
    from epctx.epcontext.paths import context_model_path

    providers = providers_from_args(args)
    name = providers[0][0]  # the shared binary is named after the first EP
    written = []
    for k, model in enumerate(args.models):
        so = epctx.SessionOptions()
        so.add_session_config_entry("ep.context_enable", "1")
        so.add_session_config_entry("ep.context_embed_mode", "0")
        so.add_session_config_entry("ep.share_ep_contexts", "1")
        if k == len(args.models) - 1:
            so.add_session_config_entry("ep.stop_share_ep_contexts", "1")
        epctx.InferenceSession(model, so, providers=providers)
        path = Path(model)
        written.append(context_model_path(path, {}))
    first = Path(args.models[0])
    shared = first.with_name(f"{first.stem}_{name}.bin")
    for path in [*written, shared]:
        print(f"  {path}  {path.stat().st_size} bytes")
    return 0
