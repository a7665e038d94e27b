"""The package format against onnxruntime's own implementation (1.32): a package onnxruntime writes opens and
runs in epctx, directory hashes agree, and epctx refuses paths that leave the package as the format demands."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import epctx
from epctx.errors import InvalidArgument, InvalidGraph
from epctx.package.layout import directory_hash, read_package

ort = pytest.importorskip("onnxruntime")
if not hasattr(ort, "ModelPackage"):
    pytest.skip("this onnxruntime has no model package API", allow_module_level=True)


def _model(op: str = "Relu") -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    w = helper.make_tensor("w", TensorProto.FLOAT, [2, 3], np.arange(6, dtype=np.float32).tolist())
    nodes = [helper.make_node("Add", ["x", "w"], ["t"]), helper.make_node(op, ["t"], ["y"])]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y], [w]), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 9
    return model


def _ort_package(tmp_path: Path) -> Path:
    """A package written by onnxruntime: the model in a shared asset, a second variant in its own folder."""
    asset = tmp_path / "asset"
    asset.mkdir()
    onnx.save(_model(), asset / "model.onnx")
    (asset / "sub").mkdir()
    (asset / "sub" / "notes.txt").write_text("weights and tokenizer live here")
    pkg = ort.ModelPackage()
    pkg.set_metadata(name="relu", version="2")
    uri = pkg.add_shared_asset(str(asset))
    variant = {"ep": "CPUExecutionProvider", "device": "cpu",
               "executor_info": {"ort": {"model_file": f"{uri}/model.onnx"}}}  # fmt: skip
    pkg.set_component_inline("net", json.dumps({"variants": {"cpu": variant}}))
    dest = tmp_path / "pkg"
    dest.mkdir()
    pkg.commit(str(dest))
    (dest / "cpu").mkdir()
    return dest


def _feeds() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)}


def test_directory_hash_is_onnxruntimes(tmp_path: Path) -> None:
    folder = tmp_path / "a"
    (folder / "b" / "c").mkdir(parents=True)
    (folder / "z.bin").write_bytes(os.urandom(3000))
    (folder / "b" / "c" / "é.txt").write_text("x")
    (folder / "b" / "a").write_bytes(b"")
    (folder / "empty").mkdir()
    assert directory_hash(folder) == ort.ModelPackage.compute_directory_hash(str(folder))


def test_a_package_onnxruntime_writes_opens_and_runs_in_epctx(tmp_path: Path) -> None:
    root = _ort_package(tmp_path)
    package = read_package(root)
    (uri,) = package.assets
    assert uri == ort.ModelPackage.compute_directory_hash(str(tmp_path / "asset"))
    assert [v.name for v in package.component("net").variants] == ["cpu"]
    expected = ort.InferenceSession(str(tmp_path / "asset" / "model.onnx")).run(None, _feeds())
    got = epctx.InferenceSession(str(root)).run(None, _feeds())
    np.testing.assert_allclose(got[0], expected[0], rtol=0, atol=1e-6)
    ctx = epctx.ModelPackageContext(root)
    assert (
        ctx.get_component_names() == ["net"]
        and ctx.get_variant_ep_name("net", "cpu") == "CPUExecutionProvider"
    )
    chosen = ctx.select_component("net", epctx.ModelPackageOptions(epctx.SessionOptions()))
    assert chosen.get_selected_variant_name() == "cpu"
    np.testing.assert_allclose(chosen.create_session().run(None, _feeds())[0], expected[0], atol=1e-6)


def _manifest(root: Path, model_file: str, **variant: object) -> Path:
    root.mkdir(exist_ok=True)
    body = {"ep": "CPUExecutionProvider", "executor_info": {"ort": {"model_file": model_file}}, **variant}
    manifest = {"schema_version": "1.0", "components": {"net": {"variants": {"cpu": body}}}}
    (root / "manifest.json").write_text(json.dumps(manifest))
    (root / "cpu").mkdir(exist_ok=True)
    return root


@pytest.mark.parametrize("ref", ["/etc/passwd", "../outside.onnx", "a/../../outside.onnx"])
def test_paths_leaving_the_package_are_refused(tmp_path: Path, ref: str) -> None:
    onnx.save(_model(), tmp_path / "outside.onnx")
    root = _manifest(tmp_path / "pkg", ref)
    with pytest.raises(InvalidGraph, match="absolute|'\\.\\.'"):
        epctx.InferenceSession(str(root))


def test_a_symlink_out_of_the_package_is_refused(tmp_path: Path) -> None:
    onnx.save(_model(), tmp_path / "outside.onnx")
    root = _manifest(tmp_path / "pkg", "link.onnx")
    (root / "cpu" / "link.onnx").symlink_to(tmp_path / "outside.onnx")
    with pytest.raises(InvalidGraph, match="leads out of"):
        epctx.InferenceSession(str(root))
    (root / "cpu" / "link.onnx").unlink()
    onnx.save(_model(), root / "inside.onnx")
    (root / "cpu" / "link.onnx").symlink_to(root / "inside.onnx")  # a link inside the package is fine
    epctx.InferenceSession(str(root)).run(None, _feeds())


def test_a_variant_directory_or_asset_escaping_is_refused(tmp_path: Path) -> None:
    root = _manifest(tmp_path / "pkg", "m.onnx", variant_directory="../elsewhere")
    with pytest.raises(InvalidGraph, match="'\\.\\.'"):
        read_package(root)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["components"]["net"]["variants"]["cpu"].pop("variant_directory")
    manifest["shared_assets"] = {"sha256:" + "0" * 64: "/tmp"}
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InvalidGraph, match="absolute"):
        read_package(root)


def test_executor_info_ort_session_options_are_honoured(tmp_path: Path) -> None:
    """``session_options`` path keys resolve in the package (here: the external-initializer folder in a shared
    asset, which the model's weights come from); a file-writing option is refused as onnxruntime does."""
    weights = tmp_path / "weights"
    weights.mkdir()
    model = _model()
    onnx.save(model, weights / "model.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="w.data", size_threshold=0)  # fmt: skip
    uri = directory_hash(weights)
    root = tmp_path / "pkg"
    (root / "shared_assets").mkdir(parents=True)
    os.rename(weights, root / "shared_assets" / uri.replace(":", "-"))
    _manifest(root, f"{uri}/model.onnx")
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["components"]["net"]["variants"]["cpu"]["executor_info"]["ort"].update(
        session_options={"session.model_external_initializers_file_folder_path": uri}
    )
    (root / "manifest.json").write_text(json.dumps(manifest))
    session = epctx.InferenceSession(str(root))
    expected = ort.InferenceSession(str(root / "shared_assets" / uri.replace(":", "-") / "model.onnx"))
    np.testing.assert_allclose(session.run(None, _feeds())[0], expected.run(None, _feeds())[0], atol=1e-6)
    manifest["components"]["net"]["variants"]["cpu"]["executor_info"]["ort"]["session_options"] = {
        "session.optimized_model_filepath": "out.onnx"
    }
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InvalidGraph, match="writes a file"):
        epctx.InferenceSession(str(root))


def test_unknown_fields_and_other_layouts_are_refused(tmp_path: Path) -> None:
    root = _manifest(tmp_path / "pkg", "m.onnx")
    manifest = json.loads((root / "manifest.json").read_text())
    for change, message in (({"surprise": 1}, "unknown field"), ({"layout": "installed"}, "portable"),
                            ({"schema_version": "2.0"}, "schema_version")):  # fmt: skip
        (root / "manifest.json").write_text(json.dumps({**manifest, **change}))
        with pytest.raises(InvalidGraph, match=message):
            read_package(root)


def test_a_package_of_several_components_names_them(tmp_path: Path) -> None:
    root = _manifest(tmp_path / "pkg", "m.onnx")
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["components"]["other"] = manifest["components"]["net"]
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InvalidArgument, match="2 components \\(net, other\\)"):
        epctx.InferenceSession(str(root))


def test_selection_skips_what_cannot_run_here(tmp_path: Path) -> None:
    """A variant for an EP this machine lacks, or for a device its EP has not here, is refused with the reason;
    the runnable one is chosen, whatever the manifest's order."""
    from epctx.package.select import rank_variants

    root = _manifest(tmp_path / "pkg", "m.onnx")
    onnx.save(_model(), root / "cpu" / "m.onnx")
    manifest = json.loads((root / "manifest.json").read_text())
    cpu = manifest["components"]["net"]["variants"].pop("cpu")
    manifest["components"]["net"]["variants"] = {
        "cuda": {**cpu, "ep": "CUDAExecutionProvider", "variant_directory": "cpu", "device": "gpu"},
        "npu": {**cpu, "variant_directory": "cpu", "device": "npu"},
        "cpu": cpu,
    }
    (root / "manifest.json").write_text(json.dumps(manifest))
    ranked = rank_variants(read_package(root).component("net"))
    assert [(r.variant.name, r.eligible) for r in ranked] == [("cpu", True), ("cuda", False), ("npu", False)]
    assert "CUDAExecutionProvider is not available here" in ranked[1].why
    assert "has no npu device here" in ranked[2].why
    epctx.InferenceSession(str(root)).run(None, _feeds())
    with pytest.raises(InvalidArgument, match="no variant of component 'net' can run here"):
        epctx.InferenceSession(str(root), providers=["ExampleExecutionProvider"])


def test_the_device_policy_breaks_a_tie_between_equal_variants(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two variants of one EP, equal verdicts, for a CPU and a GPU device: the session's device policy picks, the
    manifest's order when there is none. This machine has no GPU: the CPU EP is given one in the device list
    (what get_ep_devices would report on a machine with a GPU that EP serves)."""
    from epctx.ep._devices import EpDevice, HardwareDevice, HardwareDeviceType
    from epctx.package.select import rank_variants
    from epctx.providers import registry

    devices = registry.get_ep_devices()
    gpu = HardwareDevice(type=HardwareDeviceType.GPU, vendor_id=0x10DE, device_id=1, vendor="NVIDIA")
    cpu_ep = next(d for d in devices if d.ep_name == "CPUExecutionProvider")
    monkeypatch.setattr(
        registry, "get_ep_devices", lambda: [*devices, dataclasses.replace(cpu_ep, device=gpu)]
    )
    root = _manifest(tmp_path / "pkg", "m.onnx")
    onnx.save(_model(), root / "cpu" / "m.onnx")
    manifest = json.loads((root / "manifest.json").read_text())
    cpu = manifest["components"]["net"]["variants"].pop("cpu")
    manifest["components"]["net"]["variants"] = {
        "on-gpu": {**cpu, "variant_directory": "cpu", "device": "gpu"},
        "on-cpu": {**cpu, "variant_directory": "cpu", "device": "cpu"},
    }
    (root / "manifest.json").write_text(json.dumps(manifest))
    component = read_package(root).component("net")
    policy = epctx.OrtExecutionProviderDevicePolicy
    assert [r.variant.name for r in rank_variants(component)] == ["on-gpu", "on-cpu"]
    assert [r.variant.name for r in rank_variants(component, policy=policy.PREFER_CPU)] == [
        "on-cpu",
        "on-gpu",
    ]
    assert [r.variant.name for r in rank_variants(component, policy=policy.PREFER_GPU)] == [
        "on-gpu",
        "on-cpu",
    ]
    assert all(r.eligible for r in rank_variants(component, policy=policy.PREFER_CPU))
    assert isinstance(cpu_ep, EpDevice)
