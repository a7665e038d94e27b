"""Sessions that come and go: creating and dropping 1,600 sessions per EP in one process leaves its file
descriptors, memory mappings and resident memory flat, on every EP. Each EP runs in a child process whose open
file limit is 128, so a session that keeps one descriptor fails the loop long before it ends (``[Errno 24]``);
the compiling EPs load a context model made once (that is how sessions come and go in a server)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SESSIONS = 1600
FD_LIMIT = 128

_CHILD = textwrap.dedent(
    """
    import gc, json, os, resource, sys
    import onnx
    import epctx
    from benchmarks.models import example_inputs, mlp

    ep, folder, sessions, fd_limit, embed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))
    model = mlp(batch=2, sizes=(16, 64, 8))
    feeds = example_inputs("mlp", model)
    path = os.path.join(folder, "m.onnx")
    onnx.save(model, path)
    if ep != "CPUExecutionProvider":  # a compiling EP: sessions load the context model made here once
        so = epctx.SessionOptions()
        so.add_session_config_entry("ep.context_enable", "1")
        so.add_session_config_entry("ep.context_embed_mode", embed)
        so.add_session_config_entry("epctx.partition.measured_rule", "0")  # the toy stays on the EP under test
        epctx.InferenceSession(path, so, providers=[ep])
        path = os.path.join(folder, "m_ctx.onnx")

    def fds():
        return len(os.listdir("/proc/self/fd"))

    def maps():
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)

    def rss_mib():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024

    def once():
        sess = epctx.InferenceSession(path, providers=[ep])
        assert {e for e, _ in sess.get_partitions()} == {ep}, sess.get_partitions()
        sess.run(None, feeds)

    for _ in range(50):  # warm up: pools, arenas and caches made once per process
        once()
    samples = []
    for k in range(sessions):
        if k % (sessions // 4) == 0:
            gc.collect()
            samples.append([fds(), maps(), rss_mib()])
        once()
    gc.collect()
    samples.append([fds(), maps(), rss_mib()])
    print(json.dumps(samples))
    """
)


def _installed(ep: str) -> bool:
    module = {"OpenVINOExecutionProvider": "openvino", "IREEExecutionProvider": "iree.runtime"}.get(ep)
    return module is None or importlib.util.find_spec(module.split(".")[0]) is not None


@pytest.mark.parametrize(
    ("ep", "embed"),
    [
        ("CPUExecutionProvider", "0"),
        ("ExampleExecutionProvider", "0"),
        ("OpenVINOExecutionProvider", "0"),
        ("IREEExecutionProvider", "0"),
        ("IREEExecutionProvider", "1"),
    ],
)
@pytest.mark.slow  # 1,600 sessions per EP, IREE compiles
def test_sessions_created_and_dropped_leave_fds_maps_and_memory_flat(
    ep: str, embed: str, tmp_path: Path
) -> None:
    if not _installed(ep):
        pytest.skip(f"{ep} is not installed")
    done = _child(ep, tmp_path / "first", embed)
    if done.returncode < 0 and _IREE_GIL_CRASH in done.stderr:
        # A rare native crash in the child under the full suite (2 of 7 full-suite runs at stop 27, none in over 40
        # runs of this test alone; a nested GIL release, the Python stack only at the session loop): said aloud,
        # and the child run once more, which must pass
        warnings.warn(f"{ep}: the child crashed (GIL), run again: {done.stderr[:300]}", stacklevel=1)
        done = _child(ep, tmp_path / "again", embed)
    assert done.returncode == 0, done.stderr[-3000:]
    samples = json.loads(done.stdout.strip().splitlines()[-1])  # [fds, maps, RSS MiB] every quarter
    (fds0, maps0, rss0), (fds1, maps1, rss1) = samples[0], samples[-1]
    assert fds1 <= fds0, samples  # not one descriptor per session, nor a few in all
    assert maps1 <= maps0 + 16, samples  # allocator arenas may add a few mappings, sessions add none
    # Memory kept per session grows in every quarter; an allocator's arena or pool grows once (seen: +15 MiB
    # at a random moment with embedded IREE contexts, then flat over 10,000 sessions).
    growth = [b[2] - a[2] for a, b in itertools.pairwise(samples)]
    assert min(growth) <= 1.0, samples  # MiB per 400 sessions: under 2.5 KiB kept per session
    assert rss1 <= rss0 + 32, samples


_IREE_GIL_CRASH = "PyEval_SaveThread: the function must be called with the GIL held"


def _child(ep: str, folder: Path, embed: str) -> subprocess.CompletedProcess[str]:
    folder.mkdir()
    return subprocess.run(
        [sys.executable, "-c", _CHILD, ep, str(folder), str(SESSIONS), str(FD_LIMIT), embed],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**_env(), "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"},
    )


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


_WHEEL_CHILD = textwrap.dedent(
    """
    import glob, json, os, sys
    import numpy as np, onnx, epctx, magika

    folder = sys.argv[1]
    src = sorted(glob.glob(os.path.join(os.path.dirname(magika.__file__), "models", "*", "model.onnx")))[0]
    model = onnx.load(src)
    path = os.path.join(folder, "magika.onnx")
    onnx.save(model, path)
    x = model.graph.input[0]
    shape = [d.dim_value or 1 for d in x.type.tensor_type.shape.dim]
    feeds = {x.name: np.random.default_rng(0).integers(0, 256, shape).astype(np.int32)}
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.context_embed_mode", "1")
    epctx.InferenceSession(path, so, providers=["IREEExecutionProvider"])
    ctx = os.path.join(folder, "magika_ctx.onnx")

    def rss_mib():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024

    def once():
        epctx.InferenceSession(ctx, providers=["IREEExecutionProvider"]).run(None, feeds)

    for _ in range(20):
        once()
    before = rss_mib()
    for _ in range(100):
        once()
    print(json.dumps([os.path.getsize(ctx) / 2**20, before, rss_mib()]))
    """
)


@pytest.mark.slow  # an IREE compile of magika's model
def test_embedded_iree_contexts_of_a_real_model_are_freed_with_their_sessions(tmp_path: Path) -> None:
    """magika's shipped model (3 MB embedded in its context model): 100 sessions kept every payload before (+300 MiB:
    a VmModule.wrap_buffer that refuses an unaligned module keeps the buffer alive), now memory stays flat."""
    if not (_installed("IREEExecutionProvider") and importlib.util.find_spec("magika")):
        pytest.skip("needs IREE and magika")
    done = subprocess.run(
        [sys.executable, "-c", _WHEEL_CHILD, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**_env(), "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    payload_mib, before, after = json.loads(done.stdout.strip().splitlines()[-1])
    assert after - before < 10 * payload_mib, (payload_mib, before, after)  # a leak keeps 100 payloads
