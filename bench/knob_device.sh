#!/usr/bin/env bash
# A new knob of the CUDA seed, on one sm_90 GPU (issue 33; notes/fp8_gemm_h200.md):
#   here, before committing the change (the device's copy of the tree has no git history):
#     git show HEAD:tasks/fp8_gemm/seeds/cuda_wgmma.py >.gl/old_seed.py
#   device call (repository root, carry [".whl", ".gl"], timeout_s 600):
#     bash bench/knob_device.sh KNOB "V1 V2 ..." [OLD_SEED]      (default .gl/old_seed.py)
# In order, each under its own limit, stopping (with the probe's status) if the probe finds a
# wrong element:
#   (a) OLD_SEED under another build name, and a copy of the seed at each value but its own,
#       written to $OUT/kernels/;
#   (b) bench/knob_probe.py: the checks at each value, then the plain loop     -> $OUT/probe.log
#   (c) the seed's gpu-marked tests (not with KNOB_GPU_TESTS=0: ~25 s less)   -> $OUT/gpu.log
#   (d) the harness: the seed, its copies and the old seed in the same rounds
#                                                               -> $OUT/harness.log, harness.json
#   (e) the harness's per-shape table (bench/summarize.py)                   -> printed last
set -u
KNOB=${1:?usage: bash bench/knob_device.sh KNOB \"V1 V2 ...\" [OLD_SEED]}
VALUES=${2:?usage: bash bench/knob_device.sh KNOB \"V1 V2 ...\" [OLD_SEED]}
OLD_SEED=${3:-.gl/old_seed.py}
if ! grep -q 'name="ks_cuda_wgmma_v8"' "$OLD_SEED" 2>/dev/null \
    || grep -q "\"$KNOB\"" "$OLD_SEED"; then
  echo "knob_device: $OLD_SEED is not the seed before the change (build name ks_cuda_wgmma_v8," \
       "no $KNOB); write it with: git show HEAD:tasks/fp8_gemm/seeds/cuda_wgmma.py" \
       ">.gl/old_seed.py (before committing the change)"
  exit 2
fi
OUT=${OUT:-/tmp/ks-knob}
export OUT
source bench/device_env.sh
source bench/seed_rounds.sh
nvidia-smi -L
mkdir -p "$OUT/kernels"
sed 's/ks_cuda_wgmma_v8/ks_cuda_wgmma_old/' "$OLD_SEED" >"$OUT/kernels/old_seed.py"
KERNELS=()
# shellcheck disable=SC2086  # the values are words
COPIES=$(python3 - "$KNOB" "$OUT/kernels" $VALUES <<'PY'
import sys
from pathlib import Path
from pytest_kscientist.api import read_tunables, rewrite_tunables
knob, folder, values = sys.argv[1], Path(sys.argv[2]), [int(v) for v in sys.argv[3:]]
src = Path("tasks/fp8_gemm/seeds/cuda_wgmma.py").read_text()
own = read_tunables(src)[knob]
for value in values:
    if value != own:  # the seed itself runs at its own value
        path = folder / f"{knob.lower()}_{value}.py"
        path.write_text(rewrite_tunables(src, {knob: value}))
        print(path)
PY
) || exit 2
for copy in $COPIES; do KERNELS+=(--kernel "$copy"); done
KERNELS+=(--kernel "$OUT/kernels/old_seed.py")
# shellcheck disable=SC2086  # the values are words
timeout -s INT 200 python3 bench/knob_probe.py "$KNOB" $VALUES --old "$OUT/kernels/old_seed.py" \
  >"$OUT/probe.log" 2>&1
rc=$?; took probe $rc
grep -v Warning "$OUT/probe.log" | cut -c1-240 | tail -32
[ $rc = 0 ] || [ $rc = 4 ] || exit $rc  # 4: a graph replay only (the probe says which)
if [ "${KNOB_GPU_TESTS:-1}" != 0 ]; then
  timeout -s INT 150 python3 -m pytest tests/test_cuda_seed.py -m gpu -q -p no:cacheprovider \
    -rfE >"$OUT/gpu.log" 2>&1
  took gpu-tests $?
  tail -3 "$OUT/gpu.log" | cut -c1-300
fi
seed_rounds 200 "${KERNELS[@]}"
