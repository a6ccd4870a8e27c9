"""Every seed the project ships passes the static scan quietly (pytest_kscientist/harness/scan.py).

The scan's findings are warnings for a reviewer; a seed that raised one would teach users to
read past them, and the LLM writer copies its base's constructs into new candidates.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import REPO

from pytest_kscientist.harness.scan import scan_source

SEEDS = sorted((REPO / "tasks").glob("*/seeds/*.py"))


def test_there_are_seeds_to_scan() -> None:
    assert len(SEEDS) >= 5, SEEDS


@pytest.mark.parametrize("seed", SEEDS, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_seed_is_quiet_under_the_scan(seed: Path) -> None:
    assert scan_source(seed.read_text()) == []
