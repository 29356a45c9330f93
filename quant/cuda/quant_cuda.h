// The weight quantizers of quant/nvfp4.h, quant/fp8.h and quant/mxfp8.h on a CUDA device,
// behind host launchers (docs/CUDA.md). Bit-identical to the CPU references: the same fp32
// operations in the same order, each rounded on its own (compiled with -fmad=false), and the
// same scale rules (reciprocal products, clamps, amax-0 and NaN rules of each format's header).
// Including this header needs no CUDA header; library strata_quant_cuda (CUDA builds only).
//
// Weights are device buffers of dtype BF16, F16 or F32 in the checkpoint's layout, any leading
// dimensions flattened into `rows`: W[rows, cols], blocks along cols. Outputs are device
// buffers with the byte layouts documented on Nvfp4Weight, Fp8Weight and Mxfp8Weight.
// Each quantizer checks its weight on the device (non-finite elements, |W| above the amax it
// was given), then SYNCHRONIZES the stream and throws strata::Error naming `name` as the CPU
// version does.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/device.h"
#include "core/dtype.h"

namespace strata::quant::cuda {

using strata::cuda::Stream;

// *out = max(*out, max |w|) over n elements of a BF16/F16/F32 device buffer (the per-tensor
// weight amax; NaN propagates). out is a device fp32 slot initialised by the caller. Exact.
void weight_amax(const void* w, DType dtype, int64_t n, float* out, Stream& stream);

// NVFP4: packed U8 [rows, cols/2], block_scale F8_E4M3 bytes [rows, cols/16]. weight_amax (host
// value) as for nvfp4_quantize. Returns weight_scale_2 = nvfp4_global_scale(weight_amax).
float nvfp4_quantize(const void* w, DType dtype, int64_t rows, int64_t cols, float weight_amax,
                     uint8_t* packed, uint8_t* block_scale, std::string_view name, Stream& stream);
// nvfp4_quantize in two halves, so that a caller synchronizes once for the codes and the checks:
// nvfp4_quantize_deferred throws at once for what the host can check (the amax), launches the
// encoder with its device checks in `checks` (two device words from check_slots), and returns
// weight_scale_2; once the stream has run and the two words are on the host (copied with the
// codes), nvfp4_check throws as nvfp4_quantize would.
unsigned long long* check_slots(Stream& stream);  // the stream's two words, set to "none"
// A weight scale search's candidates (quant/scale_search.h nvfp4_search_block_scales, whose
// arithmetic the device repeats exactly): every block tries `bytes` (fp8_scale_sweep) or its own
// amax times each of `multipliers` (mse) and keeps the first with the least squared error.
constexpr int kMaxSearchCandidates = 256;  // ModelOpt's defaults: 126 bytes, 39 multipliers
struct Nvfp4Search {
  bool sweep = false;
  int count = 0;
  // local_hessian: the module's BlockHessian::normalized() on the device ([cols/16][16][16]) and
  // cols/16; null: the squared error.
  const double* hessian = nullptr;
  int64_t blocks_per_row = 0;
  uint8_t bytes[kMaxSearchCandidates] = {};
  float multipliers[kMaxSearchCandidates] = {};
};
// search: nullptr for each block's own scale (max calibration).
float nvfp4_quantize_deferred(const void* w, DType dtype, int64_t rows, int64_t cols,
                              float weight_amax, uint8_t* packed, uint8_t* block_scale,
                              std::string_view name, unsigned long long* checks, Stream& stream,
                              const Nvfp4Search* search = nullptr);
void nvfp4_check(const unsigned long long checks[2], std::string_view name, float weight_amax,
                 int64_t cols);

// FP8 per tensor: out F8_E4M3 bytes [n]. Returns weight_scale = fp8_weight_scale(weight_amax).
// fp32_quotient: divide in fp32 by the fp32 scale whatever the dtype, as for an F32 copy of the
// weight (ops::StoredWeight::fp32_quotient).
float fp8_quantize(const void* w, DType dtype, int64_t n, float weight_amax, uint8_t* out,
                   std::string_view name, Stream& stream, bool fp32_quotient = false);

// MXFP8: out F8_E4M3 bytes [rows, cols], scale E8M0 bytes [rows, cols/32].
void mxfp8_quantize(const void* w, DType dtype, int64_t rows, int64_t cols, uint8_t* out,
                    uint8_t* scale, std::string_view name, Stream& stream);

}  // namespace strata::quant::cuda
