#!/usr/bin/env python3
"""Runs the GPU tests (ctest label `gpu`) one by one under compute-sanitizer and tallies the
errors, for docs/CUDA.md's record:

    python3 scripts/gpu_sanitize.py --build BUILD_DIR --tool memcheck [--tool initcheck ...]
        [--jobs N] [--deadline SECONDS] [--logs DIR] [--regex R] [--only FILE]

Each test's own command (from `ctest --show-only=json-v1`, with its working directory and
environment) runs under `compute-sanitizer --tool T --target-processes all` (a shell test's
strata processes are followed too), with one log file per test and tool (<test>.log, the
sanitizer's report; <test>.out, the test's own output). initcheck runs with
STRATA_CUDA_PRESET_GEMM_OUTPUTS=1 (core/device.h: initcheck does not record the stores of
cuBLAS's bf16 GEMMs, so their outputs are set first). Prints one line per test with errors or a
failure, then per tool: tests run, passed, failed, not started (deadline), and the sum of the
`ERROR SUMMARY` counts. Exits 1 if any sanitizer error was reported.
"""
import argparse
import concurrent.futures as cf
import json
import os
import re
import shutil
import subprocess
import sys
import time


def gpu_tests(build, regex):
    out = subprocess.run(["ctest", "--test-dir", build, "-L", "gpu", "--show-only=json-v1"]
                         + (["-R", regex] if regex else []),
                         check=True, capture_output=True, text=True).stdout
    tests = []
    for t in json.loads(out)["tests"]:
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        if "command" not in t or props.get("DISABLED"):
            continue
        env = dict(os.environ)
        for kv in props.get("ENVIRONMENT", []):
            k, _, v = kv.partition("=")
            env[k] = v
        tests.append({"name": t["name"], "command": t["command"], "cwd": props.get("WORKING_DIRECTORY", build),
                      "env": env, "timeout": float(props.get("TIMEOUT", 600))})
    return tests


def run_one(san, tool, test, logs, end):
    log = os.path.join(logs, tool, re.sub(r"[^A-Za-z0-9_.-]", "_", test["name"]) + ".log")
    env = dict(test["env"])
    env["STRATA_TEST_SANITIZER"] = tool  # tests/memory_bound.sh: the tool's memory is no part of the bound
    if tool == "initcheck":
        env["STRATA_CUDA_PRESET_GEMM_OUTPUTS"] = "1"
    left = end - time.time()
    if left < 5:
        return test["name"], "not started", 0
    cmd = [san, "--tool", tool, "--target-processes", "all", "--print-limit", "20",
           "--log-file", log] + test["command"]
    try:
        with open(log[:-len(".log")] + ".out", "w") as out:  # the test's own output
            rc = subprocess.run(cmd, cwd=test["cwd"], env=env, stdout=out, stderr=subprocess.STDOUT,
                                timeout=min(left, 4 * test["timeout"])).returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    text = open(log, errors="replace").read() if os.path.exists(log) else ""
    errors = sum(int(n) for n in re.findall(r"ERROR SUMMARY: (\d+) error", text))
    return test["name"], rc, errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--tool", action="append", required=True,
                    choices=["memcheck", "racecheck", "initcheck", "synccheck"])
    ap.add_argument("--jobs", type=int, default=2, help="tests at once per tool")
    ap.add_argument("--deadline", type=float, default=1e9, help="seconds after which no test starts")
    ap.add_argument("--logs", default="sanitizer-logs")
    ap.add_argument("--regex", default="")
    ap.add_argument("--only", help="a file of test names, one per line: run just these (the tests a "
                    "run with a deadline did not start)")
    args = ap.parse_args()
    san = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    tests = gpu_tests(args.build, args.regex)
    if args.only:
        wanted = set(open(args.only).read().split())
        tests = [t for t in tests if t["name"] in wanted]
    end = time.time() + args.deadline
    for tool in args.tool:
        os.makedirs(os.path.join(args.logs, tool), exist_ok=True)
    pool = cf.ThreadPoolExecutor(max_workers=args.jobs * len(args.tool))
    futures = {tool: [pool.submit(run_one, san, tool, t, args.logs, end) for t in tests] for tool in args.tool}
    total_errors = 0
    for tool, fs in futures.items():
        res = [f.result() for f in fs]
        ran = [r for r in res if r[1] != "not started"]
        passed = sum(1 for r in ran if r[1] == 0)
        errors = sum(r[2] for r in ran)
        total_errors += errors
        for name, rc, e in ran:
            if rc != 0 or e:
                print(f"{tool}: {name}: exit {rc}, {e} sanitizer errors")
        with open(os.path.join(args.logs, tool, "not_started.txt"), "w") as f:
            f.writelines(r[0] + "\n" for r in res if r[1] == "not started")
        print(f"{tool}: {len(ran)} of {len(res)} gpu tests run, {passed} passed, {len(ran) - passed} failed "
              f"or timed out, {len(res) - len(ran)} not started; sanitizer errors {errors}")
    sys.exit(1 if total_errors else 0)


if __name__ == "__main__":
    main()
