# Sourced by tests/peer/peer.sh and bench/gpu_bench.sh: makes nvidia-modelopt 0.47 importable on the
# GPU machine, which reaches no package index, from the wheels tests/peer/fetch_wheels.sh fetched on
# the development machine.
#   modelopt_env PYTHON WHEELS SITE
# installs every wheel of WHEELS with --no-deps into the folder SITE (once: kept when SITE already
# has modelopt; nothing system-wide), puts SITE first on PYTHONPATH (exported), and checks that
# PYTHON imports modelopt, torch and transformers, printing their versions. WHEELS "-": use the
# modelopt PYTHON already imports (a virtual environment), install nothing. Returns non-zero with
# one line on stderr saying what failed.
modelopt_env() {
  local py=$1 wheels=$2 site=$3
  if [ "$wheels" != - ]; then
    if [ ! -d "$site/modelopt" ]; then
      ls "$wheels"/*.whl >/dev/null 2>&1 ||
        { echo "modelopt_env: no wheels in $wheels (fetch them with tests/peer/fetch_wheels.sh)" >&2; return 1; }
      "$py" -m pip install -q --no-index --no-deps --target "$site" "$wheels"/*.whl ||
        { echo "modelopt_env: cannot install the wheels of $wheels into $site" >&2; return 1; }
    fi
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  "$py" -c "import modelopt, torch, transformers; print('modelopt', modelopt.__version__, \
'torch', torch.__version__, 'transformers', transformers.__version__)" ||
    { echo "modelopt_env: $py does not import modelopt, torch and transformers" >&2; return 1; }
}
