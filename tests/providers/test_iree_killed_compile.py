"""A compile killed with its process leaves nothing behind: the compile worker and ``iree-compile`` end with it
(``PR_SET_PDEATHSIG``), and its job folder in ``$TMPDIR`` is removed by the next compile (only the folders of
processes that have ended: a live process's folder and anything else in ``$TMPDIR`` are left alone)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import onnx
import pytest
from benchmarks.models import mlp, resnet18

from tests.requires import requires

# Compiles with IREE: `make test-fast` leaves it out.
pytestmark = [pytest.mark.slow, requires("iree.runtime", "iree.compiler")]

ROOT = Path(__file__).resolve().parents[2]
_COMPILE = textwrap.dedent(
    """
    import sys, epctx
    epctx.InferenceSession(sys.argv[1], providers=["IREEExecutionProvider"])
    print("compiled")
    """
)


def _processes_under(folder: Path) -> dict[int, str]:
    """Live (not zombie) processes whose command line names ``folder`` or that run in it (iree-compile runs in
    its job folder on relative names): pid -> command line."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        inside = str(folder) in cmdline or cwd == str(folder) or cwd.startswith(f"{folder}/")
        if inside and state != "Z":
            found[int(entry.name)] = cmdline
    return found


def _runs_iree_compile(cmdline: str) -> bool:
    """A process running iree-compile (a process between fork and exec, or exiting, shows an empty command line)."""
    words = cmdline.split()
    return bool(words) and words[0].endswith("iree-compile")


def _ended(folder: Path) -> bool:
    """A job folder whose compile ran to its end: a result, or a module with bytes in it (iree-compile creates
    its output file, empty, when it starts)."""
    module = folder / "module.vmfb"
    return (folder / "result.json").exists() or (module.exists() and module.stat().st_size > 0)


def _wait_for(condition, timeout: float, step: float = 0.05):  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = condition()
        if found:
            return found
        time.sleep(step)
    return condition()


def _compile(model: Path, tmpdir: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "TMPDIR": str(tmpdir), "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
    return subprocess.Popen(
        [sys.executable, "-c", _COMPILE, str(model)], env=env, text=True, stdout=subprocess.PIPE
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_killed_compile_leaves_no_process_and_no_folder(tmp_path: Path) -> None:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    bystander = tmpdir / f"epctx-iree-{os.getpid()}-live"  # a live process's folder: never removed
    bystander.mkdir()
    model = tmp_path / "resnet.onnx"  # iree-compile runs for seconds: it is frozen in its first milliseconds
    onnx.save(resnet18(image=64, widths=(32, 64, 64, 64), blocks=(2, 2, 2, 2), num_classes=10), model)
    child = _compile(model, tmpdir)
    try:
        compiling = _wait_for(
            lambda: [p for p, c in _processes_under(tmpdir).items() if _runs_iree_compile(c)],
            timeout=120,
            step=0.01,
        )
        assert compiling, "no iree-compile started within 120 s"
        for pid in compiling:  # iree-compile itself (exec'd by its lifeline), frozen mid-compile (SIGSTOP)
            os.kill(pid, signal.SIGSTOP)
        # iree-compile opens its output at start: the compile has ended only when the worker wrote its result
        assert not [f for f in tmpdir.iterdir() if _ended(f)], "the compile ended before it was frozen"
        workers = _processes_under(tmpdir)  # the worker and iree-compile (through its lifeline)
        assert any("epctx.providers.iree.worker" in c for c in workers.values()), workers
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    try:  # a stopped process still ends at SIGKILL, which PR_SET_PDEATHSIG sends
        assert _wait_for(lambda: not _processes_under(tmpdir), timeout=10), "left running after the kill"
    finally:
        for pid in _processes_under(tmpdir):  # this test's orphans, if any: not left to run for an hour
            os.kill(pid, signal.SIGKILL)
    folders = [p for p in tmpdir.iterdir() if p != bystander]
    # Ended, not run to their end by orphans (once resumed): no module was written.
    assert folders and not [f for f in folders if _ended(f)]
    assert all(f.name.startswith(f"epctx-iree-{child.pid}-") for f in folders)  # named for their owner

    tiny = tmp_path / "tiny.onnx"
    onnx.save(mlp(batch=1, sizes=(4, 4)), tiny)
    following = _compile(tiny, tmpdir)
    out, _ = following.communicate(timeout=300)
    assert following.returncode == 0 and "compiled" in out
    assert not any(folder.exists() for folder in folders)
    assert sorted(tmpdir.iterdir()) == [bystander]


def test_only_unlocked_folders_of_ended_processes_are_removed(tmp_path: Path) -> None:
    import fcntl

    from epctx.providers.iree.lifeline import remove_stale_folders

    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f"epctx-iree-{dead.pid}-a"
    locked = tmp_path / f"epctx-iree-{dead.pid}-b"  # a live owner elsewhere (another pid namespace) holds it
    live = tmp_path / f"epctx-iree-{os.getpid()}-c"
    other = tmp_path / f"epctx-iree-{dead.pid}"  # not a job folder's name
    link = tmp_path / f"epctx-iree-{dead.pid}-d"  # a symlink is never followed
    for folder in (stale, locked, live, other):
        folder.mkdir()
        (folder / "weights.bin").write_bytes(b"w")
    link.symlink_to(live)
    lock = os.open(locked, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert remove_stale_folders(str(tmp_path)) == [str(stale)]
    finally:
        os.close(lock)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (locked, live, other, link))
    assert (live / "weights.bin").is_file()
    assert remove_stale_folders(str(tmp_path)) == [str(locked)]  # its owner let go
