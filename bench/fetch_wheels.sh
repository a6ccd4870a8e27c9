#!/usr/bin/env bash
# The wheels the GPU machine lacks, for its Python 3.12: pydantic and its needs, PyYAML, google-genai
# and httpx2 with theirs (the LLM tests). Into .whl/, which git ignores and bench/device_env.sh
# installs: run once per checkout, then call the device with carry [".whl"]. Versions: the ones
# this project's CPU runs use.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_34_x86_64 --platform manylinux1_x86_64 -d .whl \
  pydantic==2.13.4 pydantic_core==2.46.4 annotated-types==0.8.0 typing-inspection==0.4.5 \
  pyyaml==6.0.3 \
  google-genai==3.6.1 httpx2==2.17.0 httpcore2==2.17.0 h11==0.16.0 anyio==4.16.0 sniffio==1.3.1 \
  idna==3.21 certifi==2026.5.20 distro==1.9.0 truststore==0.10.5 tenacity==9.1.4 websockets==17.4 \
  google-auth==2.63.1 pyasn1==0.6.3 pyasn1-modules==0.4.2 cryptography==48.0.0 cffi==2.0.0 \
  pycparser==3.0 requests==2.34.2 urllib3==2.7.0 charset-normalizer==3.4.7 \
  typing-extensions==4.16.0
ls .whl
