#!/usr/bin/env bash
# A recipe that cannot apply must stop before any work: exit 1, one line naming the rule and the
# module, and no export directory created.
#   tests/export/expect_refused.sh STRATA MODEL RECIPE EXPECTED_SUBSTRING
set -uo pipefail
strata=$1 model=$2 recipe=$3 expected=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$strata" quantize --model "tests/fixtures/models/$model" --recipe "$recipe" --export_path "$work/out" \
  > "$work/stdout" 2> "$work/stderr"
rc=$?
cat "$work/stderr"
[ "$rc" -eq 1 ] || { echo "expected exit 1, got $rc"; exit 1; }
[ "$(wc -l < "$work/stderr")" -eq 1 ] || { echo "expected one line on stderr"; exit 1; }
grep -qF -- "$expected" "$work/stderr" || { echo "stderr lacks: $expected"; exit 1; }
[ ! -e "$work/out" ] || { echo "the export directory was created"; exit 1; }
echo ok
