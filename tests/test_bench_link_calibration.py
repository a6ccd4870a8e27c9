"""bench/link_calibration.py: the A/A groups inside knob moves' links, counted both ways."""

from __future__ import annotations

import math

import pytest
from helpers import REPO, load_file
from test_evolve_links import SEED, SMALL_MOVE, member

calibration = load_file(REPO / "bench" / "link_calibration.py", "link_calibration")


def kept_at(ratios: list[tuple[float, float]]) -> dict[str, tuple[float, float, float]]:
    """Per benchmark (ratio, low, high): the small class (n < 2048, moved by SMALL_MOVE) at 1.05
    [1.04-1.06]; the four others, at the parent's point, at the given (ratio, half width)."""
    out = {"n256-s0": (1.05, 1.04, 1.06), "n1024-s1": (1.05, 1.04, 1.06)}
    for i, (r, w) in enumerate(ratios):
        out[f"n{[4096, 8192, 16384, 32768][i]}-s{i + 2}"] = (r, r - w, r + w)
    return out


def test_only_the_benchmarks_a_move_left_at_the_parents_point_are_counted() -> None:
    members = [member("c0001", SEED),
               member("c0002", SMALL_MOVE, "c0001", kept_at([(1.03, 0.02)] * 4))]
    found, outside, total = calibration.groups(members)
    assert (outside, total) == (4, 4)  # the four kept benchmarks; the two moved are not A/A
    (group,) = found
    # four benchmarks at log(1.03), each error (log(1.05) - log(1.01)) / 3.92
    error = (math.log(1.05) - math.log(1.01)) / (2 * 1.96)
    assert group.n == 4
    assert group.z_together == pytest.approx(math.log(1.03) / error)
    assert group.z_independent == pytest.approx(math.log(1.03) / (error / 2))  # sqrt(4) / 4
    lines = calibration.report(found, outside, total)
    assert lines[0].endswith("4 of 4 (100.0%)")
    assert lines[-1] == ("children beyond |z| 1.96: 1 of 1 with the errors together, 1 of 1 "
                         "taken as independent")


def test_errors_that_cancel_are_beyond_neither_way() -> None:
    ratios = [(1.01, 0.02), (0.99, 0.02), (1.0, 0.02), (1.0, 0.02)]
    members = [member("c0001", SEED), member("c0002", SMALL_MOVE, "c0001", kept_at(ratios))]
    found, outside, total = calibration.groups(members)
    assert (outside, total) == (0, 4)
    assert abs(found[0].z_together) < 0.1 and abs(found[0].z_independent) < 0.1
    assert calibration.report(found, outside, total)[-1].startswith(
        "children beyond |z| 1.96: 0 of 1 with the errors together, 0 of 1")


def test_a_child_of_other_code_or_a_seed_is_no_group() -> None:
    other = SMALL_MOVE.replace("return data, tunables_for", "return data[::-1], tunables_for")
    members = [member("c0001", SEED),
               member("c0002", other, "c0001", kept_at([(1.03, 0.02)] * 4))]
    assert calibration.groups(members) == ([], 0, 0)
