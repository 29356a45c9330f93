#!/usr/bin/env bash
# `strata compare --report` opened in a headless browser (Debian's chromium-headless-shell,
# installed by scripts/install_deps.sh): the qwen3_moe fixture against its NVFP4 export, made
# here from one calibration sequence (so that some experts get no calibration token and the heat
# map marks them), with every plot rendered: the page's own script must report
# data-plots-rendered="3 of 3" in the DOM after the scripts ran, and a screenshot of the page must
# decode (tests/core/png_decode.py) as a PNG of the window's size that is not blank. The same page
# with one plot's bytes broken must say "2 of 3" and show the notice. The report and the
# screenshot stay in OUT_DIR for a person to look at.
#   tests/cli/report_browser_test.sh STRATA OUT_DIR
set -euo pipefail
strata=$1 out=$2
browser=${STRATA_BROWSER:-$(command -v chromium-headless-shell || true)}
if [ -z "$browser" ] || [ ! -x "$browser" ]; then
  echo "FAIL: chromium-headless-shell not found (needed to open the report in a browser);" \
       "install it with scripts/install_deps.sh (apt-get install chromium-headless-shell)" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$out"
mkdir -p "$out"
fixture=tests/fixtures/models/qwen3_moe

python3 - "$work" <<'PY'
import json, sys
ref = json.load(open("tests/fixtures/compare/reference.json"))
with open(f"{sys.argv[1]}/calib.jsonl", "w") as f:
    for s in ref["idle_experts"]["calib_tokens"]:
        f.write(json.dumps(s) + "\n")
with open(f"{sys.argv[1]}/tokens.jsonl", "w") as f:
    for s in ref["cases"]["qwen3_moe.nvfp4-kv_fp8"]["tokens"]:
        f.write(json.dumps(s) + "\n")
PY
"$strata" quantize -q --device cpu --model "$fixture" --recipe nvfp4_experts_only-kv_fp8 \
  --calib_data "$work/calib.jsonl" --calib_size 1 --export_path "$work/export" > /dev/null
"$strata" compare -q "$fixture" "$work/export" --tokens "$work/tokens.jsonl" --report "$out" > /dev/null
for f in report.html layer_error.png kl_histogram.png expert_coverage.png; do
  [ -s "$out/$f" ] || { echo "FAIL: --report wrote no $f" >&2; exit 1; }
done

# The browser: --no-sandbox (it refuses to run as root otherwise), its profile and HOME in the
# scratch folder, a time budget for the load event and the page's script.
run_browser() {
  HOME="$work" timeout 120 "$browser" --no-sandbox --disable-gpu --user-data-dir="$work/profile" \
    --virtual-time-budget=5000 "$@" 2> "$work/browser.log"
}
rendered() {
  run_browser --dump-dom "file://$1" > "$work/dom.html" || {
    echo "FAIL: $browser --dump-dom failed:" >&2; tail -5 "$work/browser.log" >&2; exit 1; }
  grep -o 'data-plots-rendered="[^"]*"' "$work/dom.html" | head -1 | sed 's/.*="\(.*\)"/\1/'
}
got=$(rendered "$(realpath "$out/report.html")")
if [ "$got" != "3 of 3" ]; then
  echo "FAIL: data-plots-rendered is '$got', not '3 of 3'" >&2
  exit 1
fi
echo "data-plots-rendered=\"$got\""

width=1200 height=2400
run_browser --hide-scrollbars --screenshot="$out/screenshot.png" --window-size=$width,$height \
  "file://$(realpath "$out/report.html")" || {
  echo "FAIL: the screenshot failed:" >&2; tail -5 "$work/browser.log" >&2; exit 1; }
info=$(python3 tests/core/png_decode.py "$out/screenshot.png" --info)
echo "screenshot: $info"
python3 - "$info" "$width" "$height" <<'PY'
import json, sys
i, w, h = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
assert (i["width"], i["height"]) == (w, h), f"screenshot is {i['width']} x {i['height']}, not {w} x {h}"
# A blank (white) page has one colour; the report has text, tables and three plots (viridis).
assert i["colors"] >= 50, f"screenshot has only {i['colors']} colours: blank?"
assert i["non_background"] >= 0.05, f"only {i['non_background']:.3f} of the screenshot is not background"
PY

# A plot whose bytes are broken: the script must notice it and say so on the page.
python3 - "$out/report.html" "$work/broken.html" <<'PY'
import sys
html = open(sys.argv[1]).read()
at = html.index("data:image/png;base64,") + len("data:image/png;base64,")
open(sys.argv[2], "w").write(html[:at] + "AAAAbroken" + html[at + 10:])
PY
got=$(rendered "$work/broken.html")
if [ "$got" != "2 of 3" ]; then
  echo "FAIL: a broken plot gives data-plots-rendered '$got', not '2 of 3'" >&2
  exit 1
fi
grep -q 'This plot did not render' "$work/dom.html" || { echo "FAIL: no notice for the broken plot" >&2; exit 1; }
echo "a broken plot: data-plots-rendered=\"$got\" and a notice"
echo "PASS: $out/report.html, $out/screenshot.png"
