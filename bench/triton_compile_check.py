"""Compile the Triton seed for sm_90 on a machine without a GPU and say what the code does.

    python bench/triton_compile_check.py [SEED.py] [KNOB=VALUE ...]

Builds the kernel with the specialisations a GPU launch of the task's inputs gets (16-byte
aligned pointers, strides and sizes divisible by 16, the unit strides of the chosen layout as
constants) and prints: shared memory, the number of wgmma / mma.sync / cp.async / TMA
instructions, the wgmma.wait_group depths, local-memory traffic, the widths of the global loads
and the registers and stack (spills) per thread that ptxas gave it. A seed with a ``plan()``
(triton_fused.py) names the constexprs it launches with for the largest benchmark shape.
Reading these costs no device time (METHOD.md: "read what costs no device time").
The installed Triton may differ from the GPU machine's (3.9 here, 3.6 there on 2026-11-29).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

ROOT = Path(__file__).resolve().parent.parent
SEED = ROOT / "tasks" / "fp8_gemm" / "seeds" / "triton_blockscaled.py"
H200_SMEM = 232448  # shared_memory_per_block_optin of an H100/H200
H200_SMS = 132
SHAPE = (6144, 4608, 7168)  # m, n, k of the largest benchmark, for a seed's plan()


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
    kmajor = cfg["LAYOUT"].endswith("kmajor")  # "fused" reads fp8 in the task's layout
    element = "fp16" if cfg["LAYOUT"].startswith("fp16") else "fp8e4nv"
    a_name, b_name = fn.arg_names[:2]  # a_ptr, b_ptr (triton_fused: a_src, b_src)
    signature = {name: "constexpr" for name in fn.arg_names}
    # the kernel's B operand in fp16: upcast first (b16, or A as the kernel's B for a16)
    b_element = "fp16" if cfg["LAYOUT"] in ("b16", "a16") else element
    a_scale, b_scale = fn.arg_names[2:4]  # sa_ptr, sb_ptr (triton_fused: rs_ptr, cs_ptr)
    pointers = {a_name: f"*{element}", b_name: f"*{b_element}", a_scale: "*fp32",
                b_scale: "*fp32", "out_ptr": "*bf16"}
    signature.update(pointers)
    # M, N, K and the strides (triton_fused: its programs too)
    ints = [p.name for p in fn.params if not p.is_constexpr and p.name not in pointers]
    signature.update({name: "i32" for name in ints})
    if hasattr(module, "plan"):  # the seed says which constexprs it launches with (triton_fused)
        _, _, consts = module.plan(cfg, *SHAPE, H200_SMS, cfg.get("TMA", False))
        if consts["TMA"]:  # descriptors of A^T [k,m] and B^T [k,n]
            for name, block, elem in ((a_name, consts["BLOCK_M"], element),
                                      (b_name, consts["BLOCK_N"], b_element)):
                signature[name] = f"tensordesc<{elem}[{consts['BLOCK_K']},{block}]>"
    else:
        consts = {name: cfg[name] for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M",
                                               "SPLIT_K")}
        consts.update(EVEN_K=True, SCALE_BLOCK=module.SCALE_BLOCK)
    # the unit strides: column-major A [m,k] and B [n,k] unless copied K-major; scales and C
    units = ["stride_ak", "stride_bk"] if kmajor else ["stride_am", "stride_bn"]
    # C's unit stride (a launch specialises an int equal to 1): its rows', for a16's C^T tiles
    units.append("stride_om" if cfg["LAYOUT"] == "a16" else "stride_on")
    for name in units + ["stride_sam", "stride_sbn"]:
        if name in fn.arg_names:  # (triton_fused: column-major operands, no stride args)
            consts[name] = 1
    extra = {k: cfg[k] for k in cfg if k in fn.arg_names and k not in consts}
    consts.update(extra)
    divisible = [n for n in (a_name, b_name, a_scale, b_scale, "out_ptr", *ints)
                 if n not in consts and signature[n][0] in "*i"]
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
    if os.environ.get("KS_DUMP"):  # KS_DUMP=DIR: the TTGIR and PTX written there
        for ext in ("ttgir", "ptx"):
            Path(os.environ["KS_DUMP"], f"kernel.{ext}").write_text(kernel.asm[ext])
    ws = ptx.count("setmaxnreg")
    if ws:
        print(f"warp-specialised: {ws} setmaxnreg")
    loads = Counter(re.findall(r"ld\.global(?:\.[a-z0-9]+)*", ptx))
    waits = sorted(set(re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+)", ptx)))
    async_copies = len(re.findall(r"cp\.async\.c[ag]", ptx))
    spills = len(re.findall(r"(?:ld|st)\.local", ptx))
    print(f"{path.name} {cfg} (triton {triton.__version__}, sm_90)")
    fits = "fits" if kernel.metadata.shared <= H200_SMEM else "DOES NOT FIT"
    print(f"num_stages used: {stages}; shared memory: {kernel.metadata.shared} B ({fits} in "
          f"the H200's {H200_SMEM})")
    print(f"wgmma.mma_async: {ptx.count('wgmma.mma_async')}, wait_group depths: {waits}")
    first = re.search(r"wgmma\.mma_async[^;]*;", ptx, re.S)
    # the A operand is a brace list of registers, or a 64-bit shared memory descriptor
    a_from = "registers" if first and re.search(r"\}\s*,\s*\{", first.group(0)) else "shared"
    print(f"wgmma A operand from: {a_from}" + (f" ({first.group(0).split()[0]})" if first else ""))
    print(f"mma.sync: {ptx.count('mma.sync')}, cp.async: {async_copies}, "
          f"TMA: {ptx.count('cp.async.bulk.tensor')}, local (spill) ld/st: {spills}")
    print("global loads: " + ", ".join(f"{k} x{v}" for k, v in sorted(loads.items())))
    print(f"registers per thread, stack (spills): {resources(kernel.asm['cubin'])}")


def resources(cubin: bytes) -> str:
    """REG and STACK of the compiled kernel, as cuobjdump (shipped with Triton) reads them.

    ptxas spills do not show as ld/st.local in the PTX: a 128x256 fp16 tile with two products
    in flight compiled to 255 registers and a 1280-byte stack with none there."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return "unknown (no cuobjdump beside Triton)"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True,
                              text=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", text)
    return f"{found.group(1)} registers, {found.group(2)} B stack" if found else "unknown"


if __name__ == "__main__":
    main(sys.argv[1:])
