"""The context fuzzer's byte mutations (``tests.epcontext.context_fuzz``: bit flips, truncation) applied to the
backend's payload inside an epctx context binary (an IREE module, an OpenVINO blob), every checksum and identity
recomputed by epctx's own writer so the bytes reach the backend. Each case loads and runs in a fresh process: a
crash is an exit by signal, a hang a process that does not exit in time.

Regions: ``structure``: an IREE module's archive and FlatBuffer outside the embedded executable's ELF (header,
vtables, tables, strings, bytecode); ``elf``: inside the ELF (native code and its tables: validated by nothing
but a signature, see docs/trust.md); ``blob``: anywhere in an OpenVINO blob; ``truncate``: the payload cut
short."""

from __future__ import annotations

import dataclasses
import shutil
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np

from epctx.epcontext import ContextBinary, ContextBinaryWriter
from tests.epcontext.context_fuzz import _flip
from tests.trust.attacks import _binary_of, rebind_identities

__all__ = ["Case", "elf_range", "load_in_child", "mutate", "rewrite_payload", "run_case"]

_RUNNER = textwrap.dedent(
    """
    import sys
    import numpy as np
    import epctx
    from epctx.errors import EPCtxError
    DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
              "tensor(int32)": np.int32, "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}
    try:
        s = epctx.InferenceSession(sys.argv[1], providers=[sys.argv[3]])
        print("created", flush=True)
        if sys.argv[2] == "run":  # zeros of each input's shape (a symbolic dimension: 1)
            feed = {i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape or []], DTYPES[i.type])
                    for i in s.get_inputs()}
            s.run(None, feed)
    except EPCtxError as exc:
        print(type(exc).__name__, str(exc)[:300])
        sys.exit(3)
    """
)


@dataclasses.dataclass(frozen=True)
class Case:
    seed: int
    region: str
    what: str
    outcome: str  # "runs", "typed", "untyped" (another exception), "crash" (a signal) or "hang"
    detail: str


def elf_range(module: bytes) -> tuple[int, int]:
    """Where the embedded executable's ELF lies in the module: its start and its end (the section headers')."""
    start = module.find(b"\x7fELF")
    assert start >= 0, "no ELF in the module"
    (shoff,) = struct.unpack_from("<Q", module, start + 0x28)
    shentsize, shnum = struct.unpack_from("<HH", module, start + 0x3A)
    return start, start + shoff + shentsize * shnum


def _mutate_bytes(module: bytes, region: str, rng: np.random.Generator) -> tuple[bytes, str]:
    if region == "truncate":
        cut = int(rng.integers(0, len(module)))
        return module[:cut], f"truncated at {cut} of {len(module)}"
    if region == "blob":
        data, offsets = _flip(module, rng)
        return data, f"bit flips at {offsets}"
    lo, hi = elf_range(module)
    if region == "elf":
        part, offsets = _flip(module[lo:hi], rng)
        return module[:lo] + part + module[hi:], f"bit flips in the ELF at {[lo + o for o in offsets]}"
    outside = module[:lo] + module[hi:]  # the FlatBuffer around the ELF
    part, offsets = _flip(outside, rng)
    where = [o if o < lo else o + hi - lo for o in offsets]
    return part[:lo] + module[lo:hi] + part[lo:], f"bit flips in the FlatBuffer at {where}"


def mutate(ctx: Path, region: str, seed: int) -> str:
    """Mutate the payload entry (an IREE module, an OpenVINO blob) of ``ctx``'s binary in ``region`` with the
    fuzzer's seed, checksums and identities recomputed; returns what was done."""
    rng = np.random.default_rng(seed)
    done: list[str] = []

    def change(data: bytes) -> bytes:
        data, what = _mutate_bytes(data, region, rng)
        done.append(what)
        return data

    rewrite_payload(ctx, change)
    assert done, "no module or blob entry"
    return done[0]


def run_case(
    base: Path,
    work: Path,
    region: str,
    seed: int,
    env: dict[str, str],
    *,
    ep: str = "IREEExecutionProvider",
    phase: str = "run",
    timeout: float = 60,
) -> Case:
    """One case: a copy of the context folder ``base``, mutated, loaded (and run unless ``phase`` is "load") in
    a fresh process. A crash's detail says whether the session had been created."""
    folder = work / f"{region}_{seed}"
    shutil.copytree(base, folder)
    ctx = folder / "model_ctx.onnx"
    what = mutate(ctx, region, seed)
    try:
        outcome, detail = load_in_child(ctx, ep, env, phase=phase, timeout=timeout)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return Case(seed, region, what, outcome, detail)


def rewrite_payload(ctx: Path, change: Callable[[bytes], bytes]) -> None:
    """Replace the payload entry (module or blob) of ``ctx``'s binary by ``change(payload)``, rewritten with
    epctx's writer (valid checksums) and the identities rebound: only the backend can object."""
    path = _binary_of(ctx)
    with ContextBinary.from_bytes(path.read_bytes()) as binary:
        writer = ContextBinaryWriter(
            ep_name=binary.ep_name, sdk_version=binary.sdk_version, hardware=binary.hardware,
            metadata=dict(binary.metadata),
        )  # fmt: skip
        for name in binary.names():
            info = binary.entry(name)
            data = bytes(binary.read(name))
            if name.endswith(("/module", "/blob")):
                data = change(data)
            writer.add(name, data, kind=info.kind, attrs=dict(info.attrs))
    writer.write(path)
    rebind_identities(ctx)


def load_in_child(
    ctx: Path, ep: str, env: dict[str, str], *, phase: str = "run", timeout: float = 60
) -> tuple[str, str]:
    """Load (and run) ``ctx`` in a fresh process: ("runs" | "typed" | "untyped" | "crash" | "hang", output)."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _RUNNER, str(ctx), phase, ep],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return "hang", f"no exit in {timeout} s"
    if proc.returncode < 0:
        when = "at run" if proc.stdout.startswith("created") else "at session creation"
        return "crash", f"signal {-proc.returncode} {when}"
    return {0: "runs", 3: "typed"}.get(proc.returncode, "untyped"), (proc.stdout + proc.stderr).strip()[-600:]
