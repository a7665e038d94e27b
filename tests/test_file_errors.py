"""File-system errors are typed (Fail / NoSuchFile naming the path, as onnxruntime) and outputs are checked for
writability before any compile, on every path: ModelCompiler to a file, to bytes with binaries in files, and
sessions with ep.context_enable=1.

The tests run as root, which permission bits do not stop: the cases that must fail for root too use a folder
the kernel refuses to create files in (/sys) and a file that cannot be read (/proc/self/mem). The
permission-bit cases (a mode-700 folder, a mode-000 model) run in a subprocess as ``nobody`` where the system
Python can import the venv's packages."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import onnx
import pytest

import epctx
from epctx.session.compile_guard import no_compile
from tests.epcontext.models import EXAMPLE, two_partition_model

REFUSING_FOLDER = Path("/sys")  # sysfs: creating a file there is EACCES even for root


def _refuses_root() -> bool:
    try:
        fd = os.open(REFUSING_FOLDER / ".epctx_probe", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return True
    os.close(fd)
    os.unlink(REFUSING_FOLDER / ".epctx_probe")
    return False


needs_refusing_folder = pytest.mark.skipif(
    not REFUSING_FOLDER.is_dir() or not _refuses_root(), reason="no folder that refuses new files here"
)


def _source(tmp_path: Path) -> Path:
    onnx.save(two_partition_model(), tmp_path / "model.onnx")
    return tmp_path / "model.onnx"


def _compiler(source: Path, **config: str) -> epctx.ModelCompiler:
    so = epctx.SessionOptions()
    so.add_provider(EXAMPLE, {})
    for key, value in config.items():
        so.add_session_config_entry(key, value)
    return epctx.ModelCompiler(so, str(source))


@needs_refusing_folder
def test_compile_to_file_into_a_refusing_folder_fails_before_compiling(tmp_path: Path) -> None:
    target = REFUSING_FOLDER / "model_ctx.onnx"
    with (
        no_compile(),
        pytest.raises(epctx.Fail, match=r"cannot write the output model '/sys/model_ctx.onnx'"),
    ):
        _compiler(_source(tmp_path)).compile_to_file(str(target))


@needs_refusing_folder
def test_compile_to_bytes_with_binaries_in_a_refusing_folder_fails_before_compiling(tmp_path: Path) -> None:
    compiler = _compiler(_source(tmp_path), **{"ep.context_file_path": str(REFUSING_FOLDER / "m_ctx.onnx")})
    with no_compile(), pytest.raises(epctx.Fail, match="ep.context_file_path '/sys/m_ctx.onnx'"):
        compiler.compile_to_bytes()


@needs_refusing_folder
def test_context_enable_session_checks_its_output_before_compiling(tmp_path: Path) -> None:
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.context_file_path", str(REFUSING_FOLDER / "m_ctx.onnx"))
    with no_compile(), pytest.raises(epctx.Fail, match="cannot write the context model '/sys/m_ctx.onnx'"):
        epctx.InferenceSession(str(_source(tmp_path)), so, providers=[EXAMPLE])


def test_a_model_that_cannot_be_read_is_fail_naming_it() -> None:
    # Reading /proc/self/mem from offset 0 is an I/O error for every user.
    with pytest.raises(epctx.Fail, match=r"cannot read the model file '/proc/self/mem'"):
        epctx.InferenceSession("/proc/self/mem")


def test_missing_model_and_folder_model(tmp_path: Path) -> None:
    with pytest.raises(epctx.NoSuchFile, match="gone.onnx"):
        epctx.InferenceSession(str(tmp_path / "gone.onnx"))
    with pytest.raises(epctx.InvalidArgument, match="is a folder"):
        epctx.InferenceSession(str(tmp_path))


def test_output_that_is_a_folder_is_invalid_argument(tmp_path: Path) -> None:
    (tmp_path / "out.onnx").mkdir()
    with pytest.raises(epctx.InvalidArgument, match="is a folder"):
        _compiler(_source(tmp_path)).compile_to_file(str(tmp_path / "out.onnx"))


# ------------------------------------------------------------------ permission bits, as an unprivileged user

_SYSTEM_PYTHON = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")

_PROBE = textwrap.dedent(
    """
    import json, sys
    import epctx
    from epctx.session.compile_guard import no_compile
    root, example = sys.argv[1], sys.argv[2]
    def attempt(make):
        try:
            with no_compile():
                make()
        except Exception as exc:
            return [type(exc).__name__, str(exc)]
        return ["ok", ""]
    so = epctx.SessionOptions(); so.add_provider(example, {})
    gen = epctx.SessionOptions(); gen.add_session_config_entry("ep.context_enable", "1")
    print(json.dumps({
        "locked_out": attempt(lambda: epctx.ModelCompiler(so, root + "/src/model.onnx").compile_to_file(
            root + "/locked/out_ctx.onnx")),
        "locked_sub": attempt(lambda: epctx.ModelCompiler(so, root + "/src/model.onnx").compile_to_file(
            root + "/locked/sub/out_ctx.onnx")),
        "default_out": attempt(lambda: epctx.ModelCompiler(so, root + "/ro/model.onnx").compile_to_file()),
        "unreadable": attempt(lambda: epctx.InferenceSession(root + "/src/secret.onnx")),
        "generate_ro": attempt(lambda: epctx.InferenceSession(root + "/ro/model.onnx", gen, providers=[example])),
    }))
    """
)


def _as_nobody(root: Path) -> dict[str, list[str]]:
    import json

    if os.geteuid() != 0 or not _SYSTEM_PYTHON.exists():
        pytest.skip("needs root (to drop to nobody) and a system Python of this version")
    site = sysconfig.get_paths()["purelib"]
    src = Path(epctx.__file__).resolve().parents[1]
    env = {"PYTHONPATH": f"{src}{os.pathsep}{site}", "HOME": str(root), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [str(_SYSTEM_PYTHON), "-s", "-c", _PROBE, str(root), EXAMPLE],
        user=65534,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0 and "ModuleNotFoundError" in done.stderr:
        pytest.skip(f"the system Python cannot import the venv's packages: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_permission_errors_as_an_unprivileged_user() -> None:
    root = Path(f"/tmp/epctx_perm_{os.getpid()}")  # pytest's tmp_path lies in a mode-700 folder of root's
    shutil.rmtree(root, ignore_errors=True)
    try:
        for name in ("src", "locked", "ro"):
            (root / name).mkdir(parents=True)
        for path in (root / "src" / "model.onnx", root / "src" / "secret.onnx", root / "ro" / "model.onnx"):
            onnx.save(two_partition_model(), path)
            path.chmod(0o644)
        (root / "src" / "secret.onnx").chmod(0o000)
        (root / "locked").chmod(0o700)
        for folder in (root, root / "src", root / "ro"):
            folder.chmod(0o755)
        found = _as_nobody(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for key in ("locked_out", "locked_sub"):  # before any compile: no_compile would have raised otherwise
        assert found[key][0] == "Fail" and "locked" in found[key][1] and "Permission denied" in found[key][1]
    assert found["default_out"][0] == "Fail" and "model_ctx.onnx" in found["default_out"][1]
    assert found["unreadable"][0] == "Fail" and "secret.onnx" in found["unreadable"][1]
    assert found["generate_ro"][0] == "Fail" and "cannot write the context model" in found["generate_ro"][1]
