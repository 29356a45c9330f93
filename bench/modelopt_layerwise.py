#!/usr/bin/env python3
"""The peer of bench/gpu_bench.sh's capped strata run: ModelOpt 0.47's own path for a model larger
than the GPU, on the same checkpoint, tokens and cap (docs/PERFORMANCE.md, "The ModelOpt peer").

    modelopt_layerwise.py --model DIR --tokens FILE --export DIR --cap_gib X
                          [--recipe general/ptq/nvfp4_experts_only-kv_fp8_layerwise_offload]
                          [--offload_folder DIR] [--json FILE]

1. Load: transformers' from_pretrained(DIR, dtype bf16, device_map "auto") with max_memory
   {GPU 0: X GiB, cpu: the host's free memory}: accelerate places what fits in X GiB on the GPU
   and offloads the rest to host memory (its weights stay on the meta device, the real values in
   accelerate's hooks). X is strata's --max_gpu_memory_gb. Without CUDA (a check of this script
   on a CPU machine) the cap is host memory instead, {cpu: X GiB}, and the rest is offloaded to
   disk under --offload_folder: the same offload hooks, so the same ModelOpt code runs.
2. Calibrate: mtq.quantize with the recipe's quantize section (load_recipe, as hf_ptq --recipe
   does; tests/peer/modelopt_peer.py's modelopt_cfg). Its layerwise section makes ModelOpt
   calibrate one decoder layer at a time (model_calib.layerwise_calibrate: each layer materialized
   on the GPU once, its inputs captured from the previous layer), and calib_mutates_weights false
   leaves the offloaded weights where they are. The forward loop pushes every sequence of FILE
   (JSONL token-id lists, the file strata calibrates on), one unpadded sequence per forward, batch
   1, as tests/peer/modelopt_peer.py does.
3. Export: export_hf_checkpoint, which streams an offloaded model layer by layer.

Progress goes to stdout as it happens, so a run killed by a deadline still says how far it got:
"modelopt_layerwise: loaded in S s (...)", then "modelopt_layerwise: layer N/M calibrated at S s"
(S counted from the start of mtq.quantize; the lines come from wrapping the progress bar that
layerwise_calibrate advances once a layer, the only per-layer signal ModelOpt gives), then
"modelopt_layerwise: calibrated in S s", "modelopt_layerwise: exported in S s" and one JSON line
with every time (also written to --json).
"""
import argparse
import json
import os
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "tests", "peer"))


def say(msg):
    print("modelopt_layerwise: " + msg, flush=True)


def host_free_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise SystemExit("modelopt_layerwise: no MemAvailable in /proc/meminfo")


def load(model_dir, cap_gib, offload_folder):
    """The model dispatched by accelerate under the cap, and where its modules went."""
    import torch
    from transformers import AutoModelForCausalLM

    kwargs = dict(dtype=torch.bfloat16, device_map="auto")
    if torch.cuda.is_available():
        # Host memory for the offloaded layers: what is free now, less 4 GiB for the process.
        kwargs["max_memory"] = {0: "%.3fGiB" % cap_gib,
                                "cpu": max(host_free_bytes() - (4 << 30), 1 << 30)}
    else:
        if not offload_folder:
            raise SystemExit("modelopt_layerwise: without CUDA the offload goes to disk: pass "
                             "--offload_folder DIR")
        kwargs["max_memory"] = {"cpu": "%.3fGiB" % cap_gib}
        kwargs["offload_folder"] = offload_folder
    model = AutoModelForCausalLM.from_pretrained(model_dir, **kwargs)
    model.eval()
    placed = {}
    for where in (getattr(model, "hf_device_map", None) or {}).values():
        key = str(where) if not isinstance(where, int) else "cuda:%d" % where
        placed[key] = placed.get(key, 0) + 1
    return model, placed


def report_layers(total_hint=None):
    """Wraps the tqdm class model_calib uses so that every layer layerwise_calibrate finishes
    prints a line with the time since calibration began. Returns the start-time cell."""
    from modelopt.torch.quantization import model_calib

    state = {"t0": None}
    base = getattr(model_calib, "tqdm", None)
    if base is None:
        say("no progress bar in model_calib to follow: no per-layer lines")
        return state

    class LayerProgress(base):
        def update(self, n=1):
            out = super().update(n)
            if str(getattr(self, "desc", "")).startswith("Layerwise calibration"):
                say("layer %d/%s calibrated at %.2f s" % (
                    self.n, self.total or total_hint or "?", time.perf_counter() - state["t0"]))
            return out

    model_calib.tqdm = LayerProgress
    return state


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--tokens", required=True)
    p.add_argument("--export", required=True)
    p.add_argument("--cap_gib", type=float, required=True)
    p.add_argument("--recipe", default="general/ptq/nvfp4_experts_only-kv_fp8_layerwise_offload")
    p.add_argument("--offload_folder")
    p.add_argument("--json")
    a = p.parse_args()

    import torch
    import modelopt
    import modelopt.torch.quantization as mtq
    import transformers
    from modelopt.torch.export import export_hf_checkpoint
    from modelopt_peer import modelopt_cfg

    cuda = torch.cuda.is_available()
    seqs = [json.loads(line) for line in open(a.tokens) if line.strip()]
    say("modelopt %s, transformers %s, torch %s; %d sequences; recipe %s; cap %.3f GiB of %s" % (
        modelopt.__version__, transformers.__version__, torch.__version__, len(seqs), a.recipe,
        a.cap_gib, "GPU memory" if cuda else "host memory (no CUDA: the rest offloaded to disk)"))

    t0 = time.perf_counter()
    model, placed = load(a.model, a.cap_gib, a.offload_folder)
    t_load = time.perf_counter() - t0
    say("loaded in %.2f s (modules by device: %s)" % (t_load, json.dumps(placed, sort_keys=True)))
    offloaded = [d for d in placed if d in ("cpu", "disk")] if cuda else \
        [d for d in placed if d == "disk"]
    if not offloaded:
        say("warning: nothing offloaded: the whole model fits in the cap")
    if offloaded and len(placed) == len(offloaded):
        say("warning: everything offloaded: no module fits in the cap (ModelOpt's export then "
            "fails: its dummy forward starts on the meta device)")

    device = torch.device("cuda" if cuda else "cpu")

    def forward_loop(m):
        with torch.no_grad():
            for ids in seqs:  # one unpadded sequence per forward
                m(input_ids=torch.tensor([ids], dtype=torch.long, device=device))

    cfg = modelopt_cfg(a.recipe)
    progress = report_layers(getattr(model.config, "num_hidden_layers", None))
    t1 = time.perf_counter()
    progress["t0"] = t1
    mtq.quantize(model, cfg, forward_loop=forward_loop)
    t_calib = time.perf_counter() - t1
    say("calibrated in %.2f s" % t_calib)

    t2 = time.perf_counter()
    export_hf_checkpoint(model, export_dir=a.export)
    t_export = time.perf_counter() - t2
    say("exported in %.2f s" % t_export)

    out_bytes = sum(os.path.getsize(os.path.join(a.export, f)) for f in os.listdir(a.export)
                    if f.endswith(".safetensors"))
    result = {
        "modelopt": modelopt.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "recipe": a.recipe,
        "cap_gib": a.cap_gib,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "placed": placed,
        "layers": getattr(model.config, "num_hidden_layers", None),
        "sequences": len(seqs),
        "load_s": t_load,
        "calib_s": t_calib,
        "export_s": t_export,
        "total_s": t_load + t_calib + t_export,
        "export_bytes": out_bytes,
        "peak_gpu_bytes": torch.cuda.max_memory_allocated() if cuda else 0,
    }
    print(json.dumps(result), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
