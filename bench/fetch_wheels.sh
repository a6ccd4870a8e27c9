#!/usr/bin/env bash
# The wheels the GPU machine lacks (pydantic and its needs, PyYAML, for its Python 3.12), into .whl/,
# which git ignores and bench/h200_runbook.sh installs: run once per checkout, then call the
# device with carry [".whl"]. Versions: the ones this project's runs used on 2026-11-29.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d .whl \
  pydantic==2.13.4 pydantic_core==2.46.4 annotated-types==0.8.0 typing-inspection==0.4.5 \
  pyyaml==6.0.3
ls .whl
