"""bench/accum_precision.py: its model of the two accumulation schemes (CPU, small shapes)."""

from __future__ import annotations

import importlib.util

from helpers import REPO


def load():
    spec = importlib.util.spec_from_file_location("accum_precision",
                                                  REPO / "bench" / "accum_precision.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_both_schemes_pass_and_truncation_only_costs_the_rescaled_one() -> None:
    accum = load()
    nearest = accum.run(32, 64, 1024, seed=3, truncate=False)
    truncated = accum.run(32, 64, 1024, seed=3, truncate=True)
    for result in (nearest, truncated):
        for worst, outside in result.values():
            assert 0.0 < worst < 0.5 and outside == 0, result
    # A fresh product per step is small, so toward-zero adds barely move it; the rescaled
    # accumulator carries the whole running sum through every add.
    assert truncated["product"][0] < 2 * nearest["product"][0] + 1e-3, (nearest, truncated)
    assert truncated["rescaled"][0] > nearest["rescaled"][0], (nearest, truncated)


def test_to_fp32_rounds_toward_zero_when_asked() -> None:
    import torch

    accum = load()
    x = torch.tensor([1.0 + 2.0 ** -30, -(1.0 + 2.0 ** -30), 1.0 - 2.0 ** -30],
                     dtype=torch.float64)
    assert accum.to_fp32(x, truncate=True).tolist() == [1.0, -1.0, 1.0 - 2.0 ** -24]
    assert accum.to_fp32(x, truncate=False).tolist() == [1.0, -1.0, 1.0]
