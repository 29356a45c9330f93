#!/usr/bin/env bash
# Downloads, on the development machine, what tests/peer/peer.sh installs on the GPU machine
# (which reaches no package index): nvidia-modelopt 0.47.0 and the packages it needs that the H200
# image lacks (issue 19: pydantic, pydantic-core, annotated-types, typing-inspection,
# typing-extensions >= 4.16, omegaconf, pulp < 4; requests and its dependencies, which
# modelopt.torch.utils imports and transformers 5 no longer pulls in; and omegaconf's
# antlr4-python3-runtime 4.9, built into a wheel here). torch, transformers and the rest are the machine's own. For Python 3.12 on x86-64.
#   tests/peer/fetch_wheels.sh [DIR]   (default .whl/, git-ignored)
set -euo pipefail
dir=${1:-.whl}
mkdir -p "$dir"
python3 -m pip download -q --no-deps -d "$dir" --python-version 3.12 --implementation cp \
  --only-binary=:all: --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any nvidia-modelopt==0.47.0 pydantic pydantic-core annotated-types typing-inspection \
  "typing-extensions>=4.16" "omegaconf>=2.3.0" "pulp<4" requests urllib3 idna certifi \
  charset-normalizer
# antlr4-python3-runtime 4.9 exists only as an sdist: build its (pure-Python) wheel here, so that
# the GPU machine installs wheels only.
sdist=$(mktemp -d)
python3 -m pip download -q --no-deps --no-binary=:all: -d "$sdist" "antlr4-python3-runtime==4.9.*"
python3 -m pip wheel -q --no-deps -w "$dir" "$sdist"/*.tar.gz
rm -rf "$sdist"
ls "$dir"
