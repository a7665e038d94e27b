"""``epctx cache list|prune|clear FOLDER``: the transparent cache's folder."""

from __future__ import annotations

from pathlib import Path

import onnx

import epctx
from epctx.cache.store import ContextCache
from tests.cli.helpers import Cli
from tests.epcontext.models import EXAMPLE, two_partition_model


def _session(src: Path, cache: Path, **ep_options: str) -> None:
    so = epctx.SessionOptions()
    so.add_session_config_entry("epctx.context_cache", str(cache))
    epctx.InferenceSession(str(src), so, providers=[(EXAMPLE, ep_options)])


def _keys(cache: Path) -> set[str]:
    return {e.key for e in ContextCache(cache).entries()}


def test_the_cache_verb(tmp_path: Path, cli: Cli) -> None:
    src, cache = tmp_path / "model.onnx", tmp_path / "cache"
    onnx.save(two_partition_model(), src)
    _session(src, cache)
    _session(src, cache, ops="MatMul,Relu")
    listed = cli("cache", "list", cache, "--json")
    assert listed.status == 0 and len(listed.json()) == 2
    assert all(row["current"] and row["bytes"] > 0 for row in listed.json())
    (cache / next(iter(_keys(cache))) / "g1-1").mkdir()  # a killed writer's generation
    pruned = cli("cache", "prune", cache, "--json").json()["removed"]
    assert len(pruned) == 1 and pruned[0].endswith("/g1-1")
    oldest = min(listed.json(), key=lambda row: row["last_used"])["key"]
    biggest = max(row["bytes"] for row in listed.json())
    assert cli("cache", "prune", cache, "--max-mb", str(biggest / 1e6)).status == 0
    assert _keys(cache) == {row["key"] for row in listed.json()} - {oldest}
    assert cli("cache", "clear", cache).status == 0 and _keys(cache) == set()
    assert cli("cache", "list", tmp_path / "nowhere").status == 1
    assert cli("cache", "list", cache, "--max-mb", "3").status == 1
