// strata compare's serving simulation on the device (kernels: ops/cuda/fake_quant.cu): a
// quantized linear's input and the KV cache fake-quantized as a server quantizes them
// (quant/quantized.h ActQuant; docs/COMPARE.md "What is simulated"). Conventions:
// ops/cuda/convert.h. The caller validates first (CudaBackend runs the CPU function's own checks:
// the block divides the row, the scale is a positive finite number).
//
// Bit-identical to the CPU references, element for element, NaN and infinities included: the same
// fp32 operations in the same order, each an explicit round-to-nearest intrinsic (no contraction
// into FMAs), and quant/encode.h's e4m3 / e2m1 encoders. x[n] holds whole rows (n a multiple of
// the block), so the blocks run along the rows as on the CPU.
#pragma once

#include <cstdint>

namespace strata::ops::cuda {

// quant/nvfp4.h nvfp4_fake_quantize: 16-blocks, dynamic E4M3 scales under the static global
// `global_scale`.
void fake_quantize_nvfp4(float* x, int64_t n, float global_scale, void* stream);
// quant/fp8.h fp8_fake_quantize: per tensor, static `scale`.
void fake_quantize_fp8(float* x, int64_t n, float scale, void* stream);
// quant/mxfp8.h mxfp8_fake_quantize: 32-blocks, dynamic E8M0 scales.
void fake_quantize_mxfp8(float* x, int64_t n, void* stream);

}  // namespace strata::ops::cuda
