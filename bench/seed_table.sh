#!/usr/bin/env bash
# Issue 33's table on one sm_90 GPU: the CUDA seed beside older seeds, both cuBLAS rows and the
# reference, per shape with each row's floor fraction (notes/fp8_gemm_h200.md):
#   here, where git has the history (the device's copy of the tree has none), each older seed
#   under a build name of its own:
#     bash bench/seed_table.sh --write REV [REV ...]           -> .gl/seed_REV.py
#   device call (repository root, carry [".whl", ".gl"], timeout_s 330):
#     bash bench/seed_table.sh .gl/seed_REV.py [...]
# The device part runs the task's whole suite with every kernel (its checks, then the timing;
# ~75 s with two seeds on an H200) -> $OUT/suite.log, suite.json, and prints the paired ratios
# and bench/summarize.py's per-shape table last.
set -u
SEED=tasks/fp8_gemm/seeds/cuda_wgmma.py
usage="usage: bash bench/seed_table.sh --write REV [REV ...] (here), then bash bench/seed_table.sh FILE [FILE ...] (on the device)"
if [ $# -lt 1 ] || { [ "$1" = --write ] && [ $# -lt 2 ]; }; then
  echo "$usage" >&2
  exit 2
fi
if [ "$1" = --write ]; then
  shift
  mkdir -p .gl
  for rev in "$@"; do
    name=$(git rev-parse --short=7 "$rev^{commit}" 2>/dev/null) || {
      echo "seed_table: $rev is not a commit of this repository; name one from git log" >&2
      exit 2
    }
    text=$(git show "$name:$SEED" 2>/dev/null) || {
      echo "seed_table: $name has no $SEED; name a commit from after the CUDA seed's start" >&2
      exit 2
    }
    printf '%s\n' "$text" | sed "s/name=\"ks_cuda_wgmma/name=\"ks_cuda_wgmma_$name/" \
      >".gl/seed_$name.py"
    echo ".gl/seed_$name.py"
  done
  exit 0
fi
KERNELS=(--kernel "$SEED")
for file in "$@"; do
  if [ ! -f "$file" ]; then
    echo "seed_table: $file: no such file; write it here with bash bench/seed_table.sh" \
         "--write REV and carry .gl" >&2
    exit 2
  fi
  if grep -q 'name="ks_cuda_wgmma_v[0-9]*"' "$file"; then
    echo "seed_table: $file builds under the seed's own name (ks_cuda_wgmma_v*), so the two" \
         "would share one build; write it with bash bench/seed_table.sh --write REV" >&2
    exit 2
  fi
  KERNELS+=(--kernel "$file")
done
OUT=${OUT:-/tmp/ks-seed-table}
export OUT
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
T0=$(date +%s)
timeout -s INT 300 python3 -m pytest tasks/fp8_gemm -p no:cacheprovider -q "${KERNELS[@]}" \
  --ks-baselines all --ks-timeout 300 --ks-json "$OUT/suite.json" >"$OUT/suite.log" 2>&1
echo "suite rc $? at +$(( $(date +%s) - T0 ))s"
tail -1 "$OUT/suite.log" | cut -c1-300
grep -A8 "side by side" "$OUT/suite.log" | grep "vs \|side by side" | cut -c1-200
python3 bench/summarize.py --table "$OUT/suite.json" 2>&1 | tail -30 | cut -c1-300
