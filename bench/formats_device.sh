#!/usr/bin/env bash
# Issue 12 on a GPU: GPU MODE's pmpp problem folders and the AMD fp8-mm folder, and KernelBench
# level-1 problems, run unchanged by the harness. Needs the upstream files in .ext/ (ignored by
# git; never committed):
#   (cd <reference-kernels checkout> && git archive HEAD problems/pmpp problems/amd | tar -x -C .ext)
#   (cd <KernelBench checkout> && git archive HEAD KernelBench/level1 | tar -x -C .ext)
# device calls (carry [".whl", ".ext"]):  PART=gpumode bash bench/formats_device.sh, then
#   PART=kernelbench bash bench/formats_device.sh
# Every solutions/correct file must pass and every solutions/wrong file fail; KernelBench
# problems run with a ModelNew made from Model (correct) and the same scaled by 1.1 (wrong).
set -u
OUT=${OUT:-/tmp/ks-formats}
source bench/device_env.sh
BUDGET=${BUDGET:-0.1}
t() {  # t SECONDS NAME ARGS...: one pytest run, its JSON as $OUT/NAME.json
  local secs=$1 name=$2 t0=$SECONDS
  shift 2
  timeout -s INT -k 10 "$secs" python3 -m pytest -p no:cacheprovider -q -rfE \
    --ks-bench-budget "$BUDGET" --ks-json "$OUT/$name.json" "$@" >"$OUT/$name.log" 2>&1
  echo "exit $? wall $(( SECONDS - t0 )) s: $name" | tee -a "$OUT/steps.log"
}
PART=${PART:-gpumode}  # gpumode | kernelbench | both (PROBLEMS=... to pick pmpp folders)
if [[ $PART != kernelbench ]]; then
P=.ext/problems/pmpp
for prob in ${PROBLEMS:-vectoradd_py grayscale_py histogram_py prefixsum_py sort_py matmul_py conv2d_py vectorsum_py}; do
  [[ -d $P/$prob/solutions/correct ]] && t 120 "$prob-correct" "$P/$prob"
  for wrong in "$P/$prob"/solutions/wrong/*.py; do
    [[ -f $wrong ]] && t 90 "$prob-wrong-$(basename "$wrong" .py)" "$P/$prob" --kernel "$wrong"
  done
done
if [[ -z ${SKIP_FP8:-} ]]; then
  t 150 fp8-mm-seeds .ext/problems/amd/fp8-mm --kernel tasks/fp8_gemm/seeds/torch_dequant.py \
    --kernel tasks/fp8_gemm/seeds/triton_blockscaled.py
fi
fi
if [[ $PART != gpumode ]]; then
KB=.ext/KernelBench/level1
SOL=.ext/kb_solutions
python3 - "$KB" "$SOL" ${KB_PROBLEMS:-} <<'PY'
import re, sys
from pathlib import Path
kb, sol = Path(sys.argv[1]), Path(sys.argv[2])
for name in sys.argv[3:] or """1_Square_matrix_multiplication_ 4_Matrix_vector_multiplication_
19_ReLU 23_Softmax 26_GELU_ 36_RMSNorm_ 40_LayerNorm 42_Max_Pooling_2D
47_Sum_reduction_over_a_dimension 87_conv_pointwise_2D 89_cumsum""".split():
    text = (kb / f"{name}.py").read_text()
    same = re.sub(r"\bModel\b", "ModelNew", text)
    wrong = same + ("\n\n_forward = ModelNew.forward\n\n\ndef _scaled(self, *args):\n"
                    "    return _forward(self, *args) * 1.1 + 0.1\n\n\nModelNew.forward = _scaled\n")
    (sol / name).mkdir(parents=True, exist_ok=True)
    (sol / name / "same.py").write_text(same)
    (sol / name / "wrong.py").write_text(wrong)
PY
KB_FILES=$(ls "$SOL" | sed "s|^|$KB/|; s|$|.py|")
t "${KB_SECS:-500}" kernelbench-level1 $KB_FILES --ks-solutions "$SOL"
fi
python3 bench/formats_table.py "$OUT"/*.json | tee "$OUT/table.md"
# The device returns few files: the logs and JSON travel as one archive.
tar -czf "$OUT/runs.tgz" -C "$OUT" $(cd "$OUT" && ls *.json *.log) && (cd "$OUT" && rm -f *.json ./*-*.log)
