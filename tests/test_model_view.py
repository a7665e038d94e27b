"""One model view (issue 17): both load paths hand EPs values, nodes and attributes of the same protocols
(``epctx.model.view``), so the same EP code reads the same answers from either; mypy checks that the lean
reader's classes satisfy the protocols."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import onnx
import pytest

import epctx
import epctx.session.lean
from epctx.ep import Partition
from epctx.model.lean import read_context_model
from tests.epcontext.models import EXAMPLE, whole_model

IREE = "IREEExecutionProvider"


def _dims(shape: Any) -> list[object] | None:
    return None if shape is None else [d if isinstance(d, int) else ("sym", d.value) for d in shape]


def _read(partition: Partition) -> dict[str, Any]:
    """What an EP might read of the partition it loads, written once against the view protocols."""
    first = partition.inputs[0]
    return {
        "name": partition.name,
        "inputs": [(v.name, v.dtype, _dims(v.shape)) for v in partition.inputs],
        "outputs": [(v.name, v.dtype, _dims(v.shape)) for v in partition.outputs],
        "first_rank": None if first.shape is None else len(first.shape),
        "first_dim0": None if not first.shape else first.shape[0],
        "nodes": [
            (
                n.name,
                n.domain,
                n.op_type,
                [v.name if v is not None else None for v in n.inputs],
                [(v.name, (p := v.producer()) is not None and p.name) for v in n.outputs],
                {k: (int(a.type), a.value, a.ref_attr_name) for k, a in sorted(n.attributes.items())},
            )
            for n in partition.nodes
        ],
        "producers": [None if (p := v.producer()) is None else (p.name, p.op_type) for v in partition.inputs],
        "opsets": dict(partition.opset_imports),
    }


def _compile(model: onnx.ModelProto, folder: Path, ep: str, embed: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "model.onnx"
    onnx.save(model, source)
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.context_embed_mode", str(embed))
    epctx.InferenceSession(str(source), so, providers=[ep])
    return folder / "model_ctx.onnx"


def _seen(path: Path, ep: str, monkeypatch: pytest.MonkeyPatch, *, lean: bool) -> list[dict[str, Any]]:
    """What the EP's load_partition read of each partition, on the lean path or the full one."""
    seen: list[dict[str, Any]] = []
    with monkeypatch.context() as m:
        if not lean:
            m.setattr(epctx.session.lean, "read_context_model", lambda data: None)
        session = epctx.InferenceSession(str(path), providers=[ep])
        cls = type(next(p for p in session._providers if p.name == ep))
        original = cls.load_partition

        def load_partition(self: Any, source: Any, view: Any, partition: Partition) -> Any:
            seen.append(_read(partition))
            return original(self, source, view, partition)

        m.setattr(cls, "load_partition", load_partition)
        epctx.InferenceSession(str(path), providers=[ep])
    return seen


CASES = [
    ("example_whole_embed0", whole_model, EXAMPLE, 0),
    ("example_whole_embed1", whole_model, EXAMPLE, 1),
    pytest.param("iree_whole", whole_model, IREE, 0, marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("case", "make", "ep", "embed"), CASES)
def test_the_same_ep_code_reads_the_same_partition_on_both_load_paths(
    case: str, make: Any, ep: str, embed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if ep not in epctx.get_available_providers():
        pytest.skip(f"{ep} is not available")
    path = _compile(make(), tmp_path, ep, embed)
    assert read_context_model(path.read_bytes()) is not None  # the lean path takes it
    lean = _seen(path, ep, monkeypatch, lean=True)
    full = _seen(path, ep, monkeypatch, lean=False)
    assert lean, "the EP was asked to load nothing"
    assert lean == full
    assert all(v[1] for part in lean for v in part["inputs"]), "every partition input has a dtype"


# mypy over a module that assigns each lean class to its protocol (it must pass) and a class lacking a
# protocol's attribute (it must fail there, so the check is not vacuous).
_TYPING_CHECK = """
from epctx.model import lean, view

def check(v: lean.LeanValue, n: lean.LeanNode, a: lean.LeanAttribute, g: lean.LeanGraph,
          m: lean.LeanModel, d: lean.LeanDim) -> None:
    value: view.ValueView = v
    node: view.NodeView = n
    attr: view.AttrView = a
    graph: view.GraphView = g
    model: view.ModelView = m
    dim: view.DimView = d

class NoShape:
    name = "x"
    dtype = 1
    type = None
    const_value = None
    def producer(self) -> None: ...

wrong: view.ValueView = NoShape()  # line 20: the one error expected
"""


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed")
def test_mypy_checks_that_the_lean_classes_satisfy_the_view_protocols(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mypy import api

    source = tmp_path / "lean_view_check.py"
    source.write_text(_TYPING_CHECK)
    monkeypatch.setenv("MYPYPATH", str(Path(epctx.__file__).resolve().parents[1]))  # this tree's epctx
    options = ["--ignore-missing-imports", "--follow-imports=silent", "--python-version", "3.10"]
    stdout, stderr, _ = api.run([str(source), *options, "--cache-dir", str(tmp_path / "cache")])
    errors = [line for line in stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1, stdout + stderr
    assert f"{source.name}:20:" in errors[0] and "shape" in stdout, stdout
