"""What IREE compiles for: target presets, the host CPU (triple and features from ``/proc/cpuinfo``), and the
``hardware_architecture`` string a binary records.

A target is an LLVM triple, an LLVM CPU name and the CPU features the code may use. The features recorded are
those that matter for the code IREE emits (the SIMD / bit-manipulation extensions in :data:`X86_FEATURES` and
the Arm / RISC-V ISA extensions), spelled as LLVM spells them; loading refuses a binary for another triple or
one that needs a feature this CPU lacks (IREE itself does not check: it would crash on an illegal
instruction).

| ``target`` | triple | CPU | features recorded |
|---|---|---|---|
| ``host`` | this machine's | ``host`` | every known feature of this CPU |
| ``x86-64`` / ``-v2`` / ``-v3`` / ``-v4`` | ``x86_64-unknown-linux-gnu`` | the level | the level's features |
| ``aarch64`` | ``aarch64-unknown-linux-gnu`` | ``generic`` | ``neon`` |
| ``riscv64`` | ``riscv64-unknown-linux-gnu`` | ``generic-rv64`` | ``m,a,f,d,c`` |
"""

from __future__ import annotations

import dataclasses
import functools
import platform
from collections.abc import Mapping

from epctx.errors import InvalidArgument, InvalidGraph

__all__ = [
    "PRESETS",
    "X86_FEATURES",
    "Target",
    "host_features",
    "host_target",
    "host_triple",
    "missing_features",
    "parse_hardware",
    "resolve_target",
]

# /proc/cpuinfo flag -> LLVM feature name, for the x86 features that change generated code.
X86_FEATURES: Mapping[str, str] = {
    "sse": "sse", "sse2": "sse2", "pni": "sse3", "ssse3": "ssse3", "sse4_1": "sse4.1", "sse4_2": "sse4.2",
    "sse4a": "sse4a", "popcnt": "popcnt", "cx16": "cx16", "lahf_lm": "sahf", "avx": "avx", "avx2": "avx2",
    "fma": "fma", "f16c": "f16c", "bmi1": "bmi", "bmi2": "bmi2", "abm": "lzcnt", "movbe": "movbe",
    "xsave": "xsave", "avx512f": "avx512f", "avx512cd": "avx512cd", "avx512dq": "avx512dq",
    "avx512bw": "avx512bw", "avx512vl": "avx512vl", "avx512ifma": "avx512ifma", "avx512vbmi": "avx512vbmi",
    "avx512_vbmi2": "avx512vbmi2", "avx512_vnni": "avx512vnni", "avx512_bitalg": "avx512bitalg",
    "avx512_vpopcntdq": "avx512vpopcntdq", "avx512_bf16": "avx512bf16", "avx512_fp16": "avx512fp16",
    "avx_vnni": "avxvnni", "gfni": "gfni", "vaes": "vaes", "vpclmulqdq": "vpclmulqdq", "amx_tile": "amx-tile",
    "amx_int8": "amx-int8", "amx_bf16": "amx-bf16", "amx_fp16": "amx-fp16",
}  # fmt: skip
# /proc/cpuinfo "Features" of aarch64 -> LLVM feature name.
ARM_FEATURES: Mapping[str, str] = {
    "asimd": "neon", "fphp": "fullfp16", "asimddp": "dotprod", "i8mm": "i8mm", "bf16": "bf16", "sve": "sve",
    "sve2": "sve2", "sme": "sme",
}  # fmt: skip

_V1 = ("sse", "sse2")
_V2 = (*_V1, "sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "cx16", "sahf")
_V3 = (*_V2, "avx", "avx2", "fma", "f16c", "bmi", "bmi2", "lzcnt", "movbe", "xsave")
_V4 = (*_V3, "avx512f", "avx512cd", "avx512dq", "avx512bw", "avx512vl")
_X86 = "x86_64-unknown-linux-gnu"


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    """A compilation target: ``cpu`` and ``features`` as LLVM names; ``flags`` passes ``features`` to LLVM
    (empty when the CPU name implies them)."""

    name: str
    triple: str
    cpu: str
    features: frozenset[str]
    flags: str = ""

    def hardware(self) -> str:
        """The ``hardware_architecture`` string: ``<triple>;<feature>,<feature>,...`` (sorted)."""
        return f"{self.triple};{','.join(sorted(self.features))}"

    def compile_flags(self) -> list[str]:
        flags = [
            "--iree-hal-target-device=local",
            "--iree-hal-local-target-device-backends=llvm-cpu",
            f"--iree-llvmcpu-target-triple={self.triple}",
            f"--iree-llvmcpu-target-cpu={self.cpu}",
        ]
        if self.flags:
            flags.append(f"--iree-llvmcpu-target-cpu-features={self.flags}")
        return flags


PRESETS: Mapping[str, Target] = {
    "x86-64": Target("x86-64", _X86, "x86-64", frozenset(_V1)),
    "x86-64-v2": Target("x86-64-v2", _X86, "x86-64-v2", frozenset(_V2)),
    "x86-64-v3": Target("x86-64-v3", _X86, "x86-64-v3", frozenset(_V3)),
    "x86-64-v4": Target("x86-64-v4", _X86, "x86-64-v4", frozenset(_V4)),
    "aarch64": Target("aarch64", "aarch64-unknown-linux-gnu", "generic", frozenset({"neon"}), "+neon"),
    "riscv64": Target(
        "riscv64", "riscv64-unknown-linux-gnu", "generic-rv64", frozenset("madfc"), "+m,+a,+f,+d,+c"
    ),
}


def host_triple() -> str:
    machine = platform.machine().lower()
    arch = {"amd64": "x86_64", "x86_64": "x86_64", "arm64": "aarch64", "aarch64": "aarch64"}.get(
        machine, machine
    )
    system = platform.system().lower()
    return f"{arch}-unknown-linux-gnu" if system == "linux" else f"{arch}-unknown-{system}"


def features_from_cpuinfo(text: str) -> frozenset[str]:
    """The known features in the ``flags`` (x86) or ``Features`` (Arm) line of ``/proc/cpuinfo`` text."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip().lower()
        if sep and key in ("flags", "features"):
            table = X86_FEATURES if key == "flags" else ARM_FEATURES
            return frozenset(table[f] for f in value.split() if f in table)
    return frozenset()


# aarch64 Linux: the kernel's HWCAP / HWCAP2 bits (asm/hwcap.h) -> the /proc/cpuinfo names ARM_FEATURES maps.
_AT_HWCAP, _AT_HWCAP2 = 16, 26
_ARM_HWCAP = {1 << 1: "asimd", 1 << 9: "fphp", 1 << 20: "asimddp", 1 << 22: "sve"}
_ARM_HWCAP2 = {1 << 1: "sve2", 1 << 13: "i8mm", 1 << 14: "bf16", 1 << 23: "sme"}


def features_from_hwcap(hwcap: int, hwcap2: int) -> frozenset[str]:
    """The known aarch64 features in the auxiliary vector's HWCAP words (LLVM names)."""
    names = [n for bit, n in _ARM_HWCAP.items() if hwcap & bit]
    names += [n for bit, n in _ARM_HWCAP2.items() if hwcap2 & bit]
    return frozenset(ARM_FEATURES[n] for n in names)


def _aarch64_hwcap() -> frozenset[str] | None:
    """aarch64 features from ``getauxval``: what the kernel (or qemu-user, whose ``/proc/cpuinfo`` is the
    host's) says this process may use. None where it cannot be read."""
    import ctypes

    try:
        getauxval = ctypes.CDLL(None).getauxval
    except (OSError, AttributeError):
        return None
    getauxval.restype = ctypes.c_ulong
    getauxval.argtypes = [ctypes.c_ulong]
    return features_from_hwcap(int(getauxval(_AT_HWCAP)), int(getauxval(_AT_HWCAP2)))


@functools.cache
def host_features() -> frozenset[str]:
    """This CPU's features (LLVM names): on aarch64 from the auxiliary vector, else from ``/proc/cpuinfo``;
    empty where neither can be read."""
    if host_triple().startswith("aarch64"):
        found = _aarch64_hwcap()
        if found is not None:
            return found
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            return features_from_cpuinfo(fh.read())
    except OSError:
        return frozenset()


def host_target() -> Target:
    return Target("host", host_triple(), "host", host_features())


def _raw_features(text: str) -> frozenset[str]:
    features = set()
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if item[0] not in "+-" or len(item) < 2:
            raise InvalidArgument(
                f"IREEExecutionProvider option 'target_cpu_features': expected '+feature' or '-feature' "
                f"items separated by commas, got {item!r}"
            )
        if item[0] == "+":
            features.add(item[1:])
    return frozenset(features)


def resolve_target(preset: str, triple: str | None, cpu_features: str | None) -> Target:
    """The target of the options: a preset (``host`` by default), or a raw triple / feature list on top."""
    if preset == "host":
        base = host_target()
    elif preset in PRESETS:
        base = PRESETS[preset]
    else:
        raise InvalidArgument(
            f"IREEExecutionProvider option 'target': expected one of {['host', *PRESETS]}, got {preset!r}"
        )
    if triple is None and cpu_features is None:
        return base
    triple = triple or base.triple
    cpu = base.cpu if triple == base.triple else "generic"
    if cpu_features is None:
        return Target("custom", triple, cpu, base.features if triple == base.triple else frozenset())
    extra = _raw_features(cpu_features)
    inherited = base.features if triple == base.triple else frozenset()
    raw = [f.strip() for f in cpu_features.split(",") if f.strip()]
    if cpu == "host":  # a feature string replaces the host's own features in IREE: list them all again
        raw = [
            *(f"+{f}" for f in sorted(inherited)),
            *(["+64bit"] if triple.startswith("x86_64") else []),
            *raw,
        ]
    return Target("custom", triple, cpu, inherited | extra, ",".join(raw))


def parse_hardware(hardware: str, where: str) -> tuple[str, frozenset[str]]:
    """(triple, features) of a ``hardware_architecture`` string written by :meth:`Target.hardware`."""
    triple, sep, features = hardware.partition(";")
    if not sep or not triple:
        raise InvalidGraph(f"{where}: hardware_architecture {hardware!r} is not '<triple>;<features>'")
    return triple, frozenset(f for f in features.split(",") if f)


def missing_features(hardware: str, where: str) -> str | None:
    """Why code for ``hardware`` cannot run on this CPU (another triple, features it lacks), or None."""
    triple, features = parse_hardware(hardware, where)
    if triple != host_triple():
        return f"compiled for {triple!r}, this machine is {host_triple()!r}"
    lacking = sorted(features - host_features())
    if lacking:
        return f"compiled for CPU features this CPU lacks: {', '.join(lacking)} (target {hardware!r})"
    return None
