"""The kernel index (``epctx.providers.cpu.kernel_index``) names, for every op, the module that registers its
kernel: the CPU EP imports kernel modules one by one through it, so a stale index would lose a kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from epctx.providers.cpu import registry
from epctx.providers.cpu.kernel_index import KERNEL_MODULES, MS_KERNEL_MODULES, module_for
from epctx.providers.cpu.kernels import load_all


def test_the_index_names_the_module_of_every_registered_kernel() -> None:
    load_all()
    registered = {
        (domain, op): {factory.__module__ for _, factory in entries}
        for (domain, op), entries in registry._REGISTRY.items()
    }
    for (domain, op), modules in registered.items():
        assert modules == {module_for(domain, op)}, (
            f"{op}: registered by {modules}, indexed {module_for(domain, op)}"
        )
    indexed = {(("", op)) for ops in KERNEL_MODULES.values() for op in ops}
    indexed |= {("com.microsoft", op) for ops in MS_KERNEL_MODULES.values() for op in ops}
    assert indexed == set(registered)


@pytest.mark.slow
def test_a_session_imports_only_the_kernel_modules_of_its_ops() -> None:
    script = """
import json, sys
import numpy as np
import onnx
from onnx import TensorProto, helper
import epctx
graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
out = epctx.InferenceSession(model.SerializeToString()).run(None, {"x": np.array([-1, 2], np.float32)})[0]
print(json.dumps([out.tolist(), sorted(m for m in sys.modules if m.startswith("epctx.providers.cpu.kernels."))]))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out, modules = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == [0.0, 2.0]
    assert modules == ["epctx.providers.cpu.kernels.elementwise", "epctx.providers.cpu.kernels.erf"]
