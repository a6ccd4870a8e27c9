"""Which layout of B's block scales does this torch's ``torch._scaled_mm`` take, per shape?

    python bench/cublas_scales_probe.py

The cuBLAS baselines (tasks/fp8_gemm/baselines/cublas_blockscaled.py) pad B's scales when
k/128 % 4 != 0. On the H200 (2026-11-29, torch 2.11+cu130) a form worked at m=1024 and m=6144
with k=256 and at m=128 with k=2304, but m=96, k=256 raised "Invalid scaling configuration"
(with a form kept from k=128, see the baselines' comment). This tries each form on such shapes
and prints, per shape and form, "ok" with the worst error against the reference in units of the
task's tolerance, or the full error message.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
TASK = ROOT / "tasks" / "fp8_gemm"
SHAPES = [(64, 64, 128), (96, 7168, 256), (128, 7168, 256), (1024, 7168, 256), (96, 7168, 2304),
          (128, 7168, 2304), (96, 7168, 2048), (64, 512, 384), (100, 7168, 256)]


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU of compute capability 9.0 or newer (block-scaled fp8 cuBLAS)")
    ref = load("reference", TASK / "reference.py")
    base = load("cublas", TASK / "baselines" / "cublas_blockscaled.py")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for m, n, k in SHAPES:
        a, b, a_scale, b_scale, c = ref.generate_input(m, n, k, 7, device="cuda")
        expected = ref.ref_kernel((a, b, a_scale, b_scale, c)).float()
        for form in ("plain", *base._FORMS):
            if form == "plain":
                args = (a.contiguous(), b.contiguous().T, a_scale.T.contiguous().T,
                        b_scale.contiguous().T)
            else:
                args = base._operands(a.contiguous(), b.contiguous().T,
                                      a_scale.T.contiguous().T, b_scale, form)
            try:
                out = torch._scaled_mm(*args, out_dtype=torch.bfloat16).float()
                worst = ((out - expected).abs() / (1e-3 + 2e-2 * expected.abs())).max().item()
                verdict = f"ok, worst {worst:.2f}x tolerance"
            except Exception as exc:  # the message is the finding
                verdict = f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
            print(f"m{m}-n{n}-k{k} {form}: {verdict}", flush=True)


if __name__ == "__main__":
    main()
