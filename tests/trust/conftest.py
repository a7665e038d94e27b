from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _own_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Verification records go to the test's folder, never to the user's cache."""
    monkeypatch.setenv("EPCTX_TRUST_RECORDS", str(tmp_path / "records"))
