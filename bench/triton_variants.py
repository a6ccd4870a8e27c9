"""Write knob variants of the Triton seed into a folder, for one benchmark run on a GPU.

    python bench/triton_variants.py OUTDIR
prints the --kernel flags of the files it wrote.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pytest_kscientist.evolve.knobs import rewrite_tunables

SEED = Path(__file__).parent.parent / "tasks" / "fp8_gemm" / "seeds" / "triton_blockscaled.py"
VARIANTS = {
    "tr_kmajor_128x128": {},
    "tr_direct_128x128": {"LAYOUT": "direct"},
    "tr_kmajor_128x256": {"BLOCK_N": 256, "num_warps": 8, "num_stages": 3},
    "tr_direct_64x128": {"LAYOUT": "direct", "BLOCK_M": 64, "num_warps": 4, "num_stages": 4},
}


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    source = SEED.read_text()
    for name, changes in VARIANTS.items():
        (out / f"{name}.py").write_text(rewrite_tunables(source, changes) if changes else source)
        sys.stdout.write(f" --kernel {out / name}.py")
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
