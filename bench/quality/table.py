#!/usr/bin/env python3
"""The table of the quality benchmark (docs/QUALITY.md) from what run_quality.sh wrote in OUT:
OUT/times.tsv (row, device, quantize s, compare s), OUT/json/<row>.json (`strata compare --json`),
OUT/json/<row>.weights.json (the same with --no_act_sim, when run) and OUT/json/train_summary.json
(when the model was trained). Prints a Markdown table and writes OUT/results.json.

    python3 bench/quality/table.py OUT
"""
import json
import os
import sys

NAMES = {
    "bf16": "bf16 (source vs itself)",
    "fp8": "FP8 W8A8, all linears",
    "nvfp4_experts_only": "NVFP4 W4A4, routed experts only (max)",
    "nvfp4_max": "NVFP4 W4A4, all linears, max",
    "nvfp4_mse": "NVFP4 W4A4, all linears, mse",
    "nvfp4_fp8_scale_sweep": "NVFP4 W4A4, all linears, fp8_scale_sweep",
    "nvfp4_local_hessian": "NVFP4 W4A4, all linears, local_hessian",
}


def fmt(v, digits=4):
    if v is None:
        return "-"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def kl(v):
    """A KL in nats, 3 significant digits in scientific notation (0 as 0)."""
    return "-" if v is None else "0" if v == 0 else f"{v:.2e}"


def main():
    out = sys.argv[1]
    rows = []
    with open(os.path.join(out, "times.tsv")) as f:
        for line in f:
            if line.strip():
                row, device, q_s, c_s = line.rstrip("\n").split("\t")
                rows.append((row, device, float(q_s), float(c_s)))
    results = {"rows": []}
    summary_path = os.path.join(out, "json", "train_summary.json")
    if os.path.exists(summary_path):
        results["train"] = json.load(open(summary_path))
    base = None
    order = list(NAMES)
    rows.sort(key=lambda r: order.index(r[0]) if r[0] in order else len(order))
    for row, device, q_s, c_s in rows:
        r = json.load(open(os.path.join(out, "json", f"{row}.json")))
        w_path = os.path.join(out, "json", f"{row}.weights.json")
        w = json.load(open(w_path)) if os.path.exists(w_path) else None
        entry = {"row": row, "device": device, "quantize_s": q_s, "compare_s": c_s,
                 **{k: r[k] for k in ("quant_algo", "mean_kl", "median_kl", "p99_kl", "max_kl",
                                      "top1_agreement", "ppl_source", "ppl_quantized", "positions")},
                 "weights_only_mean_kl": w["mean_kl"] if w else None}
        if row == "nvfp4_max":
            base = entry
        results["rows"].append(entry)
    for e in results["rows"]:
        if base and e["row"].startswith("nvfp4_") and e["row"] not in ("nvfp4_experts_only", "nvfp4_max") \
                and base["mean_kl"] > 0:
            e["mean_kl_vs_max"] = e["mean_kl"] / base["mean_kl"] - 1
            if base["weights_only_mean_kl"] and e["weights_only_mean_kl"] is not None:
                e["weights_only_mean_kl_vs_max"] = e["weights_only_mean_kl"] / base["weights_only_mean_kl"] - 1
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)

    any_w = any(e["weights_only_mean_kl"] is not None for e in results["rows"])
    head = ["recipe", "mean KL", "vs max", "median KL", "p99 KL", "top-1", "ppl source", "ppl quantized",
            "quantize s (device)"]
    if any_w:
        head[3:3] = ["weights-only mean KL", "vs max"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for e in results["rows"]:
        vs = e.get("mean_kl_vs_max")
        baseline = "baseline" if e["row"] == "nvfp4_max" else ""
        cells = [NAMES.get(e["row"], e["row"]), kl(e["mean_kl"]), f"{vs:+.1%}" if vs is not None else baseline,
                 kl(e["median_kl"]), kl(e["p99_kl"]), fmt(e["top1_agreement"]), fmt(e["ppl_source"], 3),
                 fmt(e["ppl_quantized"], 3),
                 "-" if e["row"] == "bf16" else f"{e['quantize_s']:.1f} ({e['device']})"]
        if any_w:
            wv = e.get("weights_only_mean_kl_vs_max")
            cells[3:3] = [kl(e["weights_only_mean_kl"]), f"{wv:+.1%}" if wv is not None else
                          (baseline if e["weights_only_mean_kl"] is not None else "")]
        print("| " + " | ".join(cells) + " |")
    if rows:
        print(f"\n{results['rows'][0]['positions']} positions per row; compare took "
              f"{sum(r[3] for r in rows):.0f} s in all, quantize {sum(r[2] for r in rows):.0f} s.")


if __name__ == "__main__":
    main()
