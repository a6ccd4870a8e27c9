"""bench/cuda_sass.py's reading of ptxas and cuobjdump (no GPU, no nvcc needed): the main loop
is the one that holds the HGMMA, counted from its branch's target to the branch, and what a
tile runs after it up to the first branch, its register moves counted; kernels are
named by their template arguments; ptxas's registers, spills and C75xx remarks land on the
kernel they belong to; missing tools are named with the wheels that bring them."""

from __future__ import annotations

import pytest
from helpers import REPO, load_file

SASS = """
        Function : _Z11gemm_kernelILi128ELi1EEv14CUtensorMap_st
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_TID.X ;
        /*0020*/                   PRMT R2, R3, 0x20, RZ ;
        /*0030*/                   F2FP.F16.E4M3.UNPACK_B R4, R2 ;
        /*0040*/                   @P2 BAR.SYNC.DEFER_BLOCKING R12, 0x100 ;
        /*0050*/                   R2UR UR22, R5 ;
        /*0060*/                   HGMMA.64x128x16.F32 R24, R88, gdesc[UR20], RZ, !UPT ;
        /*0070*/                   HGMMA.64x128x16.F32 R24, R92, gdesc[UR20], R24, gsb0 ;
        /*0080*/                   @!P3 BRA 0x0200 ;
        /*0090*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*00a0*/                   FFMA R176, R24, R202, R176 ;
        /*00b0*/                   FFMA R177, R25, R202, R177 ;
        /*00c0*/                   @!P3 BRA 0x0020 ;
        /*00d0*/                   EXIT ;
        Function : _Z13upcast_kernelILb1EEv4Cast
        /*0000*/                   EXIT ;
"""
GEMM = "_Z11gemm_kernelILi128ELi1EEv14CUtensorMap_st"
REPORT = "\n".join([
    f"ptxas info    : Compiling entry function '{GEMM}' for 'sm_90a'",
    f"ptxas info    : Function properties for {GEMM}",
    "    0 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads",
    "ptxas info    : Used 168 registers, used 16 barriers",
    "ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are "
    "serialized due to non wgmma instructions reading accumulator registers of  a wgmma between "
    f"start and end of the pipeline stage in the function '{GEMM}'",
    "ptxas info    : Compiling entry function '_Z13upcast_kernelILb1EEv4Cast' for 'sm_90a'",
    "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads",
    "ptxas info    : Used 59 registers, used 0 barriers",
])


def _module():
    return load_file(REPO / "bench" / "cuda_sass.py", "cuda_sass")


def test_the_main_loop_is_the_one_that_holds_the_mma_counted_by_kind() -> None:
    sass = _module()
    found = sass.kernels(SASS)
    assert set(found) == {"_Z11gemm_kernelILi128ELi1EEv14CUtensorMap_st",
                          "_Z13upcast_kernelILb1EEv4Cast"}
    loop = sass.main_loop(found["_Z11gemm_kernelILi128ELi1EEv14CUtensorMap_st"])
    # from 0x0020 (the backward branch's target) to that branch: the forward branch inside
    # the loop does not end it
    assert [line.split("*/")[0].strip() for line in (loop[0], loop[-1])] == ["/*0020", "/*00c0"]
    counts = sass.census(loop)
    assert (len(loop), counts["HGMMA"], counts["FFMA"], counts["PRMT"], counts["F2FP"],
            counts["R2UR"], counts["BAR"], counts["WARPGROUP.DEPBAR"]) == (11, 2, 2, 1, 1, 1,
                                                                           1, 1)
    assert sass.main_loop(found["_Z13upcast_kernelILb1EEv4Cast"]) == []


def test_a_step_does_not_count_the_previous_tiles_epilogue_it_skips() -> None:
    loop = [line for line in """
        /*0100*/                   HGMMA.64x128x16.F32 R24, R88, gdesc[UR20], RZ, !UPT, gsb0 ;
        /*0110*/                   @!P0 BRA 0x0150 ;
        /*0120*/                   F2FP.BF16.F32.PACK_AB R216, R153, R152 ;
        /*0130*/                   STS [R3], R216 ;
        /*0140*/                   UTMASTG.2D [UR4], [UR6] ;
        /*0150*/                   @!P1 BRA 0x0170 ;
        /*0160*/                   F2FP.F16.E4M3.UNPACK_B R4, R2 ;
        /*0170*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0180*/                   @!P3 BRA 0x0100 ;
    """.splitlines() if "/*" in line]
    kept = _module().once_a_tile_dropped(loop)
    # the block with C's bf16 packing goes; the other skipped block (no F2FP.BF16) stays
    assert [line.split("*/")[0].strip() for line in kept] == [
        "/*0100", "/*0110", "/*0150", "/*0160", "/*0170", "/*0180"]


def test_after_the_loop_runs_to_the_first_branch_and_counts_the_register_moves() -> None:
    """What a tile runs after its last K step, to the first branch (one with a predicate
    operand too), the loop's own branch included; its register-to-register moves counted (a
    move of a constant or of a uniform register is not a copy)."""
    lines = [line for line in """
        /*0000*/                   HGMMA.64x128x16.F32 R24, R88, gdesc[UR20], RZ, !UPT, gsb0 ;
        /*0010*/                   FFMA R176, R24, R202, R176 ;
        /*0020*/                   @P1 BRA 0x0000 ;
        /*0030*/                   ISETP.GE.AND P3, PT, R11, UR18, PT ;
        /*0040*/                   IMAD.MOV.U32 R14, RZ, RZ, R179 ;
        /*0050*/                   MOV R15, R178 ;
        /*0060*/                   IMAD.MOV.U32 R16, RZ, RZ, 0x1 ;
        /*0070*/                   MOV R17, UR4 ;
        /*0080*/                   @P1 BRA P3, 0x0200 ;
        /*0090*/                   IMAD.MOV.U32 R18, RZ, RZ, R177 ;
        /*00a0*/                   EXIT ;
    """.splitlines() if "/*" in line]
    sass = _module()
    after = sass.after_loop(lines)
    assert [line.split("*/")[0].strip() for line in (after[0], after[-1])] == ["/*0030",
                                                                              "/*0080"]
    assert len(after) == 6 and sass.moves(after) == 2
    assert sass.after_loop(lines[3:]) == []  # no loop: nothing after it


def test_kernels_are_named_by_their_template_arguments() -> None:
    sass = _module()
    assert sass.label("_Z11gemm_kernelILi128ELi1EEv14CUtensorMap_st") == "gemm_kernel<128, 1>"
    assert sass.label("_Z13upcast_kernelILb1EEv4Cast") == "upcast_kernel<true>"
    assert sass.label("_Z5plainv") == "plain"  # no template arguments: its name alone
    assert sass.label("not_mangled") == "not_mangled"


def test_ptxas_figures_and_remarks_land_on_their_kernel() -> None:
    rows = _module().ptxas_rows(REPORT)
    gemm = rows["_Z11gemm_kernelILi128ELi1EEv14CUtensorMap_st"]
    assert (gemm["registers"], gemm["spills"], gemm["remarks"]) == (168, 20, {"C7514"})
    upcast = rows["_Z13upcast_kernelILb1EEv4Cast"]
    assert (upcast["registers"], upcast["spills"], upcast["remarks"]) == (59, 0, set())
    table = _module().table("seed.py", REPORT, SASS)
    assert table[0] == "seed.py:" and len(table) == 4  # the GEMM alone, under its header
    # 11 instructions a step, the loop's top at 0x20 (32 bytes into its 128-byte line), the
    # EXIT alone after it
    assert table[3].startswith(
        "| gemm_kernel<128, 1> | 168 | 20 | C7514 | 11 | 0x20 (+32) | 1 (0) | 2 |")
    assert len(table[1].split("|")) == len(table[2].split("|")) == len(table[3].split("|"))
    assert _module().loop_at([]) == "-"


def test_missing_tools_are_named_with_the_wheels_that_bring_them(monkeypatch) -> None:
    sass = _module()
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(sass.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SystemExit, match="nvcc, cuobjdump, nvdisasm not found.*pip install "
                                         "nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm"):
        sass.tool_path()
