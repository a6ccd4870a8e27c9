#!/usr/bin/env bash
# Variants of the CUDA seed (bench/cuda_sweep.py's VARIANTS) on one sm_90 GPU, in one device call
# (issue 33; notes/fp8_gemm_h200.md):
#   device call (repository root, carry [".whl"], timeout_s 600):
#     bash bench/variants_device.sh NAME [NAME ...]
# Name `control` too (the seed's source under another build name): a row that differs from the
# seed only by its build says what the build and the rows' order move alone (on one H100,
# 2026-12-07: nothing beyond the noise, 1.002x, 0.971-1.032).
# A name not in VARIANTS is refused before the device setup. In order, each under its own limit:
#   (a) each variant written as a kernel file of its own build name           -> $OUT/kernels/
#   (b) bench/cuda_sweep.py --variants NAME...: every variant checked (the task's tests and
#       benchmarks, odd shapes, C filled with NaN first), then the plain loop and the launches'
#       durations beside the seed                                        -> $OUT/sweep.log
#   (c) the harness: the seed and every variant in the same rounds  -> $OUT/harness.log, .json
#   (d) the harness's per-shape table (bench/summarize.py)                           -> printed
#   (e) each variant but `control` in the seed's place under the seed's build name: the seed's
#       own GPU test, what adopting it needs (seed_test_as)        -> $OUT/seed_test_NAME.log
set -u
if [ $# -lt 1 ]; then
  echo "usage: bash bench/variants_device.sh NAME [NAME ...] (names: bench/cuda_sweep.py's" \
       "VARIANTS)" >&2
  exit 2
fi
OUT=${OUT:-/tmp/ks-variants}
export OUT
FILES=$(python3 - "$OUT/kernels" "$@" <<'PY'
import sys
from pathlib import Path

sys.path[:0] = ["bench"]
import cuda_sweep  # noqa: E402  (after the path)

folder, names = Path(sys.argv[1]), sys.argv[2:]
why = cuda_sweep.unknown_variants(names)
if why:
    sys.exit(f"variants_device: {why}")
folder.mkdir(parents=True, exist_ok=True)
for name in names:
    print(cuda_sweep.probe_file(name, folder))
PY
) || exit 2
source bench/device_env.sh
source bench/seed_rounds.sh
nvidia-smi -L
timeout -s INT 240 python3 bench/cuda_sweep.py "$OUT/sweep.json" --reps 30 --kernels \
  --variants "$@" >"$OUT/sweep.log" 2>&1
rc=$?; took sweep $rc
grep -v Warning "$OUT/sweep.log" | grep "^| \|^|---\|: [0-9.]* (+" | cut -c1-240 | head -16
[ $rc = 0 ] || exit $rc
KERNELS=()
for file in $FILES; do KERNELS+=(--kernel "$file"); done
seed_rounds 240 "${KERNELS[@]}"
for name in "$@"; do
  [ "$name" = control ] || seed_test_as "$OUT/kernels/cuda_wgmma_$name.py" "$name"
done
