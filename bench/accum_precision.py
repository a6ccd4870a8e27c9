"""How far two ways of accumulating fp8_gemm's scaled K steps sit from the task's tolerance (CPU).

    python3 bench/accum_precision.py [--m 256 --n 512 --k 7168 --seeds 1 2]

Each 128-wide K step's product is formed exactly (float64 sums of e4m3 products) in k16 chunks
added into fp32, then scaled by the step's a_scale * b_scale:
- ``product``: a fresh fp32 product per step, added to the accumulator times its scale (the CUDA
  seed as committed);
- ``rescaled``: one accumulator in units of the last step's scale, multiplied by old units over
  new before each step's chunks are added (notes/fp8_gemm_h200.md, "The rescaled accumulator").
Each chunk add is rounded to nearest, or toward zero with ``--truncate`` (a pessimistic model of a
tensor core's adder). Printed: the worst |error| / (atol + rtol |exact|) and the elements outside
the check after rounding to bf16, per scheme and seed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tasks" / "fp8_gemm"))
from reference import generate_input  # noqa: E402  (after the path)

ATOL, RTOL = 1e-3, 2e-2


def to_fp32(x: torch.Tensor, truncate: bool) -> torch.Tensor:
    """float64 -> float32, to nearest or toward zero."""
    f = x.float()
    if truncate:
        over = f.double().abs() > x.abs()
        f = torch.where(over, torch.nextafter(f, torch.zeros_like(f)), f)
    return f


def run(m: int, n: int, k: int, seed: int, truncate: bool) -> dict[str, tuple[float, int]]:
    a, b, a_scale, b_scale, _ = generate_input(m, n, k, seed)
    a64, b64 = a.double(), b.double()
    b_rows = b_scale.repeat_interleave(128, 0)[:n]
    exact = torch.zeros(m, n, dtype=torch.float64)
    product_sum = torch.zeros(m, n)
    rescaled, units = torch.zeros(m, n), torch.ones(m, n)
    for step in range(-(-k // 128)):
        scale = (a_scale[:, step, None] * b_rows[None, :, step]).float()
        if step:
            rescaled = rescaled * (units / scale)
        product = torch.zeros(m, n)
        block = slice(step * 128, min(k, step * 128 + 128))
        exact += (a64[:, block] @ b64[:, block].T) * scale.double()
        for lo in range(step * 128, min(k, step * 128 + 128), 16):
            chunk = a64[:, lo:lo + 16] @ b64[:, lo:lo + 16].T
            product = to_fp32(product.double() + chunk, truncate)
            rescaled = to_fp32(rescaled.double() + chunk, truncate)
        units = scale
        product_sum = product_sum + product * scale
    out = {}
    tolerance = ATOL + RTOL * exact.abs()
    exact_bf16 = exact.to(torch.bfloat16).double()
    for name, value in (("product", product_sum), ("rescaled", rescaled * units)):
        worst = ((value.double() - exact).abs() / tolerance).max().item()
        outside = ((value.bfloat16().double() - exact_bf16).abs()
                   > ATOL + RTOL * exact_bf16.abs()).sum().item()
        out[name] = (worst, outside)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", type=int, default=256)
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--k", type=int, default=7168)
    parser.add_argument("--seeds", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--truncate", action="store_true",
                        help="chunk adds rounded toward zero instead of to nearest")
    args = parser.parse_args()
    print("| seed | scheme | worst error / tolerance | outside after bf16 |\n|---|---|---|---|")
    for seed in args.seeds:
        for name, (worst, outside) in run(args.m, args.n, args.k, seed, args.truncate).items():
            print(f"| {seed} | {name} | {worst:.3f} | {outside} |")


if __name__ == "__main__":
    main()
