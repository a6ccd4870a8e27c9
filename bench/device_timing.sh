#!/usr/bin/env bash
# Timing fidelity, A/A and throughput on a GPU machine (issue 10), in one device call each part:
#   KS_PART=sweep: the points of bench/fused_sweep.py (most promising first, for KS_SWEEP_S,
#     default 150 s), the fused seed with the sweep's knobs (bench/sweep_seed.py), it and the
#     seed as it is in the harness beside both cuBLAS baselines and the reference, the
#     per-shape table (bench/summarize.py)
#   KS_PART=fused: the two Triton seeds' best points outside the harness (bench/fused_sweep.py),
#     both seeds in the harness beside both baselines, --evolve 10 from both (320 s limit)
#   KS_PART=evolve10: --evolve 10 from both Triton seeds and the CUDA seed (boxed, resumable
#     from a carried .pop/pop.tgz), the population's table; KS_HOST=1: then
#     bench/host_time.py in what is left of 590 s; KS_THEN_TESTS=1: then the gpu-marked tests
#   KS_PART=check: the gpu-marked tests (the GPU corpus too), then the fidelity table
#   KS_PART=anchors: fidelity against the plain loop (twice), do_bench and CUPTI kernel time
#     (bench/fidelity.py), one candidate's suite beside both baselines (wall, --durations),
#     --evolve 2 from the Triton seed (each generation's time in its log)
#   KS_PART=measure (default): fidelity table (bench/fidelity.py), one candidate's full suite
#     without and with both cuBLAS baselines (wall time), GPU A/A (bench/aa.py, 2 runs)
#   KS_PART=tests: the gpu-marked tests (the GPU adversarial corpus too), then the fidelity
#     table again
#   KS_PART=verify: the gpu-marked tests, then the suite beside both baselines (wall time)
#   KS_PART=final: fidelity, the GPU adversarial corpus, --evolve 2 (as below, time-boxed)
#   KS_PART=evolve: --evolve 2 of the task from the Triton seed (offline scientist), each
#     generation's evaluation time in its log, then GPU A/A (1 run)
#   KS_PART=profile: ncu on the CUDA seed's GEMM launch at a short-K and a long-K shape (speed of
#     light, warp states, scheduler, memory and compute workload sections, stall samples by
#     SASS instruction through bench/sass_stalls.py, L2 bytes), text reports
#   KS_PART=timeline: where the CUDA seed's consumers spend their cycles, per bucket of a K step
#     and per tile (bench/cuda_timeline.py: a clock-stamped build beside the seed)
#   KS_PART=cuda_evolve: the CUDA seed's plain-loop sweep, the harness table (both seeds, both
#     baselines, the reference), then --evolve 10 from both seeds in the rest of 590 s; carried
#     .pop/pop.tgz (the last call's $OUT/pop.tgz): only the evolve, resumed; KS_EXTRA=FILE: a
#     seed file (another load_inline name) timed beside the seed in the plain loop;
#     KS_EVOLVE_ONLY=1: the evolve alone (no plain loop, no harness table) in the 590 s
#   KS_PART=cuda: the CUDA seed's gpu-marked test (three schedules through the harness's
#     checks; its build is reused by the rest), its plain-loop sweep beside the Triton seed
#     (bench/cuda_sweep.py --kernels), then both seeds in the harness beside both baselines
#     and the reference, the per-shape table (bench/summarize.py)
#   KS_PART=owed: notes/STATUS.md's device call 0: the H200 A/A with the rounds' median, each
#     run's output and --ks-json kept (bench/aa.py --runs 3 --no-slower --keep), the seed's
#     short calls probed for the split (bench/spread_probe.py), then --evolve 1 with the child
#     session's --durations (its logs in $OUT/child_logs.tgz); prints the A/A table, the missing
#     ratios, the probe's rows and the generation lines
#   KS_PART=folders: the workers' own folders and compiler caches on the GPU (gpu tests, the
#     Triton seed's checks twice, --evolve 1 with durations unless KS_EVOLVE=0)
#   KS_PART=builds: the shared load_inline builds on the GPU (harness/shared_builds.py): the
#     CUDA seed's gpu-marked test (three knob variants, one shared build) with the shared-build
#     tests, then bench/build_times.py (the seed's build cold and warm, its first evaluation,
#     the default run and an --evolve 1 from empty caches); prints the tests' last lines and
#     the table
# Logs land in $OUT; each step is time-boxed so the call ends inside the device's 600 s.
#   device call (repository root, carry [".whl"]):  KS_PART=measure bash bench/device_timing.sh
set -u
OUT=${OUT:-/tmp/ks-timing}
source bench/device_env.sh
SEED=tasks/fp8_gemm/seeds/triton_blockscaled.py
t() {  # t SECONDS LOG COMMAND...: time-boxed, wall time appended to the log
  local secs=$1 log=$2 t0=$SECONDS rc
  shift 2
  timeout -s INT -k 10 "$secs" "$@" >>"$log" 2>&1
  rc=$?
  echo "exit $rc wall $(( SECONDS - t0 )) s: $*" | tee -a "$log" "$OUT/steps.log"
}
evolve10() {  # evolve10 BOX SEED...: --evolve 10 from these seeds of a copy of the task in BOX s,
  # resumed from .pop/pop.tgz when the call carries one (the last call's $OUT/pop.tgz); the
  # population's table, and the population as $OUT/pop.tgz
  local box=$1 seed
  shift
  rm -rf /tmp/ks-evolve && mkdir -p /tmp/ks-evolve/pop && cp -r tasks/fp8_gemm /tmp/ks-evolve/
  for seed in /tmp/ks-evolve/fp8_gemm/seeds/*.py; do
    [[ " $* " == *" $(basename "$seed" .py) "* ]] || rm "$seed"
  done
  [[ -f .pop/pop.tgz ]] && tar -C /tmp/ks-evolve/pop -xzf .pop/pop.tgz
  t "$box" "$OUT/evolve.log" python3 -m pytest -p no:cacheprovider --evolve 10 \
    --ks-time-limit $(( box - 45 )) --ks-timeout 300 /tmp/ks-evolve/fp8_gemm \
    --ks-population /tmp/ks-evolve/pop
  t 30 "$OUT/summary.md" python3 bench/summarize.py --population /tmp/ks-evolve/pop/fp8_gemm
  tar -C /tmp/ks-evolve/pop -czf "$OUT/pop.tgz" --exclude '*.png' . 2>/dev/null
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv >"$OUT/steps.log"
if [[ ${KS_PART:-measure} == sweep ]]; then
  t 200 "$OUT/sweep.log" python3 bench/fused_sweep.py "$OUT/sweep.json" --seconds ${KS_SWEEP_S:-150}
  t 30 "$OUT/swept.log" python3 bench/sweep_seed.py "$OUT/sweep.json" "$OUT/swept.py"
  t 200 "$OUT/suite.log" python3 -m pytest tasks/fp8_gemm -p no:cacheprovider -q \
    --kernel "$OUT/swept.py" --kernel tasks/fp8_gemm/seeds/triton_fused.py \
    --ks-baselines all --ks-json "$OUT/suite.json"
  t 15 "$OUT/table.md" python3 bench/summarize.py --table "$OUT/suite.json"
  tar -C "$OUT" -czf "$OUT/logs.tgz" wheels.log sweep.log swept.log suite.log 2>/dev/null &&
    rm -f "$OUT"/{wheels,sweep,swept,suite}.log
elif [[ ${KS_PART:-measure} == profile ]]; then
  # the shape rules are cleared by cuda_profile.py: k < 1792 gets its rule's STREAM_K 0 here;
  # stall sampling by SASS instruction (bench/sass_stalls.py) beside the sections
  for point in "m6144-n7168-k256 STREAM_K=0" "m6144-n4608-k7168"; do
    name=${point%% *}
    t 200 "$OUT/ncu-$name.txt" ncu --clock-control none --kernel-name regex:gemm_kernel \
      --launch-skip 2 --launch-count 1 --section SpeedOfLight --section WarpStateStats \
      --section SchedulerStats --section MemoryWorkloadAnalysis \
      --section ComputeWorkloadAnalysis --section SourceCounters -f -o "$OUT/$name" \
      python3 bench/cuda_profile.py $point
    ncu --import "$OUT/$name.ncu-rep" --print-summary none >>"$OUT/ncu-$name.txt" 2>&1
    ncu --import "$OUT/$name.ncu-rep" --page source --csv --print-source sass \
      >"$OUT/$name.sass.csv" 2>>"$OUT/ncu-$name.txt"
    t 30 "$OUT/stalls-$name.txt" python3 bench/sass_stalls.py "$OUT/$name.sass.csv"
  done
  # L2 bytes and throughput, a run of their own (a metric name ncu does not know ends only it)
  t 150 "$OUT/ncu-l2.txt" ncu --clock-control none --kernel-name regex:gemm_kernel \
    --launch-skip 2 --launch-count 1 --metrics lts__t_bytes.sum.per_second,lts__t_bytes.sum,\
lts__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum \
    python3 bench/cuda_profile.py m6144-n4608-k7168
elif [[ ${KS_PART:-measure} == timeline ]]; then
  t 420 "$OUT/timeline.md" python3 bench/cuda_timeline.py
elif [[ ${KS_PART:-measure} == builds ]]; then
  t 200 "$OUT/builds-tests.log" python3 -m pytest -p no:cacheprovider -q -rA \
    tests/test_cuda_seed.py tests/test_shared_builds.py -m "gpu or not gpu"
  t 360 "$OUT/build_times.log" python3 bench/build_times.py
  grep -E '^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed' "$OUT/builds-tests.log" | tail -12
  tail -20 "$OUT/build_times.log"
elif [[ ${KS_PART:-measure} == folders ]]; then
  # the workers' own folders and compiler caches (harness/worker_folders.py) on the GPU: the
  # gpu-marked tests, the Triton seed's checks twice (the second seeded from the kept caches),
  # then --evolve 1 with the child session's durations
  python3 -c "from pytest_kscientist.harness.mounts import home_folder; print('home read-only:', home_folder())"
  t 280 "$OUT/gpu.log" python3 -m pytest -p no:cacheprovider -q tests -m gpu -x
  for i in 1 2; do
    t 60 "$OUT/triton_$i.log" python3 -m pytest -p no:cacheprovider -q tasks/fp8_gemm \
      --kernel tasks/fp8_gemm/seeds/triton_fused.py --ks-baselines none -k check
  done
  du -sh ~/.cache/pytest-kscientist/jit/* 2>/dev/null | head -4
  tail -3 "$OUT/gpu.log"
  grep -E 'passed|failed' "$OUT"/triton_*.log | tail -2
  if [[ ${KS_EVOLVE:-1} == 1 ]]; then
    rm -rf /tmp/ks-owed && mkdir -p /tmp/ks-owed
    PYTEST_ADDOPTS=--durations=30 t 170 "$OUT/evolve.log" python3 -m pytest \
      -p no:cacheprovider --evolve 1 tasks/fp8_gemm --ks-population /tmp/ks-owed
    find /tmp/ks-owed -name '*.log' -o -name '*.json' | tar -czf "$OUT/pop_logs.tgz" -T - \
      2>/dev/null
    grep -E 'generation|bench items' "$OUT/evolve.log" | tail -6
    python3 bench/inline_builds.py /tmp/ks-owed 2>&1 | tail -12
  fi
elif [[ ${KS_PART:-measure} == cuda ]]; then
  t 200 "$OUT/gputest.log" python3 -m pytest -p no:cacheprovider -q -p no:randomly \
    tests/test_cuda_seed.py -m gpu
  t 120 "$OUT/sweep.log" python3 bench/cuda_sweep.py "$OUT/cuda.json" --kernels
  t 200 "$OUT/suite.log" python3 -m pytest tasks/fp8_gemm -p no:cacheprovider -q \
    --kernel tasks/fp8_gemm/seeds/cuda_wgmma.py --kernel tasks/fp8_gemm/seeds/triton_fused.py \
    --ks-baselines all --ks-timeout 300 --ks-json "$OUT/suite.json"
  t 15 "$OUT/table.md" python3 bench/summarize.py --table "$OUT/suite.json"
elif [[ ${KS_PART:-measure} == fused ]]; then
  t 90 "$OUT/sweep.log" python3 bench/fused_sweep.py "$OUT/sweep.json" --points seed \
    f8_tma_one_64x128x128_w4s4 f16_tma_one_128x128x128_w8s3
  t 150 "$OUT/suite.log" python3 -m pytest tasks/fp8_gemm -p no:cacheprovider -q \
    --kernel tasks/fp8_gemm/seeds/triton_fused.py --kernel "$SEED" --ks-skip-reference \
    --ks-baselines all --ks-json "$OUT/suite.json"
  rm -rf /tmp/ks-evolve && mkdir -p /tmp/ks-evolve && cp -r tasks/fp8_gemm /tmp/ks-evolve/
  rm /tmp/ks-evolve/fp8_gemm/seeds/torch_dequant.py /tmp/ks-evolve/fp8_gemm/seeds/hip_mfma.py
  t 360 "$OUT/evolve.log" python3 -m pytest -p no:cacheprovider --evolve 10 --ks-time-limit 320 \
    /tmp/ks-evolve/fp8_gemm --ks-population /tmp/ks-evolve/pop
  cp /tmp/ks-evolve/pop/fp8_gemm/findings.md "$OUT/findings.md" 2>/dev/null
  tar -C /tmp/ks-evolve/pop -czf "$OUT/pop.tgz" --exclude '*.png' . 2>/dev/null
elif [[ ${KS_PART:-measure} == cuda_evolve ]]; then
  # the plain loop (it builds the seed, which the harness's worker then finds built), the
  # harness table beside both baselines and the reference, then --evolve 10 from cuda_wgmma and
  # triton_fused in what is left of 590 s (resumed from a carried .pop/pop.tgz)
  if [[ ! -f .pop/pop.tgz && ${KS_EVOLVE_ONLY:-0} != 1 ]]; then
    # KS_EXTRA: a seed file timed beside it in the plain loop (another load_inline name)
    t 150 "$OUT/sweep.log" python3 bench/cuda_sweep.py "$OUT/cuda.json" ${KS_EXTRA:+--extra "$KS_EXTRA"}
    t 200 "$OUT/suite.log" python3 -m pytest tasks/fp8_gemm -p no:cacheprovider -q \
      --kernel tasks/fp8_gemm/seeds/cuda_wgmma.py --kernel tasks/fp8_gemm/seeds/triton_fused.py \
      --ks-baselines all --ks-timeout 300 --ks-json "$OUT/suite.json"
    t 15 "$OUT/table.md" python3 bench/summarize.py --table "$OUT/suite.json"
  fi
  # KS_END_S: the call's end (default 590 s), for a short last call
  evolve10 $(( ${KS_END_S:-590} - SECONDS - 30 )) cuda_wgmma triton_fused
elif [[ ${KS_PART:-measure} == evolve10 ]]; then
  # KS_EVOLVE_S boxes it (default 540 s)
  evolve10 "${KS_EVOLVE_S:-540}" cuda_wgmma triton_fused triton_blockscaled
  if [[ ${KS_HOST:-0} == 1 ]] && (( SECONDS < 560 )); then  # in what is left of 590 s
    t $(( 590 - SECONDS )) "$OUT/host.md" python3 bench/host_time.py --reps 20
  fi
  if [[ ${KS_THEN_TESTS:-0} == 1 ]]; then
    t 250 "$OUT/gpu-tests.log" python3 -m pytest tests -m gpu -p no:cacheprovider -q -rA
  fi
elif [[ ${KS_PART:-measure} == check ]]; then
  t 200 "$OUT/gpu-tests.log" python3 -m pytest tests -m gpu -p no:cacheprovider -q -rA
  t 200 "$OUT/fidelity.log" python3 bench/fidelity.py --budget 0.3 --out "$OUT/fidelity.json"
elif [[ ${KS_PART:-measure} == anchors ]]; then
  t 200 "$OUT/fidelity.log" python3 bench/fidelity.py --budget 0.3 --out "$OUT/fidelity.json"
  t 100 "$OUT/suite.log" python3 -m pytest tasks/fp8_gemm -p no:cacheprovider -q \
    --kernel "$SEED" --ks-skip-reference --ks-baselines all --durations=30
  rm -rf /tmp/ks-evolve && mkdir -p /tmp/ks-evolve && cp -r tasks/fp8_gemm /tmp/ks-evolve/
  rm /tmp/ks-evolve/fp8_gemm/seeds/torch_dequant.py /tmp/ks-evolve/fp8_gemm/seeds/hip_mfma.py
  t 280 "$OUT/evolve.log" python3 -m pytest -p no:cacheprovider --evolve 2 \
    /tmp/ks-evolve/fp8_gemm --ks-population /tmp/ks-evolve/pop
  tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude logs.tgz . 2>/dev/null
elif [[ $KS_PART == measure ]]; then
  t 200 "$OUT/fidelity.log" python3 bench/fidelity.py --budget 0.3 --out "$OUT/fidelity.json"
  t 100 "$OUT/suite.log" python3 -m pytest tasks/fp8_gemm -p no:cacheprovider -q \
    --kernel "$SEED" --ks-skip-reference --ks-baselines none
  t 130 "$OUT/suite.log" python3 -m pytest tasks/fp8_gemm -p no:cacheprovider -q \
    --kernel "$SEED" --ks-skip-reference --ks-baselines all
  t 130 "$OUT/aa.log" python3 bench/aa.py --runs 2 --device cuda
elif [[ $KS_PART == tests ]]; then
  t 380 "$OUT/gpu-tests.log" python3 -m pytest tests -m gpu -p no:cacheprovider -q -rA
  t 120 "$OUT/fidelity.log" python3 bench/fidelity.py --budget 0.3 --out "$OUT/fidelity.json"
elif [[ $KS_PART == verify ]]; then
  t 170 "$OUT/gpu-tests.log" python3 -m pytest tests -m gpu -p no:cacheprovider -q -rA
  t 90 "$OUT/suite.log" python3 -m pytest tasks/fp8_gemm -p no:cacheprovider -q \
    --kernel "$SEED" --ks-skip-reference --ks-baselines all
elif [[ $KS_PART == owed ]]; then
  t 200 "$OUT/aa.log" python3 bench/aa.py --runs 3 --no-slower --device cuda --budget 1 \
    --keep "$OUT/aa"
  rm -f "$OUT"/aa/*.json  # the logs say what a missing ratio was; the JSON would crowd $OUT
  t 80 "$OUT/spread.log" python3 bench/spread_probe.py --calls 300 \
    --shapes m1024-n7168-k256 m1024-n4096-k512
  rm -rf /tmp/ks-owed && mkdir -p /tmp/ks-owed
  export PYTEST_ADDOPTS=--durations=12  # the child session's durations, in its own log
  t 270 "$OUT/evolve.log" python3 -m pytest -p no:cacheprovider --evolve 1 tasks/fp8_gemm \
    --ks-population /tmp/ks-owed
  unset PYTEST_ADDOPTS
  find /tmp/ks-owed -name '*.log' | tar -czf "$OUT/child_logs.tgz" -T - 2>/dev/null
  grep -E '^(geomean|\| [0-9]|\| m.*no ratio|  FAILED)' "$OUT/aa.log" | cut -c1-300
  grep -E '^\| m' "$OUT/spread.log" | head -12
  grep -E 'generation|done in|bench items' "$OUT/evolve.log" | tail -8
  python3 bench/inline_builds.py /tmp/ks-owed  # the shared builds: built in 0, reused in 1?
elif [[ $KS_PART == final ]]; then
  t 90 "$OUT/fidelity.log" python3 bench/fidelity.py --budget 0.3 --out "$OUT/fidelity.json"
  t 250 "$OUT/gpu-tests.log" python3 -m pytest tests/adversarial/test_gpu_corpus.py \
    -p no:cacheprovider -q -rA
  rm -rf /tmp/ks-evolve && mkdir -p /tmp/ks-evolve && cp -r tasks/fp8_gemm /tmp/ks-evolve/
  rm /tmp/ks-evolve/fp8_gemm/seeds/torch_dequant.py
  t 200 "$OUT/evolve.log" python3 -m pytest -p no:cacheprovider --evolve 2 \
    /tmp/ks-evolve/fp8_gemm --ks-population /tmp/ks-evolve/pop
else
  rm -rf /tmp/ks-evolve && mkdir -p /tmp/ks-evolve && cp -r tasks/fp8_gemm /tmp/ks-evolve/
  rm /tmp/ks-evolve/fp8_gemm/seeds/torch_dequant.py  # from the Triton seed alone
  t 330 "$OUT/evolve.log" python3 -m pytest -p no:cacheprovider --evolve 2 \
    /tmp/ks-evolve/fp8_gemm --ks-population /tmp/ks-evolve/pop
  t 100 "$OUT/aa.log" python3 bench/aa.py --runs 1 --device cuda
fi
cat "$OUT/steps.log"
