# Sourced by bench/knob_device.sh and bench/variants_device.sh after bench/device_env.sh: a
# step's status and time since the source (`took NAME RC`), the harness with the seed and
# other kernel files in the same rounds (`seed_rounds LIMIT_S --kernel FILE ...`: -k bench, no
# baselines or reference -> $OUT/harness.log, $OUT/harness.json; the paired ratios and the
# per-shape table are printed), and the seed's own GPU test with a variant in its place
# (`seed_test_as FILE NAME`, below).
KS_ROUNDS_T0=$(date +%s)
took() { echo "$1 rc $2 at +$(( $(date +%s) - KS_ROUNDS_T0 ))s"; }
seed_rounds() {
  local limit=$1
  shift
  timeout -s INT "$limit" python3 -m pytest tasks/fp8_gemm -k bench -q -p no:cacheprovider \
    --kernel tasks/fp8_gemm/seeds/cuda_wgmma.py "$@" --ks-baselines none --ks-skip-reference \
    --ks-timeout 300 --ks-json "$OUT/harness.json" >"$OUT/harness.log" 2>&1
  took harness $?
  grep -A8 "side by side" "$OUT/harness.log" | grep "vs \|side by side" | cut -c1-200
  tail -1 "$OUT/harness.log" | cut -c1-300
  python3 bench/summarize.py --table "$OUT/harness.json" 2>&1 | tail -30 | cut -c1-260
}

# The seed's GPU test (tests/test_cuda_seed.py -m gpu: every schedule, both N tiles, one and two
# C buffers) with FILE, a variant probe_file wrote under the build name ks_NAME, in the seed's
# place under the seed's build name: the check adopting the variant needs. The seed is put back
# afterwards, also when the test fails or runs out of time -> $OUT/seed_test_NAME.log; returns
# the test's status.
seed_test_as() {
  local file=$1 name=$2 seed=tasks/fp8_gemm/seeds/cuda_wgmma.py rc
  cp "$seed" "$OUT/seed.keep" || return 2
  sed "s/name=\"ks_$name\(_v[0-9]*\)\"/name=\"ks_cuda_wgmma\1\"/" "$file" >"$seed"
  timeout -s INT 150 python3 -m pytest tests/test_cuda_seed.py -m gpu -q -p no:cacheprovider \
    >"$OUT/seed_test_$name.log" 2>&1
  rc=$?
  cp "$OUT/seed.keep" "$seed"
  took "seed test as $name" $rc
  tail -1 "$OUT/seed_test_$name.log" | cut -c1-200
  return $rc
}
