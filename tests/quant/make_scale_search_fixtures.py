#!/usr/bin/env python3
"""Weight scale search choices made by NVIDIA ModelOpt 0.47 itself, on the CPU, for
tests/quant/scale_search_test.cpp.

Regenerate (from the repository root; ModelOpt 0.47, torch CPU and triton installed):

    /work/venv/bin/python tests/quant/make_scale_search_fixtures.py \
        --out tests/quant/fixtures/scale_search.safetensors

Each case is one nn.Linear (no bias) quantized with mtq.quantize and an `algorithm` as ModelOpt's
recipes write it; the weight quantizer is ModelOpt's static NVFP4 (`nvfp4_static`: e2m1, 16-blocks,
e4m3 static block scales) or per-tensor FP8 (e4m3); input quantizers are disabled (they do not
take part in the weight search). What is stored per case `<c>`:

    <c>/weight        F32 [out, in]   bf16-representable values
    <c>/input         F32 [tokens, in] (local_hessian only: the calibration input)
    <c>/amax          F32             the weight quantizer's _amax after calibration: per block
                                      [out * in/16] for NVFP4, 0-d for FP8
    <c>/global_amax   F32 []          NVFP4: the quantizer's global_amax (weight_scale_2 * 2688)
    <c>/export_scale  U8  [out, in/16] NVFP4: ModelOpt's exported weight_scale bytes
                                      (NVFP4QTensor.get_weights_scaling_factor_from_quantizer, on
                                      the CPU)
    mse_multipliers   F32 [n]         the MseCalibrator's candidate multipliers (default config)

Which ModelOpt path ran (also written to the safetensors metadata, key "path"): there is no CUDA
here, so NVFP4MSECalibrator takes its reference sweep (`_run_reference_collect`: MseCalibrator's
candidate loop with F.mse_loss, or the local_hessian einsum error), and each candidate's fake
quantization is ModelOpt's own Triton kernel static_blockwise_fp4_fake_quant, run by Triton's CPU
interpreter (TRITON_INTERPRET=1). Three shims make that possible, none changes arithmetic:
torch.cuda.device becomes a null context (the kernel launcher enters it), triton's libdevice.isnan
becomes `x != x` (the interpreter has no libdevice), and tensor_quant's triton_kernel handle is
pointed at the imported kernel module (its package import is gated on torch.cuda.is_available()).
FP8 fake quantization on the CPU is ModelOpt's PyTorch _fp8_eager. Slow (the interpreter runs one
program per block and candidate): about three minutes.
"""

import argparse
import contextlib
import json
import os
import types

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

torch.cuda.device = lambda *a, **k: contextlib.nullcontext()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402,F401  (must be visible to the jit function below)


@triton.jit
def _isnan(x):
    return x != x


import modelopt  # noqa: E402
import modelopt.torch.kernels.quantization.common.nvfp4_quant as _nq  # noqa: E402

_nq.libdevice = types.SimpleNamespace(isnan=_isnan)
import modelopt.torch.kernels.quantization.gemm.fp4_kernel as _fk  # noqa: E402
import modelopt.torch.quantization.tensor_quant as _tq  # noqa: E402

_tq.triton_kernel.IS_AVAILABLE = True
_tq.triton_kernel.static_blockwise_fp4_fake_quant = _fk.static_blockwise_fp4_fake_quant

import modelopt.torch.quantization as mtq  # noqa: E402
from modelopt.torch.quantization.calib.mse import MseCalibrator  # noqa: E402
from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

NVFP4_STATIC = {"num_bits": (2, 1), "enable": True,
                "block_sizes": {-1: 16, "type": "static", "scale_bits": (4, 3)}}
FP8 = {"num_bits": (4, 3), "axis": None, "enable": True}


def bf16(t):
    return t.to(torch.bfloat16).to(torch.float32)


def quantize(weight, weight_cfg, algorithm, inputs):
    out_f, in_f = weight.shape
    model = torch.nn.Sequential(torch.nn.Linear(in_f, out_f, bias=False))
    with torch.no_grad():
        model[0].weight.copy_(weight)
    cfg = {"quant_cfg": [{"quantizer_name": "*", "enable": False},
                         {"quantizer_name": "*weight_quantizer", "cfg": weight_cfg}],
           "algorithm": algorithm}
    mtq.quantize(model, cfg, lambda m: m(inputs))
    return model[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(20)
    tensors, cases = {}, {}

    def weights_normal(o, i):
        return bf16(torch.randn(o, i, generator=g) * 0.02)

    def weights_heavy(o, i):  # student-t like: a few large outliers per row
        w = torch.randn(o, i, generator=g) / torch.rand(o, i, generator=g).clamp_min(0.05)
        return bf16(w * 0.01)

    def nvfp4_case(name, weight, algorithm, inputs=None):
        x = inputs if inputs is not None else torch.randn(4, weight.shape[1], generator=g)
        lin = quantize(weight, NVFP4_STATIC, algorithm, x)
        q = lin.weight_quantizer
        scale, _ = NVFP4QTensor.get_weights_scaling_factor_from_quantizer(q, lin.weight)
        tensors[f"{name}/weight"] = weight.contiguous()
        if inputs is not None:
            tensors[f"{name}/input"] = inputs.contiguous()
        tensors[f"{name}/amax"] = q._amax.float().reshape(-1).contiguous()
        tensors[f"{name}/global_amax"] = q.global_amax.float().reshape(()).contiguous()
        tensors[f"{name}/export_scale"] = scale.view(torch.uint8).contiguous()
        cases[name] = {"algorithm": algorithm, "quantizer": type(q).__name__,
                       "calibrator": type(q._calibrator).__name__}

    # fp8_scale_sweep (general/ptq/nvfp4_*_mse-kv_fp8_cast): a normal and a heavy-tailed weight;
    # the second has an all-zero block and a row far below the tensor amax.
    nvfp4_case("sweep_normal", weights_normal(16, 64), {"method": "mse", "fp8_scale_sweep": True})
    w = weights_heavy(16, 64)
    w[3, 16:32] = 0.0
    w[5] *= 1e-3
    nvfp4_case("sweep_heavy", w, {"method": "mse", "fp8_scale_sweep": True})
    # Plain mse (multiplier search) on the static per-block amax.
    nvfp4_case("mse_blocks", weights_heavy(16, 64), {"method": "mse"})
    # local_hessian (its default fp8_scale_sweep: true): inputs with correlated features and a
    # few dominant channels, so the Hessian weighting changes choices.
    base = torch.randn(256, 64, generator=g)
    mix = torch.randn(64, 64, generator=g) * 0.3 + torch.eye(64)
    x = bf16(base @ mix * torch.linspace(0.2, 3.0, 64))
    nvfp4_case("hessian", weights_heavy(16, 64), {"method": "local_hessian"}, inputs=x)
    # Plain mse on an FP8 per-tensor weight.
    wf = weights_heavy(32, 48)
    lin = quantize(wf, FP8, {"method": "mse"}, torch.randn(4, 48, generator=g))
    tensors["fp8_mse/weight"] = wf.contiguous()
    tensors["fp8_mse/amax"] = lin.weight_quantizer._amax.float().reshape(()).contiguous()
    cases["fp8_mse"] = {"algorithm": {"method": "mse"},
                        "calibrator": type(lin.weight_quantizer._calibrator).__name__}

    cal = MseCalibrator(amax=torch.tensor(1.0))
    tensors["mse_multipliers"] = cal._generate_candidates("cpu").float().contiguous()

    meta = {"modelopt": modelopt.__version__, "torch": torch.__version__,
            "triton": triton.__version__,
            "path": "NVFP4MSECalibrator reference sweep; static_blockwise_fp4_fake_quant Triton "
                    "kernel under TRITON_INTERPRET=1; FP8 via _fp8_eager (CPU)",
            "cases": json.dumps(cases)}
    save_file(tensors, args.out, metadata=meta)
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
