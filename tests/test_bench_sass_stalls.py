"""bench/sass_stalls.py: stall reasons and instructions from ncu's source page (no GPU needed)."""

from __future__ import annotations

import pytest
from helpers import REPO, load_file

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)",
          "Warp Stall Sampling (Not-issued Samples)", "stall_long_sb", "stall_wait",
          "stall_long_sb (Not Issued)", "stall_wait (Not Issued)"]


def _module():
    return load_file(REPO / "bench" / "sass_stalls.py", "sass_stalls")


def _csv(tmp_path, rows):
    lines = ['"Kernel Name","void gemm_kernel<128>(...)",', ",".join(f'"{h}"' for h in HEADER)]
    lines += [",".join(f'"{v}"' for v in row) for row in rows]
    path = tmp_path / "rep.sass.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_shares_by_reason_and_the_instruction_that_waits(tmp_path, capsys):
    path = _csv(tmp_path, [
        ["0x7f00b0", "  LDG.E.CONSTANT R190, desc[UR28][R180.64]", *"10 10 0 10 0 10".split()],
        ["0x7f00c0", "  FMUL R190, R193, R190", *"75 70 70 5 70 0".split()],
        ["0x7f00d0", "  HGMMA.64x128x16.F32 R24, R88, gdesc[UR4], RZ", *"15 5 0 15 0 5".split()],
    ])
    _module().main([str(path), "--top", "2"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "100 samples"
    assert out[1].split() == ["long_sb", "70.0%"] and out[2].split() == ["wait", "30.0%"]
    top = [line for line in out if "%" in line and "R" in line]
    assert len(top) == 2  # --top 2: the FMUL (75) and the HGMMA (15), not the load (10)
    assert "FMUL R190" in top[0] and "75.0%" in top[0] and "long_sb:70 wait:5" in top[0]
    assert "HGMMA" in top[1] and "15.0%" in top[1]


def test_a_report_without_stall_sampling_is_named(tmp_path):
    path = tmp_path / "raw.csv"
    path.write_text('"ID","Kernel Name","dram__bytes.sum"\n"0","k","12"\n')
    with pytest.raises(SystemExit, match="--section SourceCounters"):
        _module().main([str(path)])
