"""Compile the Triton seed for sm_90 on a machine without a GPU and say what the code does.

    python bench/triton_compile_check.py [SEED.py] [KNOB=VALUE ...]

Builds the kernel with the specialisations a GPU launch of the task's inputs gets (16-byte
aligned pointers, strides and sizes divisible by 16, the unit strides of the chosen layout as
constants) and prints: shared memory, the number of wgmma / mma.sync / cp.async / TMA
instructions, the wgmma.wait_group depths, local-memory traffic (spills) and the widths of the
global loads. Reading these costs no device time (METHOD.md: "read what costs no device time").
The installed Triton may differ from the GPU machine's (3.9 here, 3.6 there on 2026-11-29).
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from collections import Counter
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

ROOT = Path(__file__).resolve().parent.parent
SEED = ROOT / "tasks" / "fp8_gemm" / "seeds" / "triton_blockscaled.py"
H200_SMEM = 232448  # shared_memory_per_block_optin of an H100/H200
INTS = ["M", "N", "K", "stride_am", "stride_ak", "stride_bn", "stride_bk", "stride_sam",
        "stride_sak", "stride_sbn", "stride_sbk", "stride_os", "stride_om", "stride_on"]


def load(path: Path, changes: dict[str, object]):
    spec = importlib.util.spec_from_file_location("seed_under_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    unknown = set(changes) - set(module.TUNABLES)
    if unknown:
        sys.exit(f"{path.name} has no knob {sorted(unknown)[0]}; its knobs: "
                 f"{', '.join(module.TUNABLES)}")
    module.TUNABLES.update(changes)
    return module


def main(argv: list[str]) -> None:
    args = list(argv)
    path = Path(args.pop(0)) if args and "=" not in args[0] else SEED
    changes: dict[str, object] = {}
    for item in args:
        name, _, raw = item.partition("=")
        try:
            changes[name] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            changes[name] = raw  # a bare word: LAYOUT=direct
    module = load(path, changes)
    cfg = module.TUNABLES
    fn = module._fp8_block_scaled_gemm
    kmajor = cfg["LAYOUT"].endswith("kmajor")
    element = "fp16" if cfg["LAYOUT"].startswith("fp16") else "fp8e4nv"
    signature = {name: "constexpr" for name in fn.arg_names}
    signature.update({"a_ptr": f"*{element}", "b_ptr": f"*{element}", "sa_ptr": "*fp32",
                      "sb_ptr": "*fp32", "out_ptr": "*bf16"})
    signature.update({name: "i32" for name in INTS})
    consts = {name: cfg[name] for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K")}
    consts.update(EVEN_K=True, SCALE_BLOCK=module.SCALE_BLOCK)
    # the unit strides: column-major A [m,k] and B [n,k] unless copied K-major; scales and C
    for name in ("stride_ak", "stride_bk") if kmajor else ("stride_am", "stride_bn"):
        consts[name] = 1
    consts.update(stride_sam=1, stride_sbn=1, stride_on=1)
    extra = {k: cfg[k] for k in cfg if k in fn.arg_names and k not in consts}
    consts.update(extra)
    divisible = [n for n in ("a_ptr", "b_ptr", "sa_ptr", "sb_ptr", "out_ptr", *INTS)
                 if n not in consts]
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    for name in consts:
        signature[name] = "constexpr"
    source = ASTSource(fn=fn, signature=signature,
                       constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()},
                       attrs=attrs)
    stages = module.fitting_stages(cfg, H200_SMEM) if hasattr(module, "fitting_stages") else (
        cfg["num_stages"])
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": cfg["num_warps"], "num_stages": stages})
    ptx = kernel.asm["ptx"]
    loads = Counter(re.findall(r"ld\.global(?:\.[a-z0-9]+)*", ptx))
    waits = sorted(set(re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+)", ptx)))
    async_copies = len(re.findall(r"cp\.async\.c[ag]", ptx))
    spills = len(re.findall(r"(?:ld|st)\.local", ptx))
    print(f"{path.name} {cfg} (triton {triton.__version__}, sm_90)")
    fits = "fits" if kernel.metadata.shared <= H200_SMEM else "DOES NOT FIT"
    print(f"num_stages used: {stages}; shared memory: {kernel.metadata.shared} B ({fits} in "
          f"the H200's {H200_SMEM})")
    print(f"wgmma.mma_async: {ptx.count('wgmma.mma_async')}, wait_group depths: {waits}")
    print(f"mma.sync: {ptx.count('mma.sync')}, cp.async: {async_copies}, "
          f"TMA: {ptx.count('cp.async.bulk.tensor')}, local (spill) ld/st: {spills}")
    print("global loads: " + ", ".join(f"{k} x{v}" for k, v in sorted(loads.items())))


if __name__ == "__main__":
    main(sys.argv[1:])
