"""ep.share_ep_contexts / ep.stop_share_ep_contexts through ``epctx share``: N models -> N+1 files, identical
weights stored once. Sharing sessions opening the binary once is a case of the conformance suite
(tests/test_conformance.py, ``weight_sharing``), run on every compiling EP."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import epctx
from epctx.cli import main as cli_main
from epctx.epcontext import ContextBinary
from epctx.testing import no_compile
from tests.epcontext.models import EXAMPLE, feed, two_partition_model
from tests.oracle import run_ort


def _variant(seed: int) -> onnx.ModelProto:
    """Same W1 in every variant (shared weights), the other weights differ."""
    model = two_partition_model(seed)
    base = two_partition_model(0)
    for init in model.graph.initializer:
        if init.name == "W1":
            init.CopyFrom(next(i for i in base.graph.initializer if i.name == "W1"))
    return model


def test_share_generates_n_plus_one_files_with_weights_stored_once(tmp_path):
    paths = []
    for k in range(3):
        path = tmp_path / f"m{k}.onnx"
        onnx.save(_variant(k), path)
        paths.append(path)
    assert cli_main(["share", "-p", EXAMPLE, *map(str, paths)]) == 0
    produced = {p.name for p in tmp_path.iterdir()} - {p.name for p in paths}
    assert produced == {"m0_ctx.onnx", "m1_ctx.onnx", "m2_ctx.onnx", f"m0_{EXAMPLE}.bin"}
    with ContextBinary.open(tmp_path / f"m0_{EXAMPLE}.bin") as binary:
        offsets = {}
        for name in binary.names():
            info = binary.entry(name)
            offsets.setdefault((info.offset, info.size), []).append(name)
        # W1 (8x16 float32 = 512 bytes) appears in the three models' graphs but is stored once.
        shared = [names for (_, size), names in offsets.items() if size == 512 and len(names) == 3]
        assert shared, offsets
    for k, path in enumerate(paths):
        with no_compile():
            sess = epctx.InferenceSession(str(path.with_name(f"m{k}_ctx.onnx")), providers=[EXAMPLE])
        np.testing.assert_allclose(sess.run(None, feed())[0], run_ort(_variant(k), feed())[0], atol=1e-5)


def test_share_with_embed_mode_is_rejected(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(two_partition_model(), path)
    so = epctx.SessionOptions()
    for key, value in (
        ("ep.context_enable", "1"),
        ("ep.context_embed_mode", "1"),
        ("ep.share_ep_contexts", "1"),
    ):
        so.add_session_config_entry(key, value)
    with pytest.raises(epctx.InvalidArgument, match="embed_mode=0"):
        epctx.InferenceSession(str(path), so, providers=[EXAMPLE])
