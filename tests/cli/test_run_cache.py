"""``epctx run MODEL -C KEY=VALUE``: session config entries; with the transparent cache (or a context written
beside the model) the compile shows the per-partition progress lines of ``epctx compile`` on stderr."""

from __future__ import annotations

import re
from pathlib import Path

from epctx.cache.store import ContextCache
from tests.cli.helpers import Cli, assert_one_error_line
from tests.epcontext.models import EXAMPLE

_PARTITION_LINE = re.compile(r"^epctx: compiled partition (\d)/2 \S+ \(\d+ nodes\) on " + EXAMPLE, re.M)


def _partition_lines(err: str) -> list[str]:
    return [m.group(1) for m in _PARTITION_LINE.finditer(err)]


def test_run_with_the_cache_shows_the_compile_progress_then_loads(model: Path, cli: Cli) -> None:
    cache = model.parent / "cache"
    compiled = cli("compile", model, "-p", EXAMPLE, "-o", model.parent / "c_ctx.onnx")
    assert _partition_lines(compiled.err) == ["1", "2"]  # what `epctx compile` shows
    first = cli("run", model, "-p", EXAMPLE, "--random", "--dim", "N=3", "-C", f"epctx.context_cache={cache}")
    assert first.status == 0, first
    assert _partition_lines(first.err) == ["1", "2"]
    assert "epctx: epctx.context_cache: key " in first.err and "compiled and cached generation" in first.err
    assert len(ContextCache(cache).entries()) == 1
    second = cli(
        "run", model, "-p", EXAMPLE, "--random", "--dim", "N=3", "-C", f"epctx.context_cache={cache}"
    )
    assert second.status == 0 and _partition_lines(second.err) == []
    assert "loading" in second.err
    assert second.out.splitlines()[2:] == first.out.splitlines()[2:]  # the same outputs (not the timings)
    quiet = cli(
        "run",
        model,
        "-p",
        EXAMPLE,
        "--random",
        "--dim",
        "N=3",
        "-q",
        "-C",
        f"epctx.context_cache={model.parent / 'c2'}",
    )
    assert quiet.status == 0 and quiet.err == ""


def test_run_with_context_reuse_and_plain_run_stay_quiet(model: Path, cli: Cli) -> None:
    reuse = ["-C", "ep.context_enable=1", "-C", "epctx.context_reuse=1"]
    first = cli("run", model, "-p", EXAMPLE, "--random", "--dim", "N=3", *reuse)
    assert first.status == 0 and _partition_lines(first.err) == ["1", "2"]
    assert model.with_name("model_ctx.onnx").is_file()
    second = cli("run", model, "-p", EXAMPLE, "--random", "--dim", "N=3", *reuse)
    assert (
        second.status == 0
        and _partition_lines(second.err) == []
        and "epctx.context_reuse: loading" in second.err
    )
    plain = cli("run", model, "-p", EXAMPLE, "--random", "--dim", "N=3")
    assert plain.status == 0 and plain.err == ""  # no -C: no progress lines, as before


def test_run_config_errors(model: Path, cli: Cli) -> None:
    assert_one_error_line(cli("run", model, "--random", "-C", "epctx.context_cache"), 2, "-C expects")
    unknown = cli("run", model, "--random", "-C", "epctx.context_cach=x")
    assert unknown.status != 0 and "did you mean 'epctx.context_cache'" in unknown.err
