"""IREE's capability groups (issue 17) on PP-OCRv4's recognizer (rapidocr_onnxruntime, 1x3x48x320, onnx shape
inference), with the example EP ahead of IREE taking the nodes of ``--ops`` (default Relu: the two in its
squeeze-and-excitation blocks, mid-backbone):

    python benchmarks/bench_iree_groups.py [--ops Relu] [--baseline]

Prints, for one session: whether it was created (the error otherwise), its creation time, IREE's capability
time and the compiles it made (node counts, seconds, from the log), the groups IREE returned, the nodes it
declined, the partitions per EP, and how many partitions IREE's compile had to compile afresh (0: every one
was compiled by the capability check). ``--baseline`` reads only what the first contract offered (a tree
without ``Capability.groups``: run it with that tree's ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import time
from pathlib import Path
from typing import Any

import onnx

EP = "IREEExecutionProvider"


class _Log(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        compiled = "capability check" in message and ("compiled in" in message or "failed" in message)
        if compiled or "capability:" in message:
            self.lines.append(message)


def _recognizer() -> onnx.ModelProto:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("rapidocr_onnxruntime is not installed")
    model = onnx.load(Path(next(iter(spec.submodule_search_locations))) / "models/ch_PP-OCRv4_rec_infer.onnx")
    for dim, size in zip(model.graph.input[0].type.tensor_type.shape.dim, (1, 3, 48, 320)):
        dim.Clear()
        dim.dim_value = size
    return onnx.shape_inference.infer_shapes(model)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ops", default="Relu", help="op types the example EP ahead of IREE takes")
    parser.add_argument("--baseline", action="store_true", help="a tree without Capability.groups")
    args = parser.parse_args()

    import epctx
    from epctx.errors import EPCtxError
    from epctx.providers.iree import compile as iree_compile
    from epctx.providers.iree import probing as probing  # bound to the real compile before the count below
    from epctx.providers.iree.provider import IREEExecutionProvider

    log = _Log()
    logging.getLogger("epctx").addHandler(log)
    logging.getLogger("epctx").setLevel(logging.INFO)
    capabilities: list[Any] = []
    fresh: list[int] = []
    check, compile_fresh = IREEExecutionProvider.get_capability, iree_compile.compile_partitions

    def get_capability(self: Any, *a: Any) -> Any:
        capabilities.append(check(self, *a))
        return capabilities[-1]

    def count(partitions: Any, *a: Any, **k: Any) -> Any:
        fresh.append(len(partitions))
        return compile_fresh(partitions, *a, **k)

    IREEExecutionProvider.get_capability = get_capability  # type: ignore[method-assign]
    iree_compile.compile_partitions = count
    model = _recognizer().SerializeToString()
    started = time.perf_counter()
    try:
        sess = epctx.InferenceSession(model, providers=[("ExampleExecutionProvider", {"ops": args.ops}), EP])
    except EPCtxError as exc:
        print(f"session: failed after {time.perf_counter() - started:.1f} s: {str(exc)[:300]}")
        sess = None
    else:
        print(f"session: created in {time.perf_counter() - started:.1f} s")
    print("\n".join(f"  log: {line[:160]}" for line in log.lines))
    if capabilities:
        cap = capabilities[-1]
        groups = [len(g) for g in getattr(cap, "groups", ())]
        print(
            f"IREE capability: {len(cap.claimed)} flat node(s), groups {groups}, {len(cap.declined)} declined"
        )
    if sess is not None:
        print(
            "partitions:",
            [(ep, len(names)) for ep, names in sess.get_partitions() if ep != "CPUExecutionProvider"],
        )
        print("partitions IREE's compile compiled afresh:", sum(fresh))
    print("baseline tree" if args.baseline else "this tree")


if __name__ == "__main__":
    main()
