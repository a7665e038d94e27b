"""What the trust policy costs at load (issue 20): warm sessions under ``epctx.trust.policy=require`` against the
same sessions with the policy off, in fresh processes, and the first verification's hashing speed.

    python benchmarks/bench_trust.py [--llm-size bench|tiny|none] [--runs 9]

Two cases, compiled with IREE into a signed folder (``epctx.trust.sign``, an EC P-256 key):
- ``small``: a two-MatMul MLP (tests' ``whole_model``), one context model and its binary;
- ``llm pair``: ``benchmarks/llm_pair.py``'s Llama prefill + decode, compiled together with
  ``ep.share_ep_contexts`` (two context models, one binary with the shared weights).

Each fresh process imports epctx, creates the case's sessions and runs each once; ``warm`` is the median of the
session creation (both sessions for the pair) over ``--runs`` rounds, the two modes alternating within each
round (``min`` the fastest of each, less sensitive to a loaded machine); ``check`` is the time the policy
check itself took inside the ``require`` processes. Under ``require`` the verification record exists (a first
process made it), so the warm figure is what a deployment pays on every start while nothing changed. ``first``
is a first load in a fresh process with no record (``require`` verifies everything: signature, SHA-256 of
every covered file, record written; the page cache is warm), the two modes alternating over ``--runs``
rounds: session creation, the check's own time (MB/s over the bytes hashed) and the container's own checksum
pass (``ContextBinary._verify``, entries verified on first read) in each mode. ``package``: warm sessions on
a one-variant Example-EP package, off and ``require`` alternating inside fresh processes. ``--src`` times another
source tree (a before / after).
Target: warm require <= 1.10 x warm off."""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.processes import child_env, compile_bytecode

ROOT = Path(__file__).resolve().parents[1]
IREE = "IREEExecutionProvider"

_CHILD = """
import json, sys, time
import numpy as np
t0 = time.perf_counter()
import epctx
import epctx.session.lean, epctx.providers.iree.provider, iree.runtime
paths, feeds, policy, key = json.loads(sys.argv[1])
from epctx.epcontext.load import ContextLoader
checking = [0.0]
_check = ContextLoader._check_trust
def _timed(self, *args):
    t = time.perf_counter()
    try:
        return _check(self, *args)
    finally:
        checking[0] += time.perf_counter() - t
ContextLoader._check_trust = _timed
from epctx.epcontext.container import ContextBinary
verifying = [0.0]  # the container's own checksum pass (entries verified on first read)
_verify = ContextBinary._verify
def _timed_verify(self, *args):
    t = time.perf_counter()
    try:
        return _verify(self, *args)
    finally:
        verifying[0] += time.perf_counter() - t
ContextBinary._verify = _timed_verify
t, cpu = time.perf_counter(), time.process_time()
sessions = []
for k, path in enumerate(paths):
    so = epctx.SessionOptions()
    if len(paths) > 1:
        so.add_session_config_entry("ep.share_ep_contexts", "1")
        so.add_session_config_entry("ep.stop_share_ep_contexts", str(k))
    so.add_session_config_entry("epctx.trust.policy", policy)
    so.add_session_config_entry("epctx.trust.keys", key)
    sessions.append(epctx.InferenceSession(path, so, providers=["IREEExecutionProvider"]))
created, created_cpu = time.perf_counter() - t, time.process_time() - cpu
for s, f in zip(sessions, feeds):
    s.run(None, dict(np.load(f)))
print(json.dumps({"created": created, "cpu": created_cpu, "total": time.perf_counter() - t0, "check": checking[0],
                  "verify": verifying[0],
                  "trust_imported": "epctx.trust.policy" in sys.modules}))
"""


def _compile(folder: Path, sources: list[Path]) -> list[Path]:
    import epctx

    out = []
    for k, source in enumerate(sources):
        so = epctx.SessionOptions()
        so.add_session_config_entry("ep.context_enable", "1")
        if len(sources) > 1:
            so.add_session_config_entry("ep.share_ep_contexts", "1")
            so.add_session_config_entry("ep.stop_share_ep_contexts", str(k))
        epctx.InferenceSession(str(source), so, providers=[IREE])
        out.append(source.with_name(f"{source.stem}_ctx.onnx"))
    for source in sources:
        source.unlink()  # ship the context models and binaries only
    return out


def _small(folder: Path) -> tuple[list[Path], list[Path]]:
    import numpy as np
    import onnx
    from tests.epcontext.models import feed, whole_model

    folder.mkdir()
    onnx.save(whole_model(), folder / "mlp.onnx")
    np.savez(folder.parent / "mlp_feed.npz", **feed())
    return _compile(folder, [folder / "mlp.onnx"]), [folder.parent / "mlp_feed.npz"]


def _llm(folder: Path, size: str) -> tuple[list[Path], list[Path]]:
    import numpy as np
    import onnxruntime as ort

    from benchmarks.llm_pair import SIZES, decode_feeds, export_pair, prefill_feeds

    folder.mkdir()
    prefill_path, decode_path = export_pair(folder, size)
    config = SIZES[size]
    prefill = prefill_feeds(config, 32)
    outs = ort.InferenceSession(str(prefill_path), providers=["CPUExecutionProvider"]).run(None, prefill)
    decode = decode_feeds(config, outs, int(np.argmax(outs[0][0, -1])))
    feeds = [folder.parent / "prefill_feed.npz", folder.parent / "decode_feed.npz"]
    np.savez(feeds[0], **prefill)
    np.savez(feeds[1], **decode)
    return _compile(folder, [prefill_path, decode_path]), feeds


_PACKAGE_CHILD = """
import json, statistics, sys, time
import epctx
pkg, key, rounds = json.loads(sys.argv[1])
feeds = None
def options(policy):
    so = epctx.SessionOptions()
    so.add_session_config_entry("epctx.trust.policy", policy)
    so.add_session_config_entry("epctx.trust.keys", key)
    return so
times = {"off": [], "require": []}
for k in range(rounds + 1):
    for policy in times:
        so = options(policy)
        t = time.perf_counter()
        epctx.InferenceSession(pkg, so, providers=["ExampleExecutionProvider"])
        if k:  # the first round imports and verifies (the record then exists)
            times[policy].append(time.perf_counter() - t)
print(json.dumps(times))
"""


_SRC: list[str] = []  # --src: the epctx source tree the children import instead of this checkout's


def _env(records: Path) -> dict[str, str]:
    env = {**child_env(), "EPCTX_TRUST_RECORDS": str(records)}
    if _SRC:
        env["PYTHONPATH"] = os.pathsep.join([*_SRC, env["PYTHONPATH"]])
    return env


def _package(folder: Path) -> Path:
    """A package of the conformance ``chain`` model with one Example-EP variant (built by ``epctx package``)."""
    import onnx

    from epctx.cli import main as cli_main
    from epctx.testing.conformance import models

    folder.mkdir()
    onnx.save(models.chain(), folder / "chain.onnx")
    spec = folder / "spec.toml"
    spec.write_text(
        '[package]\nname = "demo"\n\n[components.chain]\nmodel = "chain.onnx"\n\n'
        '[[targets]]\nname = "example"\nep = "ExampleExecutionProvider"\n'
    )
    assert cli_main(["package", "build", str(spec), "-o", str(folder / "pkg"), "--workers", "1"]) == 0
    return folder / "pkg"


def measure_package(pkg: Path, key: Path, runs: int, rounds: int, tmp: Path) -> dict[str, object]:
    """Warm package sessions (``InferenceSession(package_folder)``), off and ``require`` alternating, in
    ``runs`` fresh processes of ``rounds`` creations each (after one untimed round that verifies)."""
    env = _env(tmp / "records_package")
    medians: dict[str, list[float]] = {"off": [], "require": []}
    mins: dict[str, list[float]] = {"off": [], "require": []}
    for _ in range(runs):
        arg = json.dumps([str(pkg), str(key), rounds])
        done = subprocess.run([sys.executable, "-c", _PACKAGE_CHILD, arg], env=env, capture_output=True,
                              text=True, timeout=300, cwd=ROOT, check=False)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-3000:])
        times = json.loads(done.stdout.splitlines()[-1])
        for policy, values in times.items():
            medians[policy].append(statistics.median(values))
            mins[policy].append(min(values))
    off, req = statistics.median(medians["off"]), statistics.median(medians["require"])
    return {
        "case": "package (Example EP, conformance chain)",
        "warm off ms": round(off * 1e3, 3),
        "warm require ms": round(req * 1e3, 3),
        "ratio": round(req / off, 3),
        "min off ms": round(min(mins["off"]) * 1e3, 3),
        "min require ms": round(min(mins["require"]) * 1e3, 3),
        "min ratio": round(min(mins["require"]) / min(mins["off"]), 3),
        "runs x rounds": f"{runs} x {rounds}",
    }


def _child(paths: list[Path], feeds: list[Path], policy: str, key: Path, records: Path) -> dict[str, float]:
    env = _env(records)
    arg = json.dumps([[str(p) for p in paths], [str(f) for f in feeds], policy, str(key)])
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, arg], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.splitlines()[-1])


def _hashed_bytes(paths: list[Path]) -> int:
    """Bytes a case's first verification hashes: each file once (a binary shared by the pair is hashed once)."""
    from epctx.ep._context_node import EPContextNode, is_ep_context
    from epctx.model.lean import read_context_model

    seen: dict[tuple[int, int], int] = {}
    for path in paths:
        model = read_context_model(path.read_bytes())
        assert model is not None
        views = [EPContextNode.from_node(node) for node in model.graph if is_ep_context(node)]
        for f in (path, *(path.parent / v.cache_path for v in views if v.cache_path)):
            st = f.stat()
            seen[(st.st_dev, st.st_ino)] = st.st_size
    return sum(seen.values())


def _first_loads(
    paths: list[Path], feeds: list[Path], key: Path, runs: int, tmp: Path
) -> dict[str, list[dict[str, float]]]:
    """``runs`` rounds of a first load in a fresh process (no verification record: ``require`` verifies
    everything; the page cache is warm), the policy off and ``require`` alternating."""
    rows: dict[str, list[dict[str, float]]] = {"off": [], "require": []}
    for k in range(runs):
        for policy in rows:
            rows[policy].append(_child(paths, feeds, policy, key, tmp / f"first_{k}_{policy}"))
    return rows


def _first_row(first: dict[str, list[dict[str, float]]], hashed: int) -> dict[str, object]:
    def med(policy: str, field: str) -> float:
        return statistics.median(row[field] for row in first[policy])

    return {
        "first off ms": round(med("off", "created") * 1e3, 1),
        "first require ms": round(med("require", "created") * 1e3, 1),
        "first ratio": round(med("require", "created") / med("off", "created"), 3),
        "first cpu ms (off / require)": (
            round(med("off", "cpu") * 1e3, 1),
            round(med("require", "cpu") * 1e3, 1),
        ),
        "first check ms": round(med("require", "check") * 1e3, 1),
        "first check MB/s": round(hashed / 1e6 / med("require", "check")),
        "first container verify ms (off / require)": (
            round(med("off", "verify") * 1e3, 1),
            round(med("require", "verify") * 1e3, 1),
        ),
    }


def measure(
    name: str, paths: list[Path], feeds: list[Path], key: Path, runs: int, tmp: Path
) -> dict[str, object]:
    records = tmp / f"records_{name.replace(' ', '_')}"
    hashed = _hashed_bytes(paths)
    first = _first_loads(paths, feeds, key, runs, tmp / f"first_{name.replace(' ', '_')}")
    _child(paths, feeds, "require", key, records)  # the record the warm rounds use
    warm: dict[str, list[float]] = {"off": [], "require": []}
    totals: dict[str, list[float]] = {"off": [], "require": []}
    cpu: dict[str, list[float]] = {"off": [], "require": []}
    checks: list[float] = []
    for _ in range(runs):
        for policy in warm:
            row = _child(paths, feeds, policy, key, records)
            assert row["trust_imported"] == (policy == "require")
            warm[policy].append(row["created"])
            cpu[policy].append(row["cpu"])
            if policy == "require":
                checks.append(row["check"])
            totals[policy].append(row["total"])
    med = {p: statistics.median(v) for p, v in warm.items()}
    tot = {p: statistics.median(v) for p, v in totals.items()}
    return {
        "case": name,
        "MB hashed": round(hashed / 1e6, 1),
        **_first_row(first, hashed),
        "warm off ms": round(med["off"] * 1e3, 2),
        "warm require ms": round(med["require"] * 1e3, 2),
        "ratio": round(med["require"] / med["off"], 3),
        "min off ms": round(min(warm["off"]) * 1e3, 2),
        "min require ms": round(min(warm["require"]) * 1e3, 2),
        "min ratio": round(min(warm["require"]) / min(warm["off"]), 3),
        "cpu ratio (medians)": round(statistics.median(cpu["require"]) / statistics.median(cpu["off"]), 3),
        "check ms (median, in the require process)": round(statistics.median(checks) * 1e3, 3),
        "process off ms": round(tot["off"] * 1e3, 1),
        "process require ms": round(tot["require"] * 1e3, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llm-size", default="bench", choices=["bench", "tiny", "none"])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--cases", default="small,llm,package", help="comma-separated: small, llm, package")
    parser.add_argument(
        "--package-rounds", type=int, default=60, help="session creations per package process"
    )
    parser.add_argument(
        "--src",
        help="the epctx source folder the timed processes import (a before / after: "
        "e.g. `git archive main src | tar -x -C /tmp/base`, --src /tmp/base/src)",
    )
    parser.add_argument(
        "--work",
        type=Path,
        help="keep the built cases in this folder and reuse them on the next run (default: a temporary folder)",
    )
    args = parser.parse_args()
    if args.src:
        _SRC.append(str(Path(args.src).resolve()))
    compile_bytecode()
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)
        _run(args, args.work)
        return
    with tempfile.TemporaryDirectory() as tmp_name:
        _run(args, Path(tmp_name))


def _built(folder: Path, build: Any) -> Any:
    """``build(folder)``, or what an earlier run built there (``--work``)."""
    done = folder.with_name(f"{folder.name}.json")
    if done.is_file():
        return json.loads(done.read_text())
    if folder.exists():
        shutil.rmtree(folder)
    made = build(folder)
    done.write_text(json.dumps(made, default=str))
    return json.loads(done.read_text())


def _run(args: argparse.Namespace, work: Path) -> None:
    from tests.trust.test_signing import write_key

    from epctx.trust.sign import sign_folder

    wanted = set(args.cases.split(","))
    tmp = Path(tempfile.mkdtemp(dir=work))  # records and keys of this run
    private, public = write_key(tmp, "release")
    rows = []
    cases = [("small", _built(work / "small", _small))] if "small" in wanted else []
    if args.llm_size != "none" and "llm" in wanted:
        build = functools.partial(_llm, size=args.llm_size)
        cases.append((f"llm pair ({args.llm_size})", _built(work / f"llm_{args.llm_size}", build)))
    for name, (paths, feeds) in cases:
        paths, feeds = [Path(p) for p in paths], [Path(f) for f in feeds]
        sign_folder(paths[0], private)
        rows.append(measure(name, paths, feeds, public, args.runs, tmp))
    if "package" in wanted:
        pkg = Path(_built(work / "package", lambda folder: str(_package(folder))))
        sign_folder(pkg, private)
        rows.append(measure_package(pkg, public, args.runs, args.package_rounds, tmp))
    shutil.rmtree(tmp, ignore_errors=True)
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
