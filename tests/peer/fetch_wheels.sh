#!/usr/bin/env bash
# Downloads, on the development machine, what tests/peer/peer.sh installs on the GPU machine
# (which reaches no package index): nvidia-modelopt 0.47.0 and the packages it needs that the H200
# image lacks (issue 19: pydantic, pydantic-core, annotated-types, typing-inspection,
# typing-extensions >= 4.16, omegaconf, pulp < 4; requests and its dependencies, which
# modelopt.torch.utils imports and transformers 5 no longer pulls in; and omegaconf's
# antlr4-python3-runtime 4.9, built into a wheel here; accelerate and its psutil, for
# bench/gpu_bench.sh's ModelOpt layerwise + offload step, whose offload is accelerate's and whose
# export ModelOpt's accelerate plugin streams). torch, transformers and the rest are the machine's
# own. For Python 3.12 on x86-64. tests/peer/modelopt_env.sh installs them there.
#   tests/peer/fetch_wheels.sh [DIR]   (default .whl/, git-ignored)
set -euo pipefail
dir=${1:-.whl}
mkdir -p "$dir"
python3 -m pip download -q --no-deps -d "$dir" --python-version 3.12 --implementation cp \
  --only-binary=:all: --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any nvidia-modelopt==0.47.0 pydantic pydantic-core annotated-types typing-inspection \
  "typing-extensions>=4.16" "omegaconf>=2.3.0" "pulp<4" requests urllib3 idna certifi \
  charset-normalizer accelerate psutil
# antlr4-python3-runtime 4.9 exists only as an sdist: build its (pure-Python) wheel here, so that
# the GPU machine installs wheels only.
sdist=$(mktemp -d)
python3 -m pip download -q --no-deps --no-binary=:all: -d "$sdist" "antlr4-python3-runtime==4.9.*"
python3 -m pip wheel -q --no-deps -w "$dir" "$sdist"/*.tar.gz
rm -rf "$sdist"
# pulp bundles CBC solver executables for six platforms (16 MB of its wheel); ModelOpt imports
# pulp (modelopt.torch.opt.searcher) but quantization never solves anything. Repacked without
# them, so the wheels fit beside the tree and the build in one device call.
python3 - "$dir" <<'PY'
import glob, os, sys, zipfile
for whl in glob.glob(os.path.join(sys.argv[1], "pulp-*.whl")):
    tmp = whl + ".tmp"
    with zipfile.ZipFile(whl) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            if "/solverdir/" not in item.filename:
                dst.writestr(item, src.read(item.filename))
    os.replace(tmp, whl)
PY
ls "$dir"
