"""``epctx inspect``: context models made by onnxruntime's QNN EP, OpenVINO-style and epctx-made models, and
every path / container problem reported as a finding."""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from epctx.cli import main as cli_main
from epctx.epcontext import ContextBinaryWriter
from epctx.errors import InvalidGraph, NoSuchFile
from epctx.tools.inspect import (
    FORMAT_EPCTX,
    FORMAT_OPENVINO,
    FORMAT_OPENVINO_BIN,
    FORMAT_QNN,
    FORMAT_TENSORRT,
    FORMAT_UNKNOWN,
    detect_payload,
    inspect_model,
)

EXAMPLE = "ExampleExecutionProvider"
OPENVINO = "OpenVINOExecutionProvider"


def _ctx_model(nodes: list[dict[str, Any]], *, fallback: bool = True, metadata: dict[str, str] | None = None):
    """x -> EPContext -> ... -> EPContext -> (Relu on the CPU) -> y. Each dict: the node's attributes, plus
    "name" (default ctx_<i>)."""
    graph_nodes, current = [], "x"
    for i, attrs in enumerate(nodes):
        attrs = dict(attrs)
        name = attrs.pop("name", f"ctx_{i}")
        out = f"t{i}"
        graph_nodes.append(
            helper.make_node("EPContext", [current], [out], name=name, domain="com.microsoft", **attrs)
        )
        current = out
    if fallback:
        graph_nodes.append(helper.make_node("Relu", [current], ["y"], name="relu"))
        graph_nodes.append(helper.make_node("Relu", ["y"], ["y2"], name="relu2"))
    outputs = ["y2"] if fallback else [current]
    graph = helper.make_graph(
        graph_nodes,
        "ctx",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [2, 3]) for o in outputs],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    helper.set_model_props(model, metadata or {})
    return model


def _epctx_binary(graph: str = "g0", *, sdk: str = "1.0", ep_name: str = EXAMPLE) -> bytes:
    writer = ContextBinaryWriter(ep_name=ep_name, sdk_version=sdk, hardware="cpu-x86_64", metadata={"k": "v"})
    writer.add(f"{graph}/plan", b"plan bytes", kind="graph")
    writer.add(f"{graph}/W", np.arange(12, dtype=np.float32), kind="weight", attrs={"dtype": "float32"})
    return writer.to_bytes()


def _save(tmp_path: Path, model: onnx.ModelProto, name: str = "model_ctx.onnx") -> Path:
    path = tmp_path / name
    onnx.save(model, path)
    return path


def _messages(report: Any, severity: str = "error") -> str:
    return "\n".join(f.message for f in report.findings if f.severity == severity)


# ----------------------------------------------------------------------------------------- epctx-made


def test_epctx_embed_mode_0(tmp_path: Path) -> None:
    (tmp_path / "model_Example.bin").write_bytes(_epctx_binary("g0"))
    attrs = dict(main_context=1, ep_cache_context="model_Example.bin", embed_mode=0, ep_sdk_version="1.0",
                 source=EXAMPLE, partition_name="g0", hardware_architecture="cpu-x86_64", my_ep_flag=7)  # fmt: skip
    path = _save(tmp_path, _ctx_model([attrs], metadata={f"ep_compatibility_info.{EXAMPLE}": "v1"}))
    report = inspect_model(path)

    assert report.findings == ()
    assert report.ep_compatibility_info == {EXAMPLE: "v1"}
    assert report.other_nodes == {"Relu": 2}
    (node,) = report.ep_context_nodes
    assert (node.name, node.source, node.graph, node.main_context, node.embed_mode) == (
        "ctx_0",
        EXAMPLE,
        "main",
        1,
        0,
    )
    assert node.attributes["ep_cache_context"] == "model_Example.bin"
    assert node.attributes["my_ep_flag"] == 7  # unknown attributes are listed too
    assert node.attributes["hardware_architecture"] == "cpu-x86_64"
    (file,) = report.binary_files
    assert file.status == "ok" and file.exists and file.nodes == ("ctx_0",)
    assert Path(file.path) == (tmp_path / "model_Example.bin").resolve()
    assert file.size == (tmp_path / "model_Example.bin").stat().st_size
    assert file.payload is not None and file.payload.format == FORMAT_EPCTX
    details = file.payload.details
    assert (details["ep_name"], details["sdk_version"], details["hardware"]) == (EXAMPLE, "1.0", "cpu-x86_64")
    assert details["metadata.k"] == "v"
    assert [(e.name, e.kind, e.size) for e in file.payload.entries] == [
        ("g0/plan", "graph", 10),
        ("g0/W", "weight", 48),
    ]
    assert json.loads(json.dumps(report.to_dict()))["binary_files"][0]["payload"]["format"] == FORMAT_EPCTX


def test_epctx_embed_mode_1_and_main_context_0(tmp_path: Path) -> None:
    writer = ContextBinaryWriter(ep_name=EXAMPLE, sdk_version="1.0")
    writer.add("g0/plan", b"a")
    writer.add("g1/plan", b"b")
    blob = writer.to_bytes()
    nodes = [
        dict(main_context=1, ep_cache_context=blob, embed_mode=1, source=EXAMPLE, partition_name="g0"),
        dict(main_context=0, source=EXAMPLE, partition_name="g1"),
    ]
    report = inspect_model(_save(tmp_path, _ctx_model(nodes)))
    assert report.findings == ()
    main, other = report.ep_context_nodes
    assert main.attributes["ep_cache_context"] == f"<{len(blob)} bytes embedded>"
    assert main.payload is not None and main.payload.format == FORMAT_EPCTX and main.payload.size == len(blob)
    assert [e.name for e in main.payload.entries] == ["g0/plan", "g1/plan"]
    assert other.main_context == 0 and other.payload is None and other.partition_name == "g1"
    assert report.binary_files == ()


def test_ep_context_in_a_subgraph(tmp_path: Path) -> None:
    inner = helper.make_graph(
        [
            helper.make_node(
                "EPContext",
                ["x"],
                ["z"],
                name="inner_ctx",
                domain="com.microsoft",
                source=EXAMPLE,
                ep_cache_context=_epctx_binary("inner_ctx"),
                embed_mode=1,
            )
        ],
        "then",
        [],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3])],
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["w"])],
        "else",
        [],
        [helper.make_tensor_value_info("w", TensorProto.FLOAT, [2, 3])],
    )
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], name="branch", then_branch=inner, else_branch=other)],
        "outer",
        [
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    report = inspect_model(_save(tmp_path, model))
    (node,) = report.ep_context_nodes
    assert node.graph == "main/branch.then_branch" and node.payload is not None
    assert node.payload.format == FORMAT_EPCTX
    assert report.other_nodes == {"If": 1, "Neg": 1}
    assert report.findings == ()


# ----------------------------------------------------------------------------------------- findings


def _file_node(reference: str, **extra: Any) -> dict[str, Any]:
    return dict(ep_cache_context=reference, embed_mode=0, source=EXAMPLE, partition_name="g0", **extra)


@pytest.mark.parametrize(
    ("reference", "status", "needle"),
    [
        ("missing.bin", "missing", "does not exist"),
        ("sub/../../outside.bin", "rejected", "leaves the model folder"),
        ("/etc/hostname", "rejected", "is absolute"),
        ("C:\\ctx\\model.bin", "rejected", "is absolute"),
    ],
)
def test_path_problems_are_findings(tmp_path: Path, reference: str, status: str, needle: str) -> None:
    model_dir = tmp_path / "models"
    model_dir.mkdir()
    (tmp_path / "outside.bin").write_bytes(_epctx_binary())
    report = inspect_model(_save(model_dir, _ctx_model([_file_node(reference)])))
    (file,) = report.binary_files
    assert file.status == status and file.payload is None and file.reference == reference
    assert needle in _messages(report)
    assert report.findings[0].node == "ctx_0" and report.findings[0].severity == "error"
    if reference.startswith("sub/"):
        assert Path(file.path) == (tmp_path / "outside.bin").resolve() and file.exists
        assert file.size == (tmp_path / "outside.bin").stat().st_size


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="no symlinks")
def test_escaping_symlink_is_a_finding(tmp_path: Path) -> None:
    model_dir = tmp_path / "models"
    model_dir.mkdir()
    (tmp_path / "outside.bin").write_bytes(_epctx_binary())
    os.symlink(tmp_path / "outside.bin", model_dir / "link.bin")
    report = inspect_model(_save(model_dir, _ctx_model([_file_node("link.bin")])))
    (file,) = report.binary_files
    assert file.status == "rejected" and file.payload is None
    assert "outside the model folder" in _messages(report)


def test_container_problems(tmp_path: Path) -> None:
    blob = bytearray(_epctx_binary("g0", sdk="2.0"))
    blob[-1] ^= 0xFF  # the last payload byte: caught by --verify only
    (tmp_path / "a.bin").write_bytes(bytes(blob))
    (tmp_path / "b.bin").write_bytes(b"EPCTXBIN" + b"\0" * 8)  # truncated container
    nodes = [
        dict(_file_node("a.bin", ep_sdk_version="1.0"), name="sdk_mismatch"),
        dict(_file_node("a.bin"), name="wrong_graph", partition_name="nope"),
        dict(_file_node("b.bin"), name="corrupt"),
        dict(main_context=0, source="OtherEP", partition_name="g9", name="orphan"),
        dict(ep_cache_context=b"x", embed_mode="1", source=EXAMPLE, name="bad_type"),
    ]
    report = inspect_model(_save(tmp_path, _ctx_model(nodes)))
    by_node: dict[str, str] = {}
    for f in report.findings:
        by_node[f.node or ""] = by_node.get(f.node or "", "") + f.message
    assert "ep_sdk_version '1.0' disagrees with its binary's '2.0'" in by_node["sdk_mismatch"]
    assert "holds no graph named 'nope'" in by_node["wrong_graph"]
    assert "truncated" in by_node["corrupt"]
    assert "no main context node has source 'OtherEP'" in by_node["orphan"]
    assert "'embed_mode' must be INT, not STRING" in by_node["bad_type"]
    assert "checksum" not in _messages(report)
    assert [f.path.endswith("a.bin") for f in report.binary_files] == [True, False]
    assert report.binary_files[0].nodes == ("sdk_mismatch", "wrong_graph")

    verified = inspect_model(tmp_path / "model_ctx.onnx", verify=True)
    assert "checksum mismatch" in _messages(verified)


def test_not_an_onnx_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "notes.onnx"
    bad.write_bytes(b"\xff\xfe this is not a protobuf \x00\x01")
    with pytest.raises(InvalidGraph, match="not an ONNX model"):
        inspect_model(bad)
    with pytest.raises(NoSuchFile):
        inspect_model(tmp_path / "nope.onnx")
    assert cli_main(["inspect", str(bad)]) == 1
    assert "epctx inspect: error:" in capsys.readouterr().err


def test_cli_text_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "model_Example.bin").write_bytes(_epctx_binary("g0"))
    nodes = [_file_node("model_Example.bin"), dict(_file_node("gone.bin"), name="ctx_missing")]
    path = _save(tmp_path, _ctx_model(nodes))
    assert cli_main(["inspect", str(path)]) == 0  # findings do not make it fail
    text = capsys.readouterr().out
    assert "EPContext nodes: 2" in text and "ep_cache_context  model_Example.bin" in text
    assert "epctx-container" in text and "g0/plan" in text and "Relu 2" in text
    assert "findings: 1" in text and "[ctx_missing]" in text
    assert cli_main(["inspect", "--json", str(path)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert sorted(data) == sorted(
        ["path", "ir_version", "producer", "opset_imports", "ep_compatibility_info", "ep_context_nodes",
         "binary_files", "other_nodes", "findings"]
    )  # fmt: skip
    assert [f["status"] for f in data["binary_files"]] == ["ok", "missing"]
    assert data["findings"][0]["node"] == "ctx_missing"


# ----------------------------------------------------------------------------------------- foreign formats


def test_openvino_blob_from_openvino(tmp_path: Path) -> None:
    ov = pytest.importorskip("openvino")
    from openvino import opset13 as ops

    param = ops.parameter([2, 3], np.float32, name="x")
    model = ov.Model([ops.relu(param)], [param], "g")
    blob = ov.Core().compile_model(model, "CPU").export_model().getvalue()
    (tmp_path / "model_ov.blob").write_bytes(blob)
    nodes = [
        dict(ep_cache_context=blob, embed_mode=1, source=OPENVINO, ep_sdk_version="2026.4", name="embedded"),
        dict(ep_cache_context="model_ov.blob", embed_mode=0, source=OPENVINO, name="in_file"),
    ]
    report = inspect_model(_save(tmp_path, _ctx_model(nodes)))
    assert report.findings == ()
    embedded, in_file = report.ep_context_nodes
    assert embedded.attributes["ep_cache_context"] == f"<{len(blob)} bytes embedded>"
    for payload in (embedded.payload, in_file.payload, report.binary_files[0].payload):
        assert payload is not None and payload.format == FORMAT_OPENVINO and payload.size == len(blob)
        assert payload.details.get("device") == "CPU"
        assert ov.__version__.startswith(payload.details["openvino_version"])


def _bson_doc(items: dict[str, Any]) -> bytes:
    body = b""
    for key, value in items.items():
        name = key.encode() + b"\0"
        if isinstance(value, dict):
            body += b"\x03" + name + _bson_doc(value)
        elif isinstance(value, str):
            raw = value.encode() + b"\0"
            body += b"\x02" + name + struct.pack("<i", len(raw)) + raw
        else:
            body += b"\x12" + name + struct.pack("<q", value)
    return struct.pack("<i", len(body) + 5) + body + b"\0"


def test_openvino_ep_bin_and_tensorrt_and_unknown() -> None:
    # Synthetic headers built from the layouts the format docs describe (no OpenVINO EP / TensorRT here).
    meta = _bson_doc({"version": "1.0.0", "producer": "onnxruntime-openvino-ep-1.24",
                      "blob_metadata_map": {"part0": {"data_offset": 65536, "size": 1000}}})  # fmt: skip
    ovep = struct.pack("<8sQQQQ", b"OVEP_BIN", 1, 40, 40, len(meta)) + meta
    payload, problems = detect_payload(ovep + bytes(65536 + 1000 - len(ovep) - len(meta)))
    assert problems == [] and payload.format == FORMAT_OPENVINO_BIN
    assert payload.details["metadata.producer"] == "onnxruntime-openvino-ep-1.24"
    assert [(e.name, e.size) for e in payload.entries] == [("part0", 1000)]
    broken, problems = detect_payload(struct.pack("<8sQQQQ", b"OVEP_BIN", 1, 40, 40, 10_000))
    assert broken.format == FORMAT_OPENVINO_BIN and "could not be read" in problems[0]

    engine, problems = detect_payload(b"ptrt" + struct.pack("<I", 0xEF) + bytes(64))
    assert engine.format == FORMAT_TENSORRT and engine.details["serialization_version"] == "0xef"
    preamble = b'{"trt": 1}'
    engine, _ = detect_payload(struct.pack("<I", len(preamble)) + preamble + b"ftrt" + bytes(16))
    assert engine.format == FORMAT_TENSORRT and engine.details["preamble_bytes"] == str(4 + len(preamble))

    assert detect_payload(b"\0" * 100)[0].format == FORMAT_UNKNOWN
    assert detect_payload(b"hello")[0] == detect_payload(bytearray(b"hello"))[0]


# ----------------------------------------------------------------------------------------- onnxruntime-qnn

_QNN_GENERATE = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    import onnxruntime as ort
    import onnxruntime_qnn

    out_dir, embed = sys.argv[1], sys.argv[2]
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4, 3, 3)).astype(np.float32), "W")
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("NonZero", ["r"], ["nz"]), helper.make_node("Cast", ["nz"], ["y"], to=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    src = os.path.join(out_dir, "model.onnx")
    onnx.save(model, src)
    ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    so = ort.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.context_embed_mode", embed)
    so.add_provider_for_devices(devices, {"backend_path": onnxruntime_qnn.get_qnn_htp_path()})
    ort.InferenceSession(src, so)
    print("onnxruntime", ort.__version__, "onnxruntime-qnn", onnxruntime_qnn.__version__)
    """
)


@pytest.fixture(scope="module")
def qnn_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Context models made by onnxruntime's QNN EP (HTP backend), embed modes 0 and 1, in a subprocess."""
    if importlib.util.find_spec("onnxruntime_qnn") is None:
        pytest.skip("onnxruntime-qnn is not installed (pip install onnxruntime-qnn)")
    made = {}
    for embed in ("0", "1"):
        out = tmp_path_factory.mktemp(f"qnn_embed{embed}")
        run = subprocess.run([sys.executable, "-c", _QNN_GENERATE, str(out), embed],
                             capture_output=True, text=True, timeout=600)  # fmt: skip
        ctx = out / "model_ctx.onnx"
        if run.returncode != 0 or not ctx.is_file():
            pytest.skip(f"onnxruntime-qnn could not generate a context model here: {run.stderr[-800:]}")
        made[embed] = ctx
    return made


@pytest.mark.slow
def test_qnn_embed_mode_0(qnn_models: dict[str, Path]) -> None:
    path = qnn_models["0"]
    report = inspect_model(path)
    assert report.errors == ()
    (node,) = report.ep_context_nodes
    assert node.source in ("QNN", "QNNExecutionProvider") and node.embed_mode == 0 and node.main_context == 1
    assert "is_multi_soc_ep_context" in node.attributes  # QNN's own attribute
    assert node.payload is not None and node.payload.format == FORMAT_QNN
    (file,) = report.binary_files
    assert file.reference == node.attributes["ep_cache_context"] and file.reference.endswith(".bin")
    assert file.status == "ok" and file.exists and Path(file.path).parent == path.parent.resolve()
    assert file.size == Path(file.path).stat().st_size == node.payload.size
    assert "QNNExecutionProvider" in report.ep_compatibility_info
    assert report.other_nodes.get("NonZero") == 1  # not supported by QNN: left for the CPU EP
    sdk = node.attributes.get("ep_sdk_version", "")
    assert node.payload.details.get("sdk_version", "") in sdk


def test_qnn_embed_mode_1(qnn_models: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    path = qnn_models["1"]
    report = inspect_model(path)
    assert report.errors == () and report.binary_files == ()
    (node,) = report.ep_context_nodes
    assert node.source in ("QNN", "QNNExecutionProvider") and node.embed_mode == 1
    assert node.payload is not None and node.payload.format == FORMAT_QNN
    assert node.attributes["ep_cache_context"] == f"<{node.payload.size} bytes embedded>"
    assert cli_main(["inspect", str(path)]) == 0
    assert "qnn-context-binary" in capsys.readouterr().out


def test_qnn_missing_binary(qnn_models: dict[str, Path], tmp_path: Path) -> None:
    model = onnx.load(qnn_models["0"])
    report = inspect_model(_save(tmp_path, model))  # copied without its .bin
    (file,) = report.binary_files
    assert file.status == "missing" and not file.exists
    assert "does not exist" in _messages(report)


def test_a_plugin_factory_recognises_its_own_payloads(tmp_path: Path) -> None:
    """A plugin library's factory (its optional ``detect_payload``) is asked by inspect with no edit elsewhere."""
    import epctx
    from epctx.providers.registry import payload_detectors

    library = Path(__file__).resolve().parents[1] / "fixtures" / "plugin_ep" / "plugin_ep.py"
    source = "ContosoExecutionProvider"
    model = _ctx_model([dict(ep_cache_context=b"CONTOSO1\x07rest", embed_mode=1, source=source),
                        dict(ep_cache_context=b"CONTOSO1", embed_mode=1, source=source, main_context=0)])  # fmt: skip
    path = _save(tmp_path, model)
    assert inspect_model(path).ep_context_nodes[0].payload.format == FORMAT_UNKNOWN
    epctx.register_execution_provider_library("contoso_inspect", str(library))
    try:
        assert payload_detectors(source)[0][0] == source
        report = inspect_model(path)
        good, short = (n.payload for n in report.ep_context_nodes)
        assert good.format == "contoso-blob" and good.details == {"version": "7"}
        assert short.format == "contoso-blob" and short.details == {}
        assert "contoso-blob header could not be read: no version byte" in _messages(report)
    finally:
        epctx.unregister_execution_provider_library("contoso_inspect")
    assert OPENVINO in [name for name, _ in payload_detectors()]  # the folder's EP_PAYLOADS


_ACME_INIT = """
EP_NAME = "AcmeExecutionProvider"
EP_CLASS = "epctx.providers.acme.provider:AcmeExecutionProvider"
EP_REQUIRES = ("acme_sdk_that_is_not_installed",)
EP_PAYLOADS = "epctx.providers.acme.payloads:detect"
"""
_ACME_PAYLOADS = """
from epctx.ep import PayloadInfo


def detect(data):
    head = bytes(data[:8])
    if head.startswith(b"ACMEBAD"):
        raise RuntimeError("acme detector bug")
    if head.startswith(b"ACME") or head == b"OVEP_BIN":  # an Acme format that shares OVEP_BIN's magic
        return PayloadInfo("acme-blob", {"rev": str(data[4])})
    return None
"""


@pytest.fixture
def acme_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A new EP folder, epctx/providers/acme/ (its backend not installed), and nothing else edited."""
    import epctx.providers
    from epctx.providers import registry

    folder = tmp_path / "folders" / "acme"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(_ACME_INIT)
    (folder / "payloads.py").write_text(_ACME_PAYLOADS)
    monkeypatch.setattr(epctx.providers, "__path__", [*epctx.providers.__path__, str(folder.parent)])
    registry.builtin_declarations.cache_clear()
    yield registry
    monkeypatch.undo()
    registry.builtin_declarations.cache_clear()
    for name in ("epctx.providers.acme.payloads", "epctx.providers.acme"):
        sys.modules.pop(name, None)


def test_a_new_ep_folder_recognises_its_own_payloads(
    acme_folder: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """EP_PAYLOADS in a new folder is used by inspect (library and CLI), the EP named by the node's source asked
    first; the declaration imports nothing and the detector needs no backend."""
    acme = "AcmeExecutionProvider"
    assert acme in [d.name for d in acme_folder.builtin_declarations()]
    assert "epctx.providers.acme.payloads" not in sys.modules  # loaded only when inspect asks
    assert acme not in acme_folder.available_providers()  # its SDK is missing; its payloads are still known

    meta = _bson_doc({"version": "1.0.0", "blob_metadata_map": {}})
    ovep = struct.pack("<8sQQQQ", b"OVEP_BIN", 1, 40, 40, len(meta)) + meta
    (tmp_path / "model_acme.bin").write_bytes(b"ACME\x03" + bytes(11))
    nodes = [
        dict(ep_cache_context=b"ACME\x02payload", embed_mode=1, source=acme, name="embedded"),
        dict(ep_cache_context="model_acme.bin", embed_mode=0, source=acme, name="in_file"),
        # Bytes two EPs claim: the node's source decides (acme's folder sorts before openvino's).
        dict(ep_cache_context=ovep, embed_mode=1, source=acme.lower(), name="acme_ovep"),
        dict(ep_cache_context=ovep, embed_mode=1, source=OPENVINO, name="ov_ovep"),
        dict(ep_cache_context=b"ACMEBAD!", embed_mode=1, source=acme, name="broken"),
    ]
    path = _save(tmp_path, _ctx_model(nodes))
    report = inspect_model(path)
    formats = {n.name: n.payload.format for n in report.ep_context_nodes if n.payload is not None}
    assert formats == {"embedded": "acme-blob", "in_file": "acme-blob", "acme_ovep": "acme-blob",
                       "ov_ovep": FORMAT_OPENVINO_BIN, "broken": FORMAT_UNKNOWN}  # fmt: skip
    assert report.ep_context_nodes[0].payload.details == {"rev": "2"}
    assert report.binary_files[0].payload.details == {"rev": "3"}
    (finding,) = report.errors
    assert finding.node == "broken"
    assert (
        finding.message
        == "the payload detector of AcmeExecutionProvider failed: RuntimeError: acme detector bug"
    )

    assert cli_main(["inspect", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [n["payload"]["format"] for n in data["ep_context_nodes"]] == list(formats.values())
    assert cli_main(["inspect", str(path)]) == 0
    assert "acme-blob" in capsys.readouterr().out
