"""An LLM prefill / decode pair over one set of weights: a small random-init Llama, exported with torch.

    python benchmarks/llm_pair.py OUT_DIR [--size tiny|bench] [--seed 0]

writes ``OUT_DIR/prefill.onnx`` and ``OUT_DIR/decode.onnx``. Nothing is downloaded: the model is this file's
own Llama (RMSNorm, rotary position embeddings, grouped-query attention with a KV cache, SwiGLU MLP, untied
LM head), its weights drawn from a seeded generator, exported with torch's TorchScript exporter (opset 17).

- ``prefill``: ``input_ids`` / ``position_ids`` int64 ``[1, sequence]`` -> ``logits`` ``[1, sequence, vocab]``
  and ``present.<i>.key`` / ``present.<i>.value`` ``[1, kv_heads, sequence, head_dim]`` per layer (causal
  attention over the prompt);
- ``decode``: one token (``[1, 1]``) and ``past_key_values.<i>.key`` / ``.value`` ``[1, kv_heads, past, head_dim]``
  -> ``logits`` ``[1, 1, vocab]`` and the presents, one longer.

Both hold the same weights (same values; torch may name a transposed copy differently in each): compiled
together with ``ep.share_ep_contexts`` they share one weights file. Needs torch (``pip install torch==2.13.0``,
or ``make install``, which installs it).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["SIZES", "LlamaConfig", "decode_feeds", "export_pair", "prefill_feeds"]


@dataclass(frozen=True)
class LlamaConfig:
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    rope_theta: float = 10000.0
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def weight_bytes(self) -> int:
        h, kv = self.hidden, self.kv_heads * self.head_dim
        layer = 2 * h * h + 2 * h * kv + 3 * h * self.intermediate + 2 * h
        return 4 * (2 * self.vocab * h + self.layers * layer + h)


SIZES = {
    # for tests: compiles in seconds
    "tiny": LlamaConfig(vocab=256, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=160),
    # the benchmark's pair: about 128 MB of float32 weights
    "bench": LlamaConfig(vocab=8192, hidden=512, layers=8, heads=8, kv_heads=4, intermediate=1376),
}


def _modules(config: LlamaConfig, seed: int, tune: float = 0.0, tune_norms: bool = False) -> tuple[Any, Any]:
    import torch
    from torch import nn

    class RMSNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(config.hidden))

        def forward(self, x: Any) -> Any:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + config.eps) * self.weight

    def rotate(x: Any, cos: Any, sin: Any) -> Any:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            h, d = config.hidden, config.head_dim
            self.q_proj = nn.Linear(h, config.heads * d, bias=False)
            self.k_proj = nn.Linear(h, config.kv_heads * d, bias=False)
            self.v_proj = nn.Linear(h, config.kv_heads * d, bias=False)
            self.o_proj = nn.Linear(config.heads * d, h, bias=False)

        def forward(self, x: Any, cos: Any, sin: Any, past: tuple[Any, Any] | None) -> Any:
            b, s, _ = x.shape
            d, groups = config.head_dim, config.heads // config.kv_heads
            q = self.q_proj(x).view(b, s, config.heads, d).transpose(1, 2)
            k = self.k_proj(x).view(b, s, config.kv_heads, d).transpose(1, 2)
            v = self.v_proj(x).view(b, s, config.kv_heads, d).transpose(1, 2)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            if past is not None:
                k, v = torch.cat((past[0], k), dim=2), torch.cat((past[1], v), dim=2)
            t = k.shape[2]
            keys = k[:, :, None].expand(b, config.kv_heads, groups, t, d).reshape(b, config.heads, t, d)
            values = v[:, :, None].expand(b, config.kv_heads, groups, t, d).reshape(b, config.heads, t, d)
            scores = q @ keys.transpose(2, 3) * (d**-0.5)
            if past is None:  # prefill: causal over the prompt
                causal = torch.ones(s, s, dtype=torch.bool).triu(1)
                scores = scores.masked_fill(causal, float("-inf"))
            out = torch.softmax(scores, dim=-1) @ values
            return self.o_proj(out.transpose(1, 2).reshape(b, s, config.hidden)), k, v

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            h, m = config.hidden, config.intermediate
            self.input_norm, self.attn, self.post_norm = RMSNorm(), Attention(), RMSNorm()
            self.gate_proj, self.up_proj = nn.Linear(h, m, bias=False), nn.Linear(h, m, bias=False)
            self.down_proj = nn.Linear(m, h, bias=False)

        def forward(self, x: Any, cos: Any, sin: Any, past: tuple[Any, Any] | None) -> Any:
            a, k, v = self.attn(self.input_norm(x), cos, sin, past)
            x = x + a
            y = self.post_norm(x)
            x = x + self.down_proj(nn.functional.silu(self.gate_proj(y)) * self.up_proj(y))
            return x, k, v

    class Llama(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(config.vocab, config.hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(config.layers))
            self.norm = RMSNorm()
            self.lm_head = nn.Linear(config.hidden, config.vocab, bias=False)
            inv_freq = 1.0 / config.rope_theta ** (
                torch.arange(0, config.head_dim, 2).float() / config.head_dim
            )
            self.register_buffer("inv_freq", inv_freq, persistent=False)

        def run(self, input_ids: Any, position_ids: Any, past: list[Any] | None) -> tuple[Any, ...]:
            freqs = position_ids[:, None, :, None].float() * self.inv_freq
            angles = torch.cat((freqs, freqs), dim=-1)
            cos, sin = angles.cos(), angles.sin()
            x = self.embed(input_ids)
            presents = []
            for i, block in enumerate(self.blocks):
                x, k, v = block(x, cos, sin, None if past is None else (past[2 * i], past[2 * i + 1]))
                presents += [k, v]
            return (self.lm_head(self.norm(x)), *presents)

    class Prefill(nn.Module):
        def __init__(self, llama: Llama) -> None:
            super().__init__()
            self.llama = llama

        def forward(self, input_ids: Any, position_ids: Any) -> Any:
            return self.llama.run(input_ids, position_ids, None)

    class Decode(Prefill):
        def forward(self, input_ids: Any, position_ids: Any, *past: Any) -> Any:
            return self.llama.run(input_ids, position_ids, list(past))

    torch.manual_seed(seed)
    llama = Llama()
    with torch.no_grad():  # random init, scaled so activations stay in range through the layers
        for name, p in llama.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.02 if "embed" in name else config.hidden**-0.5)
        # A fine-tune stand-in: every matrix moved (as a merged LoRA moves them), the norms with tune_norms.
        tuner = torch.Generator().manual_seed(seed + 1)
        for p in llama.parameters():
            if tune and (p.dim() >= 2 or tune_norms):
                spread = float(p.std() if p.dim() >= 2 else p.abs().mean())  # the norms start at ones
                p.add_(torch.randn(p.shape, generator=tuner) * tune * spread)
    llama.eval()
    return Prefill(llama), Decode(llama)


def _names(config: LlamaConfig, prefix: str) -> list[str]:
    return [f"{prefix}.{i}.{kv}" for i in range(config.layers) for kv in ("key", "value")]


def export_pair(
    out_dir: str | os.PathLike[str],
    size: str = "tiny",
    *,
    seed: int = 0,
    tune: float = 0.0,
    tune_norms: bool = False,
) -> tuple[Path, Path]:
    """Write ``prefill.onnx`` and ``decode.onnx`` of the ``size`` Llama (weights drawn with ``seed``; ``tune``:
    then each matrix moved by ``tune`` times its spread of noise, the norms too with ``tune_norms``: the same
    graph with a fine-tune's weights)."""
    import torch

    config = SIZES[size]
    prefill, decode = _modules(config, seed, tune, tune_norms)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    presents = _names(config, "present")
    pasts = _names(config, "past_key_values")
    ids = torch.zeros(1, 4, dtype=torch.int64)
    positions = torch.arange(4)[None]
    past = [torch.zeros(1, config.kv_heads, 4, config.head_dim) for _ in pasts]
    tokens = {"input_ids": {1: "sequence"}, "position_ids": {1: "sequence"}}
    jobs = [
        ("prefill", prefill, (ids, positions), ["input_ids", "position_ids"], tokens
         | {p: {2: "sequence"} for p in presents}),
        ("decode", decode, (ids[:, :1], positions[:, :1], *past), ["input_ids", "position_ids", *pasts],
         {p: {2: "past"} for p in pasts} | {p: {2: "total"} for p in presents}),
    ]  # fmt: skip
    paths = []
    for name, module, args, inputs, axes in jobs:
        buffer = io.BytesIO()
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
            torch.onnx.export(
                module, args, buffer, dynamo=False, opset_version=17, input_names=inputs,
                output_names=["logits", *presents], dynamic_axes=axes,
            )  # fmt: skip
        path = out / f"{name}.onnx"
        path.write_bytes(buffer.getvalue())
        paths.append(path)
    return paths[0], paths[1]


def prefill_feeds(config: LlamaConfig, prompt: int, *, seed: int = 1) -> dict[str, np.ndarray]:
    """A prefill feed of ``prompt`` random tokens."""
    rng = np.random.default_rng(seed)
    return {
        "input_ids": rng.integers(0, config.vocab, (1, prompt), dtype=np.int64),
        "position_ids": np.arange(prompt, dtype=np.int64)[None],
    }


def decode_feeds(config: LlamaConfig, prefill_outputs: list[np.ndarray], token: int) -> dict[str, np.ndarray]:
    """The decode feed after a prefill: ``token`` at the next position, the prefill's presents as the past."""
    past = prefill_outputs[1:]
    length = past[0].shape[2]
    feed = {"input_ids": np.array([[token]], np.int64), "position_ids": np.array([[length]], np.int64)}
    feed.update(zip(_names(config, "past_key_values"), past))
    return feed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out_dir")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for path in export_pair(args.out_dir, args.size, seed=args.seed):
        print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
