#!/usr/bin/env bash
# The H200 runbook: one device call that runs, in order,
#   (a) the carried wheels and the plugin (the package is not pip-installed there),
#   (b) the GPU-marked tests                              -> $OUT/gpu-tests.log
#   (b2) optional (KS_SWEEP_S): knob sweep of the Triton seed -> $OUT/sweep.log, sweep.json
#   (b3) optional (KS_PROBE_S): cuBLAS's scale layouts       -> $OUT/probe.log
#   (c) the 18-shape table, both seeds beside both cuBLAS baselines
#                                                         -> $OUT/table.log, $OUT/table.json
#   (d) the offline scientist, --evolve 10 from the Triton seed alone, until the time is up
#                                                         -> $OUT/evolve.log, $OUT/pop.tgz
#   (d2) optional (KS_TABLE_AFTER_S): the table of (c) again, every seed beside the best
#        evolved kernel, in one run                      -> $OUT/table.log, $OUT/table.json
#   (e) the markdown tables for notes/fp8_gemm_h200.md    -> $OUT/summary.md, printed last
# plus $OUT/runbook.log (versions, each step's exit code and seconds): 7 files.
#
# Each step runs under `timeout -s INT` (pytest stops as on Ctrl-C and still writes its JSON and
# summary), so the whole script ends within KS_RUNBOOK_SECONDS (default 560, for the device's
# 600 s limit) and a failed or cut step never stops the next one.
#
#   device call (repository root, carry [".whl"], timeout_s 600):  bash bench/h200_runbook.sh
#   on a CPU, to try it:
#     OUT=/tmp/rb KS_RUNBOOK_SECONDS=300 KS_GPU_TESTS_S=60 KS_TABLE_S=90 bash bench/h200_runbook.sh
# On a machine of several GPUs, KS_EVOLVE_ARGS="--ks-devices all" evaluates each generation's
# candidates at once, one child session per GPU.
# To continue an earlier evolve instead of starting afresh, put its pop.tgz in .whl/ (ignored,
# already carried) and set KS_RESUME_POP=.whl/pop.tgz; KS_GPU_TESTS_S=0 KS_TABLE_S=0 skip (b), (c).
set -u
export PYTHONUNBUFFERED=1
START=$(date +%s)
TOTAL=${KS_RUNBOOK_SECONDS:-560}
GPU_TESTS_S=${KS_GPU_TESTS_S:-150}  # (b) at most
TABLE_S=${KS_TABLE_S:-210}          # (c) at most
KILL_AFTER=15                       # a step ignoring SIGINT is killed this much later
FINAL_S=25                          # kept for (e): tar, summary
OUT=${OUT:-/tmp/ks-runbook}
mkdir -p "$OUT"
LOG="$OUT/runbook.log"
: >"$LOG"

note() { echo "[runbook +$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
left() { echo $(( START + TOTAL - $(date +%s) )); }
# slot MAX RESERVE: seconds for a step, at most MAX, leaving RESERVE for the steps after it.
slot() {
  local s=$(( $(left) - $2 - KILL_AFTER ))
  (( s > $1 )) && s=$1
  (( s < 0 )) && s=0
  echo "$s"
}
# step NAME SECONDS LOGFILE COMMAND...: run it under the time guard, whatever came before.
step() {
  local name=$1 secs=$2 log=$3 t0 rc
  shift 3
  if (( secs < 20 )); then
    note "$name: not run: ${secs}s available, under 20"
    echo "not run: ${secs}s available, under 20" >>"$log"
    return 0
  fi
  note "$name: start, limit ${secs}s"
  t0=$(date +%s)
  timeout -s INT -k "$KILL_AFTER" "$secs" "$@" >>"$log" 2>&1
  rc=$?
  note "$name: exit $rc after $(( $(date +%s) - t0 ))s$( (( rc == 124 )) && echo ' (time limit)')"
}

# -- (a) wheels and plugin -----------------------------------------------------------------
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >>"$LOG" 2>&1 || note "(a) wheels did not install; going on"
fi
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
PLUGIN=()
if ! python3 - <<'EOF'
import importlib.metadata as md
import sys
sys.exit(0 if any(e.name == "kscientist" for e in md.entry_points(group="pytest11")) else 1)
EOF
then
  # Not installed: load it by module, here and in every pytest the tests and --evolve start.
  PLUGIN=(-p pytest_kscientist.plugin)
  export PYTEST_PLUGINS=pytest_kscientist.plugin
fi
{
  echo "plugin args: ${PLUGIN[*]:-(installed entry point)}"
  python3 -c 'import sys, torch, pydantic; print("python", sys.version.split()[0], "| torch",
torch.__version__, "| cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0)
if torch.cuda.is_available() else "-", "| pydantic", pydantic.VERSION)' 2>&1
  python3 -c 'import triton; print("triton", triton.__version__)' 2>&1
  nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv 2>&1 | head -3
} >>"$LOG"
note "(a) done"

PYTEST=(python3 -m pytest "${PLUGIN[@]}" -p no:cacheprovider)

# -- (b) GPU tests: tests/adversarial/test_gpu_corpus.py, tests/test_baselines_gpu.py --------
step "(b) gpu tests" "$(slot "$GPU_TESTS_S" $(( TABLE_S + 90 )))" "$OUT/gpu-tests.log" \
  "${PYTEST[@]}" ${KS_GPU_TESTS:-tests} -m gpu -rA

# -- (b2) knob sweep of the Triton seed (bench/triton_sweep.py), outside the harness --------
SWEEP_S=${KS_SWEEP_S:-0}
if (( SWEEP_S > 0 )); then
  step "(b2) sweep" "$(slot "$SWEEP_S" $(( TABLE_S + 90 )))" "$OUT/sweep.log" \
    python3 bench/triton_sweep.py "$OUT/sweep.json" --seconds $(( SWEEP_S - 30 )) \
    ${KS_SWEEP_POINTS:+--points $KS_SWEEP_POINTS}
fi
# With KS_SWEEP_BEST=1, the Triton seed (this copy of the repository's, for the table and the
# evolve below) takes the knobs of the sweep's best passing point; commit the same knobs after.
if [ "${KS_SWEEP_BEST:-0}" = 1 ] && [ -f "$OUT/sweep.json" ]; then
  python3 - "$OUT/sweep.json" tasks/fp8_gemm/seeds/triton_blockscaled.py >>"$LOG" 2>&1 <<'EOF' \
    || note "(b2) sweep's best point not applied"
import json, sys
from pathlib import Path
from pytest_kscientist.api import rewrite_tunables
best = json.loads(Path(sys.argv[1]).read_text()).get("_best")
if best and best["changes"]:
    seed = Path(sys.argv[2])
    seed.write_text(rewrite_tunables(seed.read_text(), best["changes"]))
print("Triton seed knobs from the sweep:", best)
EOF
fi

# -- (b3) which layouts of B's scales cuBLAS takes (bench/cublas_scales_probe.py) -----------
PROBE_S=${KS_PROBE_S:-0}
if (( PROBE_S > 0 )); then
  step "(b3) cuBLAS scale forms" 60 "$OUT/probe.log" python3 bench/cublas_scales_probe.py
fi

# -- (c) the table: both seeds, reference, both cuBLAS baselines, 18 shapes -----------------
step "(c) table" "$(slot "$TABLE_S" 90)" "$OUT/table.log" \
  "${PYTEST[@]}" tasks/fp8_gemm -rA --durations=40 -k "${KS_TABLE_K:-check or bench}" \
  --ks-bench-budget "${KS_TABLE_BUDGET:-0.5}" \
  --ks-json "$OUT/table.json" ${KS_TABLE_ARGS:-}

# -- (d) the offline scientist from the Triton seed alone -----------------------------------
# A copy of the task whose seeds/ holds only the Triton seed: the population starts there, and
# the selector's switch to another family after 3 stalled generations cannot pick the torch seed
# (which is far slower on the H200: notes/fp8_gemm_h200.md, Run 1). Baselines are off in evolve
# child sessions by default; 0.2 s per benchmark keeps a generation short.
EVOLVE_TASK=/tmp/ks-evolve/fp8_gemm
rm -rf /tmp/ks-evolve /tmp/pop && mkdir -p /tmp/ks-evolve
if [ -n "${KS_RESUME_POP:-}" ]; then
  tar xzf "$KS_RESUME_POP" -C /tmp && note "(d) resuming the population of $KS_RESUME_POP" \
    || note "(d) could not unpack $KS_RESUME_POP; starting afresh"
fi
cp -r tasks/fp8_gemm "$EVOLVE_TASK"
find "$EVOLVE_TASK/seeds" -name '*.py' ! -name triton_blockscaled.py -delete
find "$EVOLVE_TASK" -name __pycache__ -prune -exec rm -rf {} +
TABLE_AFTER_S=${KS_TABLE_AFTER_S:-0}  # (d2), after the evolve: kept free for it
EVOLVE_S=$(slot 600 $(( FINAL_S + TABLE_AFTER_S + (TABLE_AFTER_S > 0 ? KILL_AFTER : 0) )))
# --ks-time-limit stops the loop cleanly (a child session is interrupted, the population kept);
# the timeout is only the backstop.
LIMIT=$(( EVOLVE_S - 25 ))
step "(d) evolve" "$EVOLVE_S" "$OUT/evolve.log" \
  "${PYTEST[@]}" --evolve 10 "$EVOLVE_TASK" --ks-population /tmp/pop \
  --ks-time-limit "$(( LIMIT > 1 ? LIMIT : 1 ))" --ks-bench-budget 0.2 ${KS_EVOLVE_ARGS:-}
if [ -d /tmp/pop ]; then
  tar czf "$OUT/pop.tgz" -C /tmp pop || note "(d) tar failed"
fi

# -- (d2) the table again, every seed beside the best evolved kernel (KS_TABLE_AFTER_S) --------
if (( TABLE_AFTER_S > 0 )); then
  BEST=$(python3 bench/summarize.py --population /tmp/pop --best-source /tmp/ks-best 2>>"$LOG")
  KERNELS=()
  for seed in tasks/fp8_gemm/seeds/*.py; do KERNELS+=(--kernel "$seed"); done
  [ -n "$BEST" ] && KERNELS+=(--kernel "$BEST")
  note "(d2) best evolved: ${BEST:-none beat the seeds}"
  step "(d2) table after evolve" "$(slot "$TABLE_AFTER_S" "$FINAL_S")" "$OUT/table.log" \
    "${PYTEST[@]}" tasks/fp8_gemm -rA --durations=40 -k "${KS_TABLE_K:-check or bench}" \
    --ks-bench-budget "${KS_TABLE_BUDGET:-0.5}" --ks-json "$OUT/table.json" "${KERNELS[@]}"
fi

# -- (e) the tables -------------------------------------------------------------------------
{
  echo "## Table (bench/summarize.py)"
  echo
  timeout 60 python3 bench/summarize.py --table "$OUT/table.json" --population /tmp/pop 2>&1
  echo
  echo "## Evolve: seed vs best per shape"
  echo
  timeout 30 python3 bench/summarize.py --population /tmp/pop --short 2>&1
} >"$OUT/summary.md"
note "(e) done; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
echo
echo "=== seed vs best evolved (geomean and per shape, us) ==="
timeout 30 python3 bench/summarize.py --population /tmp/pop --short 2>&1
exit 0
