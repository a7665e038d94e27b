"""enable_profiling on a two-EP model (Example EP partitions + CPU nodes): the trace is valid JSON in
onnxruntime's event schema, with one event per partition compile / context load and per plan step per run."""

from __future__ import annotations

import json

import numpy as np
import onnx

import epctx
from tests.epcontext.models import EXAMPLE, feed, two_partition_model
from tests.oracle import run_ort

KEYS = {"cat", "pid", "tid", "dur", "ts", "ph", "name", "args"}


def _profiled(path, monkeypatch, tmp_path, **config):
    monkeypatch.chdir(tmp_path)
    so = epctx.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = "trace"
    for key, value in config.items():
        so.add_session_config_entry(key, value)
    return epctx.InferenceSession(str(path), so, providers=[EXAMPLE, "CPUExecutionProvider"])


def _events(path):
    with open(path) as f:
        events = json.load(f)
    assert events and all(set(e) == KEYS and e["ph"] == "X" for e in events)
    assert all(isinstance(e["ts"], int) and isinstance(e["dur"], int) and e["dur"] >= 0 for e in events)
    return events


def test_trace_of_a_compiled_two_ep_model(tmp_path, monkeypatch):
    model = two_partition_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    sess = _profiled(path, monkeypatch, tmp_path)
    steps = sess.get_partitions()
    assert {ep for ep, _ in steps} == {EXAMPLE, "CPUExecutionProvider"}
    for _ in range(2):
        out = sess.run(None, feed())
    np.testing.assert_allclose(out[0], run_ort(model, feed())[0], rtol=1e-5, atol=1e-5)
    events = _events(sess.end_profiling())
    compiles = [e for e in events if e["name"].endswith("_compile")]
    assert len(compiles) == sum(ep == EXAMPLE for ep, _ in steps) == 2
    assert {e["args"]["provider"] for e in compiles} == {EXAMPLE}
    node_events = [e for e in events if e["cat"] == "Node"]
    assert len(node_events) == 2 * len(steps)  # one per plan step per run
    assert [e["args"]["provider"] for e in node_events[: len(steps)]] == [ep for ep, _ in steps]
    assert sum(e["name"] == "model_run" for e in events) == 2
    assert {"session_initialization", "model_loading_uri"} <= {e["name"] for e in events}
    assert sess.end_profiling() == ""  # profiling ended


def test_trace_of_a_context_model_has_one_load_event_per_partition(tmp_path, monkeypatch):
    path = tmp_path / "m.onnx"
    onnx.save(two_partition_model(), path)
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    epctx.InferenceSession(str(path), so, providers=[EXAMPLE, "CPUExecutionProvider"])
    sess = _profiled(tmp_path / "m_ctx.onnx", monkeypatch, tmp_path)
    sess.run(None, feed())
    events = _events(sess.end_profiling())
    loads = [e for e in events if e["name"].endswith("_context_load")]
    assert len(loads) == 2 and {e["args"]["provider"] for e in loads} == {EXAMPLE}
    assert not [e for e in events if e["name"].endswith("_compile")]
    node_events = [e for e in events if e["cat"] == "Node"]
    assert len(node_events) == len(sess.get_partitions())
    assert sum(e["args"]["op_name"] == "EPContext" for e in node_events) == 2


def test_profiling_off_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "m.onnx"
    onnx.save(two_partition_model(), path)
    sess = epctx.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    sess.run(None, feed())
    assert sess.end_profiling() == ""
    assert sess.get_profiling_start_time_ns() == 0
    assert list(tmp_path.glob("*.json")) == []
