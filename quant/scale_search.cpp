#include "quant/scale_search.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/parallel.h"
#include "quant/encode.h"

namespace strata {

namespace {

constexpr int64_t kBlock = kNvfp4BlockSize;
constexpr float kInv6 = 1.0f / 6.0f;  // fl32(1/6): GPU division by the Python number 6.0
// ModelOpt's candidates: the positive finite e4m3 values, bytes 0x01 (2^-9) to 0x7E (448).
constexpr uint8_t kFirstE4m3 = 0x01, kLastE4m3 = 0x7E;

}  // namespace

namespace quant_detail {

// The error of one NVFP4 block encoded with scale byte `scale` under weight_scale_2 `global`:
// Σ dw² (hessian empty) or dwᵀ H dw (H the block's 16x16), in double. dw = W - decode(encode(W))
// is exact in double: both are fp32 values. The reference of nvfp4_block_error_fast.
double nvfp4_block_error(const float* w, uint8_t scale, float global, const double* h) {
  const float descale = e4m3_to_f32(scale) * global;  // fl32 product, as the encoder
  double dw[kBlock];
  for (int64_t i = 0; i < kBlock; ++i) {
    const float q = e2m1_to_f32(quant_detail::fast_f32_to_e2m1(w[i] / descale)) * descale;
    dw[i] = static_cast<double>(w[i]) - static_cast<double>(q);
  }
  double e = 0.0;
  if (h == nullptr) {
    for (int64_t i = 0; i < kBlock; ++i)
      e += dw[i] * dw[i];
    return e;
  }
  for (int64_t i = 0; i < kBlock; ++i) {
    double row = 0.0;
    for (int64_t j = 0; j < kBlock; ++j)
      row += h[i * kBlock + j] * dw[j];
    e += dw[i] * row;
  }
  return e;
}

// nvfp4_block_error with the same roundings in the same order, restructured for speed: the
// descale given (e4m3_to_f32(scale) * global, computed once a candidate), the E2M1 code's
// magnitude computed from the thresholds it passes (0.5 each of the first four, 1 each of the next
// two, 6 above 5: the values of e2m1_to_f32 exactly), and the Hessian given transposed (ht[j][i] =
// H[i][j]), so that the sixteen row sums advance together over j, each still summed in j order
// from 0.0 (vectorizable; no FMA, the library is compiled with -ffp-contract=off).
namespace {
[[gnu::always_inline]] inline double block_error_fast(const float* w, float descale,
                                                      const double* ht) {
  double dw[kBlock];
  for (int64_t i = 0; i < kBlock; ++i) {
    const float x = w[i] / descale;
    const float a = std::fabs(x);
    const float m =
        !(a <= 5.0f)
            ? 6.0f
            : 0.5f * static_cast<float>((a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f)) +
                  static_cast<float>((a > 2.5f) + (a >= 3.5f));
    const float q = (x < 0.0f ? -m : m) * descale;
    dw[i] = static_cast<double>(w[i]) - static_cast<double>(q);
  }
  double e = 0.0;
  if (ht == nullptr) {
    for (int64_t i = 0; i < kBlock; ++i)
      e += dw[i] * dw[i];
    return e;
  }
  double row[kBlock] = {};
  for (int64_t j = 0; j < kBlock; ++j) {
    for (int64_t i = 0; i < kBlock; ++i)
      row[i] += ht[j * kBlock + i] * dw[j];
  }
  for (int64_t i = 0; i < kBlock; ++i)
    e += dw[i] * row[i];
  return e;
}
}  // namespace

double nvfp4_block_error_fast(const float* w, float descale, const double* ht) {
  return block_error_fast(w, descale, ht);
}

}  // namespace quant_detail

std::string_view weight_calib_method_name(WeightCalib::Method m) {
  switch (m) {
    case WeightCalib::Method::kMax:
      return "max";
    case WeightCalib::Method::kMse:
      return "mse";
    case WeightCalib::Method::kLocalHessian:
      return "local_hessian";
  }
  STRATA_ASSERT(false, "WeightCalib::Method value ", static_cast<int>(m));
  return {};
}

std::string weight_calib_description(const WeightCalib& c) {
  std::string s(weight_calib_method_name(c.method));
  if (!c.searches()) return s;
  if (c.fp8_scale_sweep) return s + " (fp8_scale_sweep: every E4M3 block scale of NVFP4 weights)";
  return str(s, " (amax multipliers ", c.start_multiplier, "..", c.stop_multiplier, ", ",
             mse_multipliers(c).size(), " steps)");
}

std::vector<float> mse_multipliers(const WeightCalib& c) {
  STRATA_CHECK(c.step_size > 0 && c.stop_multiplier >= c.start_multiplier &&
                   c.start_multiplier > 0 && std::isfinite(c.stop_multiplier),
               "algorithm: step_size must be positive and 0 < start_multiplier <= "
               "stop_multiplier, got step_size ",
               c.step_size, ", start_multiplier ", c.start_multiplier, ", stop_multiplier ",
               c.stop_multiplier);
  const double steps_d = std::ceil((c.stop_multiplier - c.start_multiplier) / c.step_size) + 1;
  STRATA_CHECK(steps_d <= 100000, "algorithm: ", steps_d,
               " multipliers are too many; use a larger step_size");
  const auto n = static_cast<int64_t>(steps_d);
  const auto start = static_cast<float>(c.start_multiplier);
  const auto stop = static_cast<float>(c.stop_multiplier);
  std::vector<float> m(static_cast<size_t>(n));
  if (n == 1) {
    m[0] = start;
    return m;
  }
  const float step = (stop - start) / static_cast<float>(n - 1);
  for (int64_t i = 0; i < n; ++i) {
    m[static_cast<size_t>(i)] = i < n / 2 ? std::fma(step, static_cast<float>(i), start)
                                          : std::fma(-step, static_cast<float>(n - 1 - i), stop);
  }
  return m;
}

uint8_t nvfp4_static_block_scale(float block_amax, float global_amax) {
  float s = block_amax * kInv6;
  if (s == 0.0f) s = 1.0f;
  s = s * 448.0f / (global_amax * kInv6);
  s = std::clamp(s, 0x1p-9f, 448.0f);
  return quant_detail::fast_f32_to_e4m3(s);
}

std::string device_search_unsupported(const WeightCalib& c) {
  if (!c.searches() || c.fp8_scale_sweep) return {};
  const size_t n = mse_multipliers(c).size();
  if (n <= static_cast<size_t>(kMaxDeviceSearchCandidates)) return {};
  return str("weight scale search mse with ", n, " multipliers (the device takes at most ",
             kMaxDeviceSearchCandidates, "; raise step_size)");
}

std::vector<uint8_t> nvfp4_sweep_scales(float global_amax) {
  std::vector<uint8_t> sweep;
  for (int b = kFirstE4m3; b <= kLastE4m3; ++b) {
    const float cand = e4m3_to_f32(static_cast<uint8_t>(b)) / 448.0f;
    sweep.push_back(nvfp4_static_block_scale(global_amax * cand, global_amax));
  }
  return sweep;
}

// ---- BlockHessian ------------------------------------------------------------------------------

BlockHessian::BlockHessian(int64_t cols) : cols_(cols) {
  STRATA_CHECK(cols > 0 && cols % kBlock == 0, "local_hessian: an input of ", cols,
               " features is not a multiple of 16");
  sums_.assign(static_cast<size_t>(cols / kBlock * kBlock * kBlock), 0.0);
}

void BlockHessian::accumulate(const float* x, int64_t rows) {
  const int64_t blocks = cols_ / kBlock;
  // Blocks [b0, b1) over every row in token order: each sum is updated in the same order
  // whatever the split, so several threads give the same bits as one.
  auto run = [&](size_t b0, size_t b1) {
    for (int64_t t = 0; t < rows; ++t) {
      const float* row = x + t * cols_;
      for (auto n = static_cast<int64_t>(b0); n < static_cast<int64_t>(b1); ++n) {
        const float* v = row + n * kBlock;
        double* h = sums_.data() + n * kBlock * kBlock;
        for (int64_t i = 0; i < kBlock; ++i) {
          const double vi = v[i];
          for (int64_t j = 0; j < kBlock; ++j)
            h[i * kBlock + j] += vi * static_cast<double>(v[j]);
        }
      }
    }
  };
  // Threads only for work worth their start (about 2 M multiply-adds or more).
  constexpr int64_t kParallelBlockRows = 8192;
  if (rows * blocks >= kParallelBlockRows && blocks > 1) {
    parallel_chunks(static_cast<size_t>(blocks), startup_threads(),
                    static_cast<size_t>(std::max<int64_t>(1, kParallelBlockRows / rows)), run);
  } else {
    run(0, static_cast<size_t>(blocks));
  }
  tokens_ += rows;
}

void BlockHessian::merge(const BlockHessian& o) {
  STRATA_ASSERT(o.cols_ == cols_, "BlockHessian merge of ", o.cols_, " and ", cols_, " features");
  for (size_t i = 0; i < sums_.size(); ++i)
    sums_[i] += o.sums_[i];
  tokens_ += o.tokens_;
}

void BlockHessian::add(std::span<const double> sums, int64_t tokens) {
  STRATA_ASSERT(sums.size() == sums_.size(), "BlockHessian add of ", sums.size(), " sums to ",
                sums_.size());
  for (size_t i = 0; i < sums_.size(); ++i)
    sums_[i] += sums[i];
  tokens_ += tokens;
}

std::vector<double> BlockHessian::normalized() const {
  if (tokens_ == 0) return {};
  std::vector<double> h(sums_);
  for (double& v : h)
    v /= static_cast<double>(tokens_);
  return h;
}

// ---- searches ----------------------------------------------------------------------------------

// Compiled twice, for AVX2 and for the baseline, and chosen at load time: the candidate errors'
// sixteen row sums then advance four doubles at a time. The same IEEE operations either way (no
// FMA: the library is compiled with -ffp-contract=off), so the same bytes on every machine.
[[gnu::target_clones("avx2", "default")]] std::vector<uint8_t> nvfp4_search_block_scales(
    const Tensor& weight, float global_amax, const WeightCalib& c, std::span<const double> hessian,
    std::string_view name) {
  quant_detail::check_weight(weight, name, kBlock, "nvfp4");
  STRATA_CHECK(std::isfinite(global_amax) && global_amax > 0.0f, "nvfp4: weight amax ", global_amax,
               " of ", name, " is not a positive finite number");
  STRATA_ASSERT(c.searches(), "nvfp4_search_block_scales with method max");
  const int64_t width = weight.dim(-1);
  const int64_t rows = weight.numel() / width;
  const int64_t blocks = width / kBlock;
  STRATA_CHECK(hessian.empty() || static_cast<int64_t>(hessian.size()) == blocks * kBlock * kBlock,
               "local_hessian: the input statistics of ", name, " have ",
               hessian.size() / (kBlock * kBlock), " blocks of 16 features, the weight ", blocks);
  const float global = nvfp4_global_scale(global_amax);  // weight_scale_2
  const std::vector<uint8_t> sweep =
      c.fp8_scale_sweep ? nvfp4_sweep_scales(global_amax) : std::vector<uint8_t>{};
  const std::vector<float> mult = c.fp8_scale_sweep ? std::vector<float>{} : mse_multipliers(c);
  // Every byte's descale under this weight_scale_2, as nvfp4_block_error computes it.
  float descale[256];
  for (int b = 0; b < 256; ++b)
    descale[b] = e4m3_to_f32(static_cast<uint8_t>(b)) * global;
  // The Hessian's blocks transposed (nvfp4_block_error_fast).
  std::vector<double> ht(hessian.size());
  for (size_t n = 0; n < hessian.size(); n += kBlock * kBlock) {
    for (int64_t i = 0; i < kBlock; ++i)
      for (int64_t j = 0; j < kBlock; ++j)
        ht[n + static_cast<size_t>(j * kBlock + i)] =
            hessian[n + static_cast<size_t>(i * kBlock + j)];
  }
  std::vector<uint8_t> out(static_cast<size_t>(rows * blocks));
  std::vector<float> row(static_cast<size_t>(width));
  std::vector<uint8_t> cands;
  for (int64_t r = 0; r < rows; ++r) {
    quant_detail::load_finite_f32(weight, r * width, width, row.data(), name);
    for (int64_t b = 0; b < blocks; ++b) {
      const float* w = row.data() + b * kBlock;
      const double* h = ht.empty() ? nullptr : ht.data() + b * kBlock * kBlock;
      if (!c.fp8_scale_sweep) {
        float block_amax = 0.0f;
        for (int64_t i = 0; i < kBlock; ++i)
          block_amax = std::max(block_amax, std::fabs(w[i]));
        STRATA_CHECK(block_amax <= global_amax, "nvfp4: tensor ", name, " has |W| = ", block_amax,
                     " in row ", r, ", above the weight amax ", global_amax);
        cands.clear();
        for (float m : mult)
          cands.push_back(nvfp4_static_block_scale(block_amax * m, global_amax));
      }
      const std::vector<uint8_t>& cs = c.fp8_scale_sweep ? sweep : cands;
      double best = INFINITY;
      uint8_t best_byte = cs.front();
      for (uint8_t s : cs) {
        const double e = quant_detail::block_error_fast(w, descale[s], h);
        if (e < best) {
          best = e;
          best_byte = s;
        }
      }
      out[static_cast<size_t>(r * blocks + b)] = best_byte;
    }
  }
  return out;
}

float fp8_search_amax(std::span<const Tensor> weights, float amax, const WeightCalib& c,
                      std::string_view name) {
  STRATA_ASSERT(c.searches() && !c.fp8_scale_sweep, "fp8_search_amax without a multiplier search");
  STRATA_CHECK(std::isfinite(amax) && amax > 0.0f, "fp8: weight amax ", amax, " of ", name,
               " is not a positive finite number");
  const std::vector<float> mult = mse_multipliers(c);
  std::vector<double> err(mult.size(), 0.0);
  std::vector<float> divisor(mult.size()), scale(mult.size());
  for (const Tensor& t : weights) {
    quant_detail::check_weight(t, name, 1, "fp8");
    for (size_t k = 0; k < mult.size(); ++k) {
      scale[k] = fp8_weight_scale(amax * mult[k]);
      divisor[k] = quant_detail::round_to(t.dtype(), scale[k]);  // as fp8_quantize
    }
    constexpr int64_t kChunk = 4096;
    std::vector<float> buf(kChunk);
    for (int64_t first = 0; first < t.numel(); first += kChunk) {
      const int64_t count = std::min(kChunk, t.numel() - first);
      quant_detail::load_finite_f32(t, first, count, buf.data(), name);
      for (size_t k = 0; k < mult.size(); ++k) {
        if (!(divisor[k] > 0.0f) || !std::isfinite(divisor[k])) {
          err[k] = INFINITY;
          continue;
        }
        double e = 0.0;
        for (int64_t i = 0; i < count; ++i) {
          float q =
              std::clamp(quant_detail::round_to(t.dtype(), buf[i] / divisor[k]), -448.0f, 448.0f);
          q = e4m3_to_f32(quant_detail::fast_f32_to_e4m3(q)) * scale[k];
          const double d = static_cast<double>(buf[i]) - static_cast<double>(q);
          e += d * d;
        }
        err[k] += e;
      }
    }
  }
  size_t best = 0;
  for (size_t k = 1; k < mult.size(); ++k) {
    if (err[k] < err[best]) best = k;
  }
  return amax * mult[best];
}

}  // namespace strata
