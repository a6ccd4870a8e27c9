# Sourced by bench/knob_device.sh and bench/variants_device.sh after bench/device_env.sh: a
# step's status and time since the source (`took NAME RC`), and the harness with the seed and
# other kernel files in the same rounds (`seed_rounds LIMIT_S --kernel FILE ...`: -k bench, no
# baselines or reference -> $OUT/harness.log, $OUT/harness.json; the paired ratios and the
# per-shape table are printed).
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
