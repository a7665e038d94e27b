"""A package built from a SPEC: the LLM pair's prefill (tiny) for five IREE targets and the plain model, on the
local pool. onnxruntime opens what epctx writes; the five targets' weights are stored once; selection ranks
every variant here; the build is incremental, byte-identical, and a failed job leaves the last package intact."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import epctx
from epctx.cli import main
from epctx.epcontext.container import ContextBinary
from epctx.farm.executors import LocalPool
from epctx.farm.jobs import JobFailed
from epctx.farm.run import build
from epctx.package.layout import read_package
from epctx.package.select import rank_variants
from epctx.package.tools import validate_package
from tests.requires import requires

ort = pytest.importorskip("onnxruntime")
if not hasattr(ort, "ModelPackage"):
    pytest.skip("this onnxruntime has no model package API", allow_module_level=True)
pytestmark = [pytest.mark.slow, requires("iree.compiler", "torch")]  # IREE compiles, torch exports the pair

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ("host", "x86-64-v2", "x86-64-v3", "x86-64-v4", "aarch64")


def write_spec(
    folder: Path,
    model: Path,
    targets: tuple[str, ...] = TARGETS,
    cpu: bool = True,
    decode: Path | None = None,
) -> Path:
    lines = ['[package]\nname = "llm-pair"\nversion = "1"\n', f'[components.prefill]\nmodel = "{model}"\n']
    if decode is not None:
        lines.append(f'[components.decode]\nmodel = "{decode}"\n')
    for target in targets:
        lines.append(f'[[targets]]\nname = "iree-{target}"\nep = "IREEExecutionProvider"\ndevice = "cpu"\n'
                     f'options = {{ target = "{target}" }}\n')  # fmt: skip
    if cpu:
        lines.append('[[targets]]\nname = "cpu"\nep = "CPUExecutionProvider"\n')
    spec = folder / "spec.toml"
    spec.write_text("\n".join(lines))
    return spec


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    sys.path.insert(0, str(ROOT))
    from benchmarks.llm_pair import export_pair

    return export_pair(tmp_path_factory.mktemp("pair"), "tiny")


@pytest.fixture(scope="module")
def source(pair: tuple[Path, Path]) -> Path:
    return pair[0]


@pytest.fixture(scope="module")
def built(pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pair: prefill and decode for the five targets, and the prefill's plain model."""
    folder = tmp_path_factory.mktemp("build")
    spec = write_spec(folder, pair[0], decode=pair[1])
    build(spec, folder / "pkg", LocalPool(2))
    return folder / "pkg"


def feeds() -> dict[str, np.ndarray]:
    ids = np.arange(8, dtype=np.int64)[None]
    return {"input_ids": ids % 256, "position_ids": ids}


def test_onnxruntime_opens_the_package_epctx_writes(built: Path) -> None:
    package = ort.ModelPackage.open(str(built))
    info = package.get_info()
    for asset in info["shared_assets"]:
        assert asset["uri"] == ort.ModelPackage.compute_directory_hash(asset["resolved_path"])
    prefill = next(c for c in info["components"] if c["name"] == "prefill")
    variants = {v["name"]: v for v in prefill["variants"]}
    assert set(variants) == {f"iree-{t}" for t in TARGETS} | {"cpu"}
    assert "sha256:" in json.loads(variants["iree-host"]["executor_info"]["ort"])["model_file"]
    ctx = ort.ModelPackageContext(str(built))
    so = ort.SessionOptions()
    so.add_provider("CPUExecutionProvider", {})
    chosen = ctx.select_component("prefill", ort.ModelPackageOptions(so))
    assert chosen.get_selected_variant_name() == "cpu"
    expected = chosen.create_session().run(None, feeds())
    mine = epctx.ModelPackageContext(built).select_component("prefill")
    assert (
        mine.get_selected_variant_name() == "iree-host"
    )  # epctx ranks every EP: IREE, compiled for this CPU
    got = mine.create_session().run(None, feeds())
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)


def test_five_targets_store_the_weights_once(built: Path) -> None:
    """On disk: <= 1.1x (one copy of the weights + every target's code), for the pair (prefill and decode share
    their weights too)."""
    (asset,) = read_package(built).assets.values()
    (binary,) = asset.glob("*.bin")
    with ContextBinary.open(binary) as b:
        entries = [b.entry(n) for n in b.names()]
    weights = sum(size for _, size in {(e.offset, e.size) for e in entries if e.kind == "weights"})
    code = sum(e.size for e in entries if e.kind == "graph")
    iree_files = binary.stat().st_size + sum(p.stat().st_size for p in asset.glob("*.iree-*_ctx.onnx"))
    assert len({tuple(e.name.split(".")[:2]) for e in entries}) == 2 * len(TARGETS)
    assert iree_files <= 1.1 * (weights + code), (iree_files, weights, code)
    separate = sum(p.stat().st_size for p in (built.parent / "pkg.jobs").glob("*/*.bin"))
    assert separate > 2.5 * binary.stat().st_size


def test_select_ranks_every_variant_here(built: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ranked = rank_variants(read_package(built).component("prefill"))
    names = [r.variant.name for r in ranked]
    statuses = {r.variant.name: r.verdict.status.name for r in ranked}
    assert names[0] == "iree-host" and statuses["iree-host"] == "EP_SUPPORTED_OPTIMAL"
    assert statuses["iree-x86-64-v2"] == "EP_SUPPORTED_PREFER_RECOMPILATION"
    assert statuses["cpu"] == "EP_NOT_APPLICABLE"
    assert names[-1] == "iree-aarch64" and not ranked[-1].eligible
    assert names.index("cpu") > names.index("iree-x86-64-v2")
    only_cpu = rank_variants(read_package(built).component("prefill"), ["CPUExecutionProvider"])
    assert only_cpu[0].variant.name == "cpu"
    assert main(["package", "select", str(built)]) == 0
    out = capsys.readouterr().out
    assert "*1. iree-host" in out and "refused: UNSUPPORTED" in out and "aarch64" in out


def test_every_loadable_variant_runs_as_onnxruntime(built: Path) -> None:
    package = read_package(built)
    (asset,) = package.assets.values()
    expected = ort.InferenceSession(str(asset / "prefill" / "cpu.onnx")).run(None, feeds())
    for target in TARGETS[:-1]:
        session = epctx.InferenceSession(
            str(asset / f"prefill.iree-{target}_ctx.onnx"), providers=["IREEExecutionProvider"]
        )
        for a, b in zip(session.run(None, feeds()), expected):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)
    with pytest.raises(epctx.InvalidGraph, match="aarch64"):
        epctx.InferenceSession(
            str(asset / "prefill.iree-aarch64_ctx.onnx"), providers=["IREEExecutionProvider"]
        )


def test_rebuild_is_incremental_and_byte_identical(built: Path, tmp_path: Path) -> None:
    spec = built.parent / "spec.toml"
    before = tree_digest(built)
    report = build(spec, built, LocalPool(2))
    assert {r.where for r in report.rows} == {"cache"}
    assert tree_digest(built) == before
    fresh = tmp_path / "again"
    build(spec, fresh, LocalPool(2), cache=built.parent / "pkg.jobs")
    assert tree_digest(fresh) == before


def test_a_failed_job_names_itself_and_keeps_the_last_package(
    built: Path, tmp_path: Path, source: Path
) -> None:
    before = tree_digest(built)
    spec = write_spec(tmp_path, source, targets=("host",), cpu=False)
    text = spec.read_text()
    spec.write_text(text.replace('target = "host"', 'target = "host", opt_level = "O7"'))
    with pytest.raises(JobFailed, match=r"prefill/iree-host .*O7"):  # refused before anything runs
        build(spec, built, LocalPool(1), cache=built.parent / "pkg.jobs")
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(source.read_bytes()[:1000])
    spec.write_text(text.replace(str(source), str(broken)))
    with pytest.raises(JobFailed, match=r"prefill/iree-host .*broken.onnx"):  # the compiler's message
        build(spec, built, LocalPool(1), cache=built.parent / "pkg.jobs")
    assert tree_digest(built) == before
    assert not [p for p in built.parent.iterdir() if ".staging-" in p.name]


def test_validate_rechecks_hashes_and_contexts(built: Path, tmp_path: Path) -> None:
    assert validate_package(built) == []
    copy = tmp_path / "copy"
    shutil.copytree(built, copy)
    (asset,) = read_package(copy).assets.values()
    (binary,) = asset.glob("*.bin")
    data = bytearray(binary.read_bytes())
    data[-100] ^= 0xFF
    binary.write_bytes(bytes(data))
    findings = validate_package(copy)
    assert any("hashes to" in f for f in findings)
    assert any("checksum" in f for f in findings), findings
    assert main(["package", "validate", str(copy)]) == 1
    assert main(["package", "inspect", str(built)]) == 0
    os.remove(asset / "prefill.iree-host_ctx.onnx")
    assert any("prefill/iree-host" in f for f in validate_package(copy))
