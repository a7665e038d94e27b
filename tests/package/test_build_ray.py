"""The build on a real Ray cluster started here (ray.cluster_utils.Cluster: a head without CPUs and two worker
nodes of one CPU): the jobs spread over both nodes, the package is byte-identical to the local pool's, and a
node killed mid-build costs nothing but time (Ray runs its job again elsewhere; the package is complete and the
same). Skipped without Ray."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from epctx.farm.executors import LocalPool, RayExecutor
from epctx.farm.run import build
from epctx.package.tools import validate_package
from tests.package.test_build_iree import tree_digest, write_spec
from tests.requires import requires

pytestmark = [pytest.mark.slow, requires("ray", "iree.compiler", "torch")]
TARGETS = ("host", "x86-64-v2", "aarch64")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.workers = nodes  # type: ignore[attr-defined]
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import sys

    from tests.package.test_build_iree import ROOT

    sys.path.insert(0, str(ROOT))
    from benchmarks.llm_pair import export_pair

    folder = tmp_path_factory.mktemp("ray")
    prefill, _ = export_pair(folder, "tiny")
    return write_spec(folder, prefill, TARGETS)


@pytest.fixture(scope="module")
def local(spec: Path) -> dict[str, str]:
    build(spec, spec.parent / "local", LocalPool(2))
    return tree_digest(spec.parent / "local")


def test_jobs_spread_over_the_nodes_and_the_package_is_the_local_one(
    cluster: Any, spec: Path, local: dict[str, str]
) -> None:
    out = spec.parent / "on-ray"
    report = build(spec, out, RayExecutor(cluster.address), cache=spec.parent / "ray.jobs")
    nodes = {row.where.rsplit(":", 1)[-1] for row in report.rows}
    assert len(nodes) == 2, [row.where for row in report.rows]
    assert tree_digest(out) == local
    assert validate_package(out) == []


def test_a_node_killed_mid_build_leaves_a_complete_identical_package(
    cluster: Any, spec: Path, local: dict[str, str]
) -> None:
    """The node that returns the first job (the plain model's, instant) is killed at once: it has taken the next
    job by then, which Ray runs again on the other node."""
    by_id = {node.node_id[:8]: node for node in cluster.workers}  # type: ignore[attr-defined]
    killed: list[str] = []

    def progress(line: str) -> None:
        if line.startswith("[1/") and not killed:
            node_id = line.rsplit(":", 1)[-1]
            cluster.remove_node(by_id[node_id], allow_graceful=False)
            killed.append(node_id)

    out = spec.parent / "after-kill"
    report = build(
        spec, out, RayExecutor(cluster.address), cache=spec.parent / "kill.jobs", progress=progress
    )
    assert killed and len(report.rows) == len(TARGETS) + 1
    where = [row.where.rsplit(":", 1)[-1] for row in report.rows]
    assert where.count(killed[0]) == 1, where  # only the job it returned before it died
    assert tree_digest(out) == local
    assert validate_package(out) == []
