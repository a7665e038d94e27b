"""A context binary replaced in place under a live session. Mapped (the default), the session sees the new
bytes: ``cp`` over the file changes its outputs (truncating it would fault the process: SIGBUS). With
``epctx.context_binary_copy=1`` the binary is read into private memory at load, so neither reaches it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest

import epctx
from epctx.session.compile_guard import no_compile
from tests.epcontext.models import EXAMPLE, feed, whole_model

BIN = f"model_{EXAMPLE}.bin"


def _compile(folder: Path, seed: int) -> Path:
    folder.mkdir(parents=True)
    onnx.save(whole_model(seed), folder / "model.onnx")
    so = epctx.SessionOptions()
    so.add_provider(EXAMPLE, {})
    epctx.ModelCompiler(so, str(folder / "model.onnx")).compile_to_file(str(folder / "model_ctx.onnx"))
    return folder / "model_ctx.onnx"


def _session(ctx: Path, copy: bool) -> epctx.InferenceSession:
    so = epctx.SessionOptions()
    if copy:
        so.add_session_config_entry("epctx.context_binary_copy", "1")
    with no_compile():
        return epctx.InferenceSession(str(ctx), so, providers=[EXAMPLE])


def _overwrite_in_place(src: Path, dst: Path) -> None:
    """What ``cp src dst`` does: the same inode, opened for writing and truncated, the new bytes written."""
    with open(dst, "r+b") as out:
        out.truncate(0)
        out.write(src.read_bytes())


@pytest.mark.parametrize("copy", [False, True])
def test_a_binary_overwritten_in_place(tmp_path: Path, copy: bool) -> None:
    ctx = _compile(tmp_path / "a", 0)
    other = _compile(tmp_path / "b", 1)
    assert (ctx.parent / BIN).stat().st_size == (other.parent / BIN).stat().st_size
    session = _session(ctx, copy)
    before = session.run(None, feed())[0]
    _overwrite_in_place(other.parent / BIN, ctx.parent / BIN)
    after = session.run(None, feed())[0]
    if copy:
        np.testing.assert_array_equal(after, before)  # the session keeps the bytes it loaded
    else:
        assert not np.allclose(after, before), "a mapped binary overwritten in place reaches the session"
    # A new session over the replaced file is refused either way: the identity binding (another model's graph).
    with pytest.raises(epctx.InvalidGraph, match="not the binary this model was made with"):
        _session(ctx, copy)


def test_copy_mode_survives_truncation(tmp_path: Path) -> None:
    ctx = _compile(tmp_path / "a", 0)
    session = _session(ctx, copy=True)
    before = session.run(None, feed())[0]
    with open(ctx.parent / BIN, "r+b") as fh:
        fh.truncate(0)
    np.testing.assert_array_equal(session.run(None, feed())[0], before)


def test_mapped_binary_truncated_faults_the_process(tmp_path: Path) -> None:
    """The hazard the copy mode exists for, shown in a child process: a mapped binary truncated under a live
    session kills it with SIGBUS on the next read of the lost pages (never done by epctx, which renames)."""
    ctx = _compile(tmp_path / "a", 0)
    script = textwrap.dedent(
        f"""
        import numpy as np, epctx
        from tests.epcontext.models import EXAMPLE, feed
        s = epctx.InferenceSession({str(ctx)!r}, providers=[EXAMPLE])
        s.run(None, feed())
        open({str(ctx.parent / BIN)!r}, "r+b").truncate(0)
        import gc; gc.collect()
        for _ in range(3):
            s.run(None, feed())
        print("survived")
        """
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == -7, (done.returncode, done.stdout, done.stderr[-2000:])  # SIGBUS


def test_copy_mode_with_weight_sharing(tmp_path: Path) -> None:
    ctx = _compile(tmp_path / "a", 0)
    so = epctx.SessionOptions()
    so.add_session_config_entry("epctx.context_binary_copy", "1")
    so.add_session_config_entry("ep.share_ep_contexts", "1")
    with no_compile():
        session = epctx.InferenceSession(str(ctx), so, providers=[EXAMPLE])
    before = session.run(None, feed())[0]
    shutil.copyfile(tmp_path / "a" / BIN, tmp_path / "keep.bin")
    _overwrite_in_place(tmp_path / "keep.bin", ctx.parent / BIN)
    np.testing.assert_array_equal(session.run(None, feed())[0], before)
