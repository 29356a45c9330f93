// Weight scale search (docs/QUANTIZE.md "Scale search"): ModelOpt 0.47's weight calibration
// algorithms `mse` (with or without `fp8_scale_sweep`) and `local_hessian`, as scalar CPU
// references. Each picks, for a weight whose per-tensor (group) amax A is fixed by max calibration,
// the amax (FP8) or block scales (NVFP4) that minimize a quantization error, and encodes the weight
// with them exactly as the export then writes it.
//
// What is searched (ModelOpt model_calib.py, calib/mse.py):
// - NVFP4 weights (W4A4 and W4A16) are ModelOpt's *static* NVFP4 quantizer: one amax per
//   16-block; weight_scale_2 = A * fl32(1/2688) stays the max-calibrated (group) value.
//   * fp8_scale_sweep: every positive finite E4M3 block scale is a candidate (bytes 0x01..0x7E,
//     126 values; ModelOpt's candidate amax is A * fl32(e4m3 / 448), whose exported byte is that
//     e4m3 value again).
//   * plain mse: the block's own amax a_b times each multiplier m of torch.linspace(start, stop,
//     ceil((stop - start) / step) + 1) (default 0.25..4.0 in 39 steps of 3.75/38, not 0.1).
// - FP8 per-tensor weights, plain mse only (fp8_scale_sweep skips them, as ModelOpt does): the
//   per-tensor amax A times each multiplier; over every weight of a shared-amax group together.
// - local_hessian: as mse, with the block error dwᵀ H dw where H is the 16x16 block of the
//   layer input's second moment E[x xᵀ] over the tokens that reached the module (BlockHessian).
//
// The error of a candidate is computed on what the export writes: the weight encoded with that
// candidate by the encoder of quant/nvfp4.h / fp8.h, decoded, subtracted from W (all exact in
// double), squared and summed in element order in double (or dwᵀ H dw in double). The first
// candidate (smallest scale) with the smallest error wins, as ModelOpt's argmin and strict `<`.
// ModelOpt evaluates candidates with its fake quantizer (scales computed in a different fp32
// order, GPU division by reciprocal, fp32 sums in kernel order); the candidate losses then differ
// in the last bits, so the two choose differently only where two candidates' errors tie to about
// 1e-6 relative (tests/quant/scale_search_test.cpp measures it against ModelOpt's own choices).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "quant/fp8.h"
#include "quant/nvfp4.h"

namespace strata {

// A recipe's `algorithm:` (ModelOpt's QuantizeAlgorithmConfig: MaxCalibConfig, MseCalibConfig,
// LocalHessianCalibConfig), with ModelOpt's defaults.
struct WeightCalib {
  enum class Method : uint8_t { kMax, kMse, kLocalHessian };
  Method method = Method::kMax;
  bool fp8_scale_sweep = false;  // ModelOpt's default: false for mse, true for local_hessian
  // Python floats in ModelOpt: the number of steps is computed in double.
  double step_size = 0.1;
  double start_multiplier = 0.25;
  double stop_multiplier = 4.0;
  bool searches() const { return method != Method::kMax; }
  bool operator==(const WeightCalib&) const = default;
};

std::string_view weight_calib_method_name(WeightCalib::Method m);  // "max", "mse", ...
// One line: "mse (fp8_scale_sweep)", "mse (multipliers 0.25..4, 39 steps)", "max".
std::string weight_calib_description(const WeightCalib& c);

// The multipliers of the plain (multiplier) search, as ModelOpt's MseCalibrator makes them:
// torch.linspace(start, stop, ceil((stop - start) / step) + 1) in fp32, whose CPU kernel computes
// element i as fma(step32, i, start) for i < n/2 and fma(-step32, n-1-i, stop) otherwise, with
// step32 = fl32((stop32 - start32) / (n - 1)).
std::vector<float> mse_multipliers(const WeightCalib& c);

// The block scale byte ModelOpt's export writes for a static NVFP4 per-block amax `block_amax`
// under the global amax A (qtensor/nvfp4_tensor.py, the static branch of
// get_weights_scaling_factor_from_quantizer), on the GPU (divisions by a Python number are
// products with the fp32 reciprocal, spec/format.md §1):
//   s = block_amax * fl32(1/6); s == 0 -> 1.0; s = (s * 448) / (A * fl32(1/6)); clamp to
//   [2^-9, 448]; e4m3 round to nearest even.
uint8_t nvfp4_static_block_scale(float block_amax, float global_amax);

// Why the CUDA backend cannot run this search (empty when it can): the device takes at most
// kMaxDeviceSearchCandidates candidates a block (quant/cuda/quant_cuda.h Nvfp4Search).
constexpr int kMaxDeviceSearchCandidates = 256;
std::string device_search_unsupported(const WeightCalib& c);

// fp8_scale_sweep's candidate block scales under the global amax A, in the order tried: the
// exported byte of each candidate amax A * fl32(e4m3 / 448) for the bytes 0x01..0x7E (which gives
// each byte back; computed, not assumed).
std::vector<uint8_t> nvfp4_sweep_scales(float global_amax);

// The per-input-block second moment of one linear's input, as ModelOpt's local_hessian
// accumulates it (_LocalHessianAccumulator): for each block n of 16 input features,
// H[n] = (Σ_t x_t[16n..16n+15] x_t[16n..16n+15]ᵀ) / tokens, a [cols/16, 16, 16] array. Here the
// sums are in double, in token order (deterministic for a fixed observation order).
// Memory: 16 * cols doubles per module (a routed expert: per expert).
class BlockHessian {
 public:
  explicit BlockHessian(int64_t cols);
  // Adds x[rows, cols] (row-major), one row per token.
  void accumulate(const float* x, int64_t rows);
  // Adds another accumulator's sums (another rank's, the same module).
  void merge(const BlockHessian& o);
  // Adds sums accumulated elsewhere (the GPU forward's, [cols/16][16][16]) over `tokens` rows.
  void add(std::span<const double> sums, int64_t tokens);
  int64_t cols() const { return cols_; }
  int64_t tokens() const { return tokens_; }
  // H[n] / tokens as [cols/16][16][16] (empty when no token was seen).
  std::vector<double> normalized() const;
  const std::vector<double>& sums() const { return sums_; }

 private:
  int64_t cols_ = 0;
  int64_t tokens_ = 0;
  std::vector<double> sums_;  // [cols/16][16][16]
};

// NVFP4 block scales of `weight` [..., out, in] chosen by `c` (fp8_scale_sweep or multipliers)
// with weight_scale_2 from `global_amax` (the group amax, >= max|W|). `hessian`: the module's
// BlockHessian::normalized() ([in/16][16][16]) for local_hessian, or empty for the squared error.
// One byte per block, row-major [..., out, in/16]. Throws strata::Error naming `name` as
// nvfp4_quantize does.
std::vector<uint8_t> nvfp4_search_block_scales(const Tensor& weight, float global_amax,
                                               const WeightCalib& c,
                                               std::span<const double> hessian,
                                               std::string_view name);

// Encoding with the chosen bytes: nvfp4_quantize_with_scales (quant/nvfp4.h).

// The FP8 per-tensor amax chosen by plain mse over the weights of one shared-amax group (each
// encoded by fp8_quantize's arithmetic, errors summed over all of them) from their max amax A.
float fp8_search_amax(std::span<const Tensor> weights, float amax, const WeightCalib& c,
                      std::string_view name);

namespace quant_detail {
// The error of one 16-block of `w` encoded with scale byte `scale` under weight_scale_2 `global`
// (Σ dw², or dwᵀ H dw with `h` the block's 16x16 Hessian row-major; nullptr for the former): the
// scalar reference of the searches' candidate error.
double nvfp4_block_error(const float* w, uint8_t scale, float global, const double* h);
// The same value computed faster, as the searches do: `descale` = e4m3_to_f32(scale) * global,
// `ht` the block's Hessian transposed (column-major) or nullptr. Equal to the reference bit for
// bit (tests/quant/scale_search_test.cpp).
double nvfp4_block_error_fast(const float* w, float descale, const double* ht);
}  // namespace quant_detail

}  // namespace strata
