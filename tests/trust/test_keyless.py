"""sigstore keyless signatures, verified offline against a trusted root the user supplies: a real keyless bundle
(sigstore/model-transparency's test folder, signed through sigstore's public-good instance) verifies with the
identity and issuer it was made for and nothing else; without the sigstore settings it is refused naming what is
missing; the settings come all three or none."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import epctx
from epctx.cli import main as cli_main
from epctx.errors import InvalidArgument, Untrusted
from epctx.trust.keyless import Expected
from epctx.trust.sign import verify_folder
from tests.trust.test_signing import context_model, write_key

pytest.importorskip("sigstore")

DATA = Path(__file__).parent / "data" / "sigstore_keyless"
IDENTITY = "stefanb@us.ibm.com"
ISSUER = "https://sigstore.verify.ibm.com/oauth2"
ROOT = ROOT_JSON = DATA / "trusted_root.json"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return Path(shutil.copytree(DATA / "model", tmp_path / "model"))


def test_a_real_keyless_signature_verifies_offline(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    verdict = verify_folder(folder, [], keyless=Expected(str(ROOT), IDENTITY, ISSUER))
    assert verdict.ok and verdict.signer == f"sigstore {IDENTITY} ({ISSUER})"
    assert [name for name, _ in verdict.files] == ["signme-1", "signme-2"]
    args = ["verify", str(folder), "--sigstore-root", str(ROOT), "--identity", IDENTITY, "--issuer", ISSUER]
    assert cli_main(args) == 0
    assert f"signed by sigstore {IDENTITY}" in capsys.readouterr().out
    (folder / "signme-2").write_text("changed")
    assert cli_main(args) == 1
    assert "changed  signme-2" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("identity", "issuer", "reason"),
    [
        ("mallory@example.com", ISSUER, "SANs do not match mallory@example.com"),
        (IDENTITY, "https://accounts.google.com", "OIDCIssuer does not match"),
    ],
    ids=["other-identity", "other-issuer"],
)
def test_another_identity_or_issuer_is_refused(folder: Path, identity: str, issuer: str, reason: str) -> None:
    with pytest.raises(Untrusted, match=rf"does not verify against the trusted root .*({reason})"):
        verify_folder(folder, [], keyless=Expected(str(ROOT), identity, issuer))


def test_a_tampered_keyless_bundle_is_refused(folder: Path) -> None:
    sig = folder / "model.sig"
    bundle = json.loads(sig.read_text(encoding="utf-8"))
    envelope = bundle["dsseEnvelope"]
    envelope["signatures"][0]["sig"] = envelope["signatures"][0]["sig"][:-8] + "AAAAAAA="
    sig.write_text(json.dumps(bundle), encoding="utf-8")
    with pytest.raises(Untrusted, match="does not verify against the trusted root"):
        verify_folder(folder, [], keyless=Expected(str(ROOT), IDENTITY, ISSUER))


def test_another_trusted_root_is_refused(folder: Path, tmp_path: Path) -> None:
    """A trusted root without the public-good instance's keys (its Fulcio CA and Rekor key removed)."""
    root = json.loads(ROOT_JSON.read_text(encoding="utf-8"))
    for drop, reason in (("certificateAuthorities", "chain|certificate"), ("tlogs", "transparency log")):
        other = tmp_path / f"without_{drop}.json"
        other.write_text(json.dumps({**root, drop: []}), encoding="utf-8")
        with pytest.raises(Untrusted, match=rf"does not verify against the trusted root .*({reason})"):
            verify_folder(folder, [], keyless=Expected(str(other), IDENTITY, ISSUER))
    (tmp_path / "garbage.json").write_text("{}")
    with pytest.raises(Untrusted, match="is not a readable sigstore trusted root"):
        verify_folder(folder, [], keyless=Expected(str(tmp_path / "garbage.json"), IDENTITY, ISSUER))


def test_without_the_sigstore_settings_a_keyless_bundle_is_refused_naming_them(
    folder: Path, tmp_path: Path
) -> None:
    _, public = write_key(tmp_path, "release")
    with pytest.raises(Untrusted, match=r"is a sigstore keyless signature \(certificate for stefanb@us.ibm.com, "
                       r"transparency-log entry\); verifying it offline needs a sigstore trusted root and the identity "
                       r"and issuer to expect: set epctx.trust.sigstore_root"):  # fmt: skip
        verify_folder(folder, [public])


def _so(**config: str) -> epctx.SessionOptions:
    so = epctx.SessionOptions()
    so.add_session_config_entry("epctx.trust.policy", "require")
    for key, value in config.items():
        so.add_session_config_entry(f"epctx.trust.{key}", value)
    return so


def test_the_load_policy_verifies_keyless_signatures(tmp_path: Path) -> None:
    """A context model whose folder holds the keyless bundle: without the sigstore settings, refused naming them;
    with them, the bundle verifies (offline) and the refusal is that it does not cover the model's files."""
    ctx = context_model(tmp_path / "m")
    shutil.copy(DATA / "model" / "model.sig", ctx.parent / "model.sig")
    _, public = write_key(tmp_path, "release")
    with pytest.raises(Untrusted, match="needs a sigstore trusted root and the identity and issuer"):
        epctx.InferenceSession(str(ctx), _so(keys=str(public)), providers=["ExampleExecutionProvider"])
    so = _so(sigstore_root=str(ROOT), sigstore_identity=IDENTITY, sigstore_issuer=ISSUER)
    with pytest.raises(Untrusted, match=rf"the signature \(by sigstore {IDENTITY} .*\) does not cover it"):
        epctx.InferenceSession(str(ctx), so, providers=["ExampleExecutionProvider"])


def test_the_sigstore_settings_come_together(tmp_path: Path) -> None:
    ctx = context_model(tmp_path / "m")
    with pytest.raises(
        InvalidArgument, match="epctx.trust.sigstore_identity, epctx.trust.sigstore_issuer not set"
    ):
        epctx.InferenceSession(str(ctx), _so(sigstore_root=str(ROOT)), providers=["ExampleExecutionProvider"])
    with pytest.raises(InvalidArgument, match=r"needs trusted keys: .*or, for sigstore keyless signatures"):
        epctx.InferenceSession(str(ctx), _so(), providers=["ExampleExecutionProvider"])
    with pytest.raises(InvalidArgument, match="unknown"):
        epctx.SessionOptions().add_session_config_entry("epctx.trust.sigstore_roots", "x")
    assert cli_main(["verify", str(ctx), "--identity", IDENTITY]) != 0


def test_keyless_verification_imports_sigstore_only_when_a_keyless_bundle_is_verified(tmp_path: Path) -> None:
    """sigstore's imports (~0.5 s) are paid by a keyless verification only: not by a key-signed model under the
    same settings, nor by a warm session."""
    private, public = write_key(tmp_path, "release")
    ctx = context_model(tmp_path / "m")
    assert cli_main(["sign", str(ctx), "--key", str(private)]) == 0
    script = (
        "import sys, epctx\n"
        "so = epctx.SessionOptions()\n"
        f"for k, v in {{'policy': 'require', 'keys': {str(public)!r}, 'sigstore_root': {str(ROOT)!r}, "
        f"'sigstore_identity': {IDENTITY!r}, 'sigstore_issuer': {ISSUER!r}}}.items():\n"
        "    so.add_session_config_entry('epctx.trust.' + k, v)\n"
        f"epctx.InferenceSession({str(ctx)!r}, so, providers=['ExampleExecutionProvider'])\n"
        "print('sigstore' in sys.modules)\n"
    )
    env = {"EPCTX_TRUST_RECORDS": str(tmp_path / "records"), "PYTHONPATH": f"{REPO / 'src'}:{REPO}"}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False"]
