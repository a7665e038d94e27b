"""The conformance suite's machinery: generating and loading context models with the EP under test, comparing
with onnxruntime, fresh processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from epctx import options as opt
from epctx.errors import EPCtxError, InvalidGraph, ModelRequiresCompilation
from epctx.session.compile_guard import NO_COMPILE_ENV, no_compile
from epctx.testing.conformance import models

if TYPE_CHECKING:
    import onnx

    from epctx.session import InferenceSession
from epctx.testing.conformance.context_files import (
    attr,
    ctx_nodes,
    reason,
)
from epctx.testing.conformance.results import CaseFailed, CaseResult, Generated, Record, expect

__all__ = ["Suite"]

MEASURED_RULE = "epctx.partition.measured_rule"  # off in the suite's sessions (``Suite._session``)


class Suite:
    def __init__(
        self,
        ep_name: str,
        ep_options: dict[str, str],
        tmp: Path,
        atol: float,
        rtol: float,
        case_options: Mapping[str, Mapping[str, str]],
        setup: str,
    ) -> None:
        self.ep = ep_name
        self.ep_options = ep_options
        self.tmp = tmp
        self.atol = atol
        self.rtol = rtol
        self.case_options = case_options
        self.setup = setup
        self._base: dict[str, Generated] = {}
        self._oracle: dict[str, list[np.ndarray]] = {}
        self.case = ""

    # -- running a case ------------------------------------------------------------------------------------
    def run_case(self, case: str, body: Callable[[Suite, Record], None]) -> CaseResult:
        self.case = case
        record = Record()
        try:
            body(self, record)
            passed, detail = True, "; ".join(record.notes)
        except CaseFailed as exc:
            passed, detail = False, str(exc)
        except Exception as exc:  # an EP's or epctx's error where the case expected none
            passed, detail = False, f"{type(exc).__name__}: {exc}"
        return CaseResult(
            case=case,
            passed=passed,
            delegated_nodes=tuple(record.delegated),
            total_nodes=record.total,
            max_error=max(record.errors) if record.errors else None,
            detail=detail,
        )

    def folder(self, name: str) -> Path:
        path = self.tmp / self.case / name
        path.mkdir(parents=True, exist_ok=False)
        return path

    def options(self) -> dict[str, str]:
        return {**self.ep_options, **self.case_options.get(self.case, {})}

    def session(self, source: Path | bytes, *, load: bool = False, **config: str) -> InferenceSession:
        """A session on the EP under test (then the CPU EP). ``load``: inside no_compile(). Config keys are
        written with ``__`` for ``.``: ``ep__context_enable="1"``."""
        return self._session(source, load, config)

    def _session(self, source: Path | bytes, load: bool, config: Mapping[str, str]) -> InferenceSession:
        from epctx.session import InferenceSession

        so = opt.SessionOptions()
        # what the EP computes and how the graph is split, not its speed: the measured rule (on by default) would
        # hand a partition slower than the CPU EP back (a numpy EP's, on a loaded machine) and the partitioning
        # cases would read that as the EP's doing; a case may turn it on
        so.add_session_config_entry(MEASURED_RULE, "0")
        for key, value in config.items():
            so.add_session_config_entry(key.replace("__", "."), value)
        data = source if isinstance(source, bytes) else str(source)
        providers: list[Any] = [(self.ep, self.options())]
        if not load:
            return InferenceSession(data, so, providers=providers)
        with no_compile():
            return InferenceSession(data, so, providers=providers)

    def oracle(self, key: str, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        if key not in self._oracle:
            import onnxruntime as ort

            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            self._oracle[key] = [np.asarray(v) for v in sess.run(None, dict(feeds))]
        return self._oracle[key]

    def compare(self, record: Record, ours: Sequence[Any], expected: Sequence[np.ndarray], what: str) -> None:
        expect(len(ours) == len(expected), f"{what}: {len(ours)} outputs, onnxruntime gives {len(expected)}")
        for k, (a, b) in enumerate(zip(ours, expected)):
            a = np.asarray(a)
            expect(a.dtype == b.dtype and a.shape == b.shape,
                    f"{what}: output {k} is {a.dtype}{list(a.shape)}, onnxruntime's {b.dtype}{list(b.shape)}")  # fmt: skip
            error = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0
            record.errors.append(error)
            ok = np.allclose(a, b, atol=self.atol, rtol=self.rtol) and not np.isnan(a).any()
            expect(bool(ok), f"{what}: output {k} differs from onnxruntime by up to {error:.3g}")

    def generate(
        self,
        record: Record,
        folder: Path,
        stem: str,
        model: onnx.ModelProto,
        feeds: Mapping[str, np.ndarray] | None = None,
        **config: str,
    ) -> Generated:
        """Save ``model`` as ``folder/stem.onnx`` and run a generating session on it; returns its context model
        (written later by a sharing group's last session)."""
        import onnx

        source = folder / f"{stem}.onnx"
        onnx.save(model, source)
        sess = self._session(source, False, {"ep__context_enable": "1", **config})
        delegated = tuple(n for ep, names in sess.get_partitions() if ep == self.ep for n in names)
        total = len(model.graph.node)
        record.delegated.extend(delegated)
        record.total += total
        expect(bool(delegated), f"{self.ep} took none of the {total} nodes of {stem}.onnx: nothing to cache")
        ctx = folder / f"{stem}_ctx.onnx"
        if "ep__share_ep_contexts" not in config:
            expect(ctx.is_file(), f"no context model {ctx.name} was written")
        output = np.asarray(sess.run(None, dict(feeds or models.feeds()))[0])
        return Generated(folder, ctx, source, delegated, total, output)

    def base(self, record: Record, key: str, seed: int = 0) -> Generated:
        """A context model of ``models.chain(seed)`` (embed mode 0) made once per run; cases copy it."""
        if key not in self._base:
            folder = self.tmp / "_base" / key
            folder.mkdir(parents=True)
            self._base[key] = self.generate(Record(), folder, "model", models.chain(seed))
        made = self._base[key]
        record.delegated.extend(made.delegated)
        record.total += made.total
        return made

    def copy_base(self, record: Record, key: str = "chain0", seed: int = 0) -> tuple[Path, Path]:
        """A private copy of a base context model folder: (context model, its binary)."""
        made = self.base(record, key, seed)
        folder = self.tmp / self.case / key
        shutil.copytree(made.folder, folder)
        ctx = folder / made.ctx.name
        nodes = ctx_nodes(ctx)
        expect(bool(nodes), f"{ctx.name} has no EPContext node")
        path = attr(nodes[0], "ep_cache_context")
        expect(isinstance(path, bytes) and attr(nodes[0], "embed_mode") == 0, "expected an embed_mode=0 node")
        return ctx, folder / bytes(path).decode()

    def expect_invalid_graph(self, record: Record, ctx: Path, what: str) -> None:
        """Loading ``ctx`` (or running it) must be InvalidGraph: never an output, never another error."""
        feeds = models.feeds()
        try:
            sess = self.session(ctx, load=True)
            outputs = sess.run(None, feeds)
        except InvalidGraph as exc:
            record.notes.append(f"InvalidGraph: {reason(exc)}")
            return
        except ModelRequiresCompilation as exc:
            raise CaseFailed(f"{what}: the session tried to compile instead of refusing: {exc}") from None
        except EPCtxError as exc:
            raise CaseFailed(f"{what}: expected InvalidGraph, got {type(exc).__name__}: {exc}") from None
        expected = self.oracle("chain0", models.chain(0), feeds)
        error = float(np.max(np.abs(np.asarray(outputs[0]) - expected[0])))
        raise CaseFailed(f"{what}: loaded and ran (max error {error:.3g}) instead of raising InvalidGraph")

    def fresh_process(self, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Run ``jobs`` in a new interpreter with EPCTX_NO_COMPILE=1: each loads ``model``, runs it on
        ``models.feeds()`` and saves output 0 to ``out``, or reports the epctx error it raised."""
        folder = self.folder("fresh_process")
        np.save(folder / "x.npy", models.feeds()["x"])
        spec = {"ep": self.ep, "options": self.options(), "setup": self.setup, "x": str(folder / "x.npy"),
                "jobs": jobs, "report": str(folder / "report.json")}  # fmt: skip
        env = {**os.environ, NO_COMPILE_ENV: "1"}
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, json.dumps(spec)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        expect(done.returncode == 0, f"fresh process failed (exit {done.returncode}): {done.stderr[-2000:]}")
        report: list[dict[str, Any]] = json.loads((folder / "report.json").read_text(encoding="utf-8"))
        return report


_CHILD = """
import json, sys
import numpy as np
spec = json.loads(sys.argv[1])
exec(spec["setup"])
from epctx.errors import EPCtxError
from epctx.session import InferenceSession
report = []
for job in spec["jobs"]:
    try:
        sess = InferenceSession(job["model"], providers=[(spec["ep"], spec["options"])])
        np.save(job["out"], sess.run(None, {"x": np.load(spec["x"])})[0])
        report.append({"ok": True})
    except EPCtxError as exc:
        report.append({"ok": False, "error": type(exc).__name__, "message": str(exc)})
with open(spec["report"], "w") as fh:
    json.dump(report, fh)
"""
