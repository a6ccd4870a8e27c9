"""Run the HIP seed's portable form on an NVIDIA GPU against the task's reference (issue 14).

tasks/fp8_gemm/seeds/hip_mfma.py compiled for anything but gfx942 replaces its MFMA by a
software emulation with the instruction's lane layout and decodes e4m3fn or e4m3fnuz bytes
itself; its includes take CUDA's runtime when not under hipcc. This script compiles that same
source with load_inline (nvcc) at several knob points and checks every test case of a profile
with the task's tolerance: on the task's e4m3fn inputs, and on the same values as e4m3fnuz
bytes. It checks staging, fragment gathering, the C layout, per-block scaling, edges and
rounding on a real GPU; not the MFMA instruction, and not speed (the emulation is slow).

Device call (repository root, no wheels needed; ~1-2 min per knob point for nvcc):
    python3 bench/hip_seed_portable.py --profile full > $OUT/hip_seed_portable.txt 2>&1
Prints one line per (knob point, case, format); exits 1 if any case misses the tolerance.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pytest_kscientist.api import read_hip_source, rewrite_tunables  # noqa: E402

TASK = REPO / "tasks" / "fp8_gemm"
SEED = TASK / "seeds" / "hip_mfma.py"
KNOB_POINTS = [
    {},  # the seed's own TUNABLES
    {"BLOCK_M": 32, "BLOCK_N": 128, "WAVES_M": 4, "WAVES_N": 1, "LDS_PAD": 0},
    {"BLOCK_M": 128, "BLOCK_N": 32, "WAVES_M": 1, "WAVES_N": 2, "LDS_PAD": 16},
]


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cpp_wrapper(text: str) -> str:
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "CPP_WRAPPER" for t in node.targets):
            return ast.literal_eval(node.value)
    raise SystemExit(f"{SEED}: no CPP_WRAPPER literal")


def build(knobs: dict, scratch: Path):
    """The seed's source at ``knobs``, built for this CUDA GPU by load_inline (nvcc)."""
    from torch.utils.cpp_extension import load_inline

    text = SEED.read_text()
    text = rewrite_tunables(text, knobs) if knobs else text
    copy = scratch / "hip_mfma.py"
    copy.write_text(text)
    source = read_hip_source(copy)
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    return load_inline(name=f"ks_hip_portable_{digest}", cpp_sources=[_cpp_wrapper(text)],
                       cuda_sources=[c.text for c in source.chunks], functions=["fp8_gemm"],
                       extra_cuda_cflags=source.flags, verbose=False)


def main() -> int:
    import tempfile

    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="full", help="the task's profile (full or cpu)")
    args = parser.parse_args()
    if not torch.cuda.is_available() or torch.version.hip is not None:
        raise SystemExit("hip_seed_portable.py needs an NVIDIA GPU (CUDA torch)")
    ref = _module(TASK / "reference.py", "fp8_gemm_reference")
    import tomllib

    spec = tomllib.loads((TASK / "task.toml").read_text())
    atol, rtol = spec["check"]["atol"], spec["check"]["rtol"]
    cases = spec["profiles"][args.profile]["tests"]
    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__}; "
          f"{len(cases)} cases of profile {args.profile}; atol {atol} rtol {rtol}")
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for knobs in KNOB_POINTS:
            start = time.perf_counter()
            module = build(knobs, Path(tmp))
            label = ",".join(f"{k}={v}" for k, v in knobs.items()) or "seed TUNABLES"
            print(f"[{label}] built in {time.perf_counter() - start:.1f} s")
            for case in cases:
                a, b, a_scale, b_scale, c = ref.generate_input(**case, device="cuda")
                expected = ref.ref_kernel((a, b, a_scale, b_scale, c)).float()
                fnuz = (a.float().to(torch.float8_e4m3fnuz).T.contiguous().T,
                        b.float().to(torch.float8_e4m3fnuz).T.contiguous().T)
                for form, (fa, fb, flag) in {"e4m3fn": (a, b, 0),
                                             "e4m3fnuz": (*fnuz, 1)}.items():
                    out = torch.full_like(c, float("nan"))
                    module.fp8_gemm(fa, fb, a_scale, b_scale, out, flag)
                    torch.cuda.synchronize()
                    close = torch.isclose(out.float(), expected, atol=atol, rtol=rtol)
                    bad = int((~close).sum())
                    failures += bad > 0
                    err = (out.float() - expected).abs().nan_to_num(float("inf")).max().item()
                    print(f"[{label}] {case} {form}: "
                          f"{'ok' if bad == 0 else f'{bad} of {close.numel()} elements off'}"
                          f" (max abs error {err:.3g})")
    print(f"{failures} case(s) missed the tolerance")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
