"""IREE's task workers get stacks for the largest stack allocation the EP lets a dispatch make (``provider.
STACK_LIMIT``, 256 KiB: ddddocr's YOLOX detector has a data-tiled dispatch of 198656 bytes; IREE's own worker stacks,
128 KiB, crashed the process (SIGSEGV) running it on two threads, and at the former 64 KiB limit the detector was
compiled untiled instead: 114 ms a run, not 63)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.requires import requires

pytestmark = requires("iree.runtime")


def test_the_workers_stacks_hold_the_stack_limit_twice() -> None:
    from epctx.providers.iree.provider import STACK_LIMIT
    from epctx.providers.iree.runtime import WORKER_STACK_BYTES

    limit = int(STACK_LIMIT.split("=", 1)[1])
    assert limit >= 198656  # the detector's dispatch
    assert 2 * limit <= WORKER_STACK_BYTES


@pytest.mark.parametrize("threads", [0, 2])
def test_a_task_driver_is_made_with_those_stacks(monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    from epctx.providers.iree import runtime
    from epctx.providers.iree.runtime_import import iree_runtime

    rt = iree_runtime()
    parsed: list[str] = []
    real_parse = rt.flags.parse_flags

    def parse(*flags: str) -> Any:
        parsed.extend(flags)
        return real_parse(*flags)

    monkeypatch.setattr(rt.flags, "parse_flags", parse)
    assert runtime._create_device(threads) is not None
    assert f"--task_worker_stack_size={runtime.WORKER_STACK_BYTES}" in parsed
    parsed.clear()
    assert runtime._create_device(1) is not None  # the caller's thread: no worker, no flag
    assert not any(flag.startswith("--task_worker_stack_size") for flag in parsed)
