"""The load policy (epctx.trust.policy) on both load paths: the lean reader (a model of EPContext nodes only) and
the full loader (CPU fallback). Refusals happen before any binary is opened, and name the file, the policy and
what was expected. The attacks are those of the trust issue: a binary forged with recomputed checksums and
identity, another model's binary swapped in, a signature from an untrusted key, unsigned native code."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest

import epctx
from epctx.cli import main as cli_main
from epctx.epcontext.container import ContextBinary
from epctx.errors import Untrusted
from tests.epcontext.models import EXAMPLE, feed, two_partition_model, whole_model
from tests.trust.attacks import forge_weights, swap_binary
from tests.trust.test_signing import write_key

pytest.importorskip("model_signing")

ROOT = Path(__file__).resolve().parents[2]
MODELS = {"lean": whole_model, "full": two_partition_model}


def _compile(folder: Path, model: onnx.ModelProto) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, folder / "model.onnx")
    so = epctx.SessionOptions()
    so.add_provider(EXAMPLE, {})
    epctx.ModelCompiler(so, str(folder / "model.onnx")).compile_to_file(str(folder / "model_ctx.onnx"))
    (folder / "model.onnx").unlink()  # ship the context model and its binary only
    return folder / "model_ctx.onnx"


def _options(policy: str, *keys: Path, **extra: str) -> epctx.SessionOptions:
    so = epctx.SessionOptions()
    so.add_session_config_entry("epctx.trust.policy", policy)
    if keys:
        so.add_session_config_entry("epctx.trust.keys", os.pathsep.join(map(str, keys)))
    for key, value in extra.items():
        so.add_session_config_entry(key, value)
    return so


def _run(ctx: Path, so: epctx.SessionOptions | None = None) -> np.ndarray:
    return epctx.InferenceSession(str(ctx), so, providers=[EXAMPLE]).run(None, feed())[0]


@pytest.fixture
def never_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any context binary opened from here on fails the test: a refusal must come before the loader reads it."""

    def refuse(*args: object, **kwargs: object) -> ContextBinary:
        raise AssertionError("a context binary was opened before the trust policy refused it")

    monkeypatch.setattr(ContextBinary, "open", refuse)


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    return write_key(tmp_path, "release")


@pytest.mark.parametrize("path", list(MODELS))
def test_signed_loads_and_unsigned_is_refused(tmp_path: Path, keys: tuple[Path, Path], path: str) -> None:
    private, public = keys
    ctx = _compile(tmp_path / "m", MODELS[path]())
    expected = _run(ctx)
    with pytest.raises(Untrusted) as info:
        _run(ctx, _options("require", public))
    message = str(info.value)
    assert "epctx.trust.policy=require" in message and f"model_{EXAMPLE}.bin" in message
    assert "model.sig" in message and "does not exist" in message and "expected it in" in message
    assert cli_main(["sign", str(ctx), "--key", str(private)]) == 0
    np.testing.assert_array_equal(_run(ctx, _options("require", public)), expected)


@pytest.mark.parametrize("path", list(MODELS))
def test_forged_binary_with_recomputed_checksums(
    tmp_path: Path, keys: tuple[Path, Path], path: str, request: pytest.FixtureRequest
) -> None:
    private, public = keys
    ctx = _compile(tmp_path / "m", MODELS[path]())
    expected = _run(ctx)
    assert cli_main(["sign", str(ctx), "--key", str(private)]) == 0
    forge_weights(ctx)
    assert cli_main(["inspect", str(ctx), "--verify"]) == 0  # every integrity check passes
    assert not np.allclose(_run(ctx), expected)  # and without a policy the forged weights run
    request.getfixturevalue("never_opened")
    with pytest.raises(Untrusted, match=r"model_ExampleExecutionProvider.bin.*SHA-256 differs"):
        _run(ctx, _options("require", public))


def test_swapped_binary_from_another_model(
    tmp_path: Path, keys: tuple[Path, Path], request: pytest.FixtureRequest
) -> None:
    private, public = keys
    ctx = _compile(tmp_path / "a", whole_model(0))
    other = _compile(tmp_path / "b", whole_model(1))
    expected = _run(ctx)
    for model in (ctx, other):
        assert cli_main(["sign", str(model), "--key", str(private)]) == 0
    swap_binary(ctx, other)
    assert not np.allclose(_run(ctx), expected)  # without a policy: the model runs, silently wrong
    request.getfixturevalue("never_opened")
    with pytest.raises(Untrusted, match="SHA-256 differs"):
        _run(ctx, _options("require", public))


def test_signature_from_an_untrusted_key(
    tmp_path: Path, keys: tuple[Path, Path], request: pytest.FixtureRequest
) -> None:
    _, public = keys
    attacker, _ = write_key(tmp_path, "attacker")
    ctx = _compile(tmp_path / "m", whole_model())
    forge_weights(ctx)
    assert cli_main(["sign", str(ctx), "--key", str(attacker)]) == 0  # re-signed by whoever forged it
    request.getfixturevalue("never_opened")
    with pytest.raises(Untrusted, match="not among the trusted keys"):
        _run(ctx, _options("require", public))


def test_warn_loads_and_logs(
    tmp_path: Path, keys: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    ctx = _compile(tmp_path / "m", whole_model())
    with caplog.at_level(logging.WARNING, logger="epctx"):
        _run(ctx, _options("warn", keys[1]))
    assert "epctx.trust.policy=warn" in caplog.text and "loaded anyway" in caplog.text


def test_require_native_loads_unsigned_data_only_payloads(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    ctx = _compile(tmp_path / "m", whole_model())  # the Example EP's programs are interpreted: data
    np.testing.assert_array_equal(_run(ctx, _options("require-native", keys[1])), _run(ctx))


@pytest.mark.slow  # compiles with IREE
def test_require_native_refuses_an_unsigned_iree_module(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    pytest.importorskip("iree.runtime")
    pytest.importorskip("iree.compiler")
    private, public = keys
    folder = tmp_path / "iree"
    folder.mkdir()
    onnx.save(whole_model(), folder / "model.onnx")
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    epctx.InferenceSession(str(folder / "model.onnx"), so, providers=["IREEExecutionProvider"])
    ctx = folder / "model_ctx.onnx"
    run = lambda so=None: epctx.InferenceSession(str(ctx), so, providers=["IREEExecutionProvider"]).run(  # noqa: E731
        None, feed()
    )[0]
    with pytest.raises(
        Untrusted, match=r"require-native.*IREEExecutionProvider.bin' \(carries native code\)"
    ):
        run(_options("require-native", public))
    assert cli_main(["sign", str(ctx), "--key", str(private)]) == 0
    np.testing.assert_allclose(run(_options("require-native", public)), run(), rtol=1e-6)


def test_model_from_bytes_under_require(keys: tuple[Path, Path], tmp_path: Path) -> None:
    ctx = _compile(tmp_path / "m", whole_model())
    with pytest.raises(Untrusted, match="model given as bytes"):
        epctx.InferenceSession(
            ctx.read_bytes(),
            _options("require", keys[1], **{"ep.context_file_path": str(ctx)}),
            providers=[EXAMPLE],
        )


def test_bad_settings_are_invalid_argument(tmp_path: Path) -> None:
    ctx = _compile(tmp_path / "m", whole_model())
    with pytest.raises(epctx.InvalidArgument, match="one of off, warn, require, require-native"):
        _run(ctx, _options("strict"))
    with pytest.raises(epctx.InvalidArgument, match="needs trusted keys"):
        _run(ctx, _options("require"))


def test_signature_elsewhere(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    private, public = keys
    ctx = _compile(tmp_path / "m", whole_model())
    sig = tmp_path / "sigs" / "m.sig"
    sig.parent.mkdir()
    assert cli_main(["sign", str(ctx), "--key", str(private), "--signature", str(sig)]) == 0
    _run(ctx, _options("require", public, **{"epctx.trust.signature": str(sig)}))


def test_the_record_skips_hashing_until_a_file_is_written(
    tmp_path: Path, keys: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import epctx.trust.digests as digests

    private, public = keys
    ctx = _compile(tmp_path / "m", whole_model())
    assert cli_main(["sign", str(ctx), "--key", str(private)]) == 0
    hashed: list[str] = []
    real = digests.file_sha256
    monkeypatch.setattr(digests, "file_sha256", lambda p, *a: hashed.append(Path(p).name) or real(p, *a))
    _run(ctx, _options("require", public))
    assert sorted(hashed) == [f"model_{EXAMPLE}.bin", "model_ctx.onnx"]
    hashed.clear()
    _run(ctx, _options("require", public))
    assert hashed == []  # nothing written since: the record stands
    binary = ctx.parent / f"model_{EXAMPLE}.bin"
    binary.write_bytes(binary.read_bytes())  # the same bytes, written: ctime moves, the record is void
    _run(ctx, _options("require", public))
    assert hashed == [f"model_{EXAMPLE}.bin"]  # for that file: the others' stamps still stand
    hashed.clear()
    _run(ctx, _options("require", public))
    assert hashed == []  # the record holds the binary's new stamp
    sig = ctx.parent / "model.sig"
    sig.write_bytes(sig.read_bytes())  # the signature written: everything is verified again
    _run(ctx, _options("require", public))
    assert sorted(hashed) == [f"model_{EXAMPLE}.bin", "model_ctx.onnx"]


def test_load_path_imports(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    """Policy off: nothing of epctx.trust is imported. Under require: model_signing never is, on either path."""
    private, public = keys
    lean = _compile(tmp_path / "lean", whole_model())
    full = _compile(tmp_path / "full", two_partition_model())
    for ctx in (lean, full):
        assert cli_main(["sign", str(ctx), "--key", str(private)]) == 0
    script = textwrap.dedent(
        f"""
        import sys, epctx
        from tests.epcontext.models import EXAMPLE, feed
        for ctx in ({str(lean)!r}, {str(full)!r}):
            epctx.InferenceSession(ctx, providers=[EXAMPLE]).run(None, feed())
        off = sorted(m for m in sys.modules if m.startswith(("epctx.trust", "model_signing", "cryptography")))
        so = epctx.SessionOptions()
        so.add_session_config_entry("epctx.trust.policy", "require")
        so.add_session_config_entry("epctx.trust.keys", {str(public)!r})
        for ctx in ({str(lean)!r}, {str(full)!r}):
            epctx.InferenceSession(ctx, so, providers=[EXAMPLE]).run(None, feed())
        print(off, "model_signing" in sys.modules, "epctx.trust.policy" in sys.modules)
        """
    )
    env = {**os.environ, "EPCTX_TRUST_RECORDS": str(tmp_path / "records")}
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["[]", "False", "True"]


def test_a_binary_written_between_verification_and_load_is_refused(
    tmp_path: Path, keys: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    private, public = keys
    ctx = _compile(tmp_path / "m", whole_model())
    assert cli_main(["sign", str(ctx), "--key", str(private)]) == 0
    real_open = ContextBinary.open

    def racing_open(path: Path, **kwargs: bool) -> ContextBinary:
        data = Path(path).read_bytes()
        Path(path).write_bytes(data)  # a writer racing the load (the same bytes: ctime moves all the same)
        return real_open(path, **kwargs)

    monkeypatch.setattr(ContextBinary, "open", staticmethod(racing_open))
    with pytest.raises(Untrusted, match="changed between its verification and its load"):
        _run(ctx, _options("require", public))
