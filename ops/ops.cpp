#include "ops/ops.h"

#include <cblas.h>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/error.h"

// OpenBLAS's own thread count (its pthread build ignores OpenMP's); absent from other BLAS.
extern "C" void openblas_set_num_threads(int n) __attribute__((weak));

namespace strata::ops {

namespace {

// OpenBLAS runs single-threaded: linear() parallelises over its own fixed tiles (below).
void blas_single_threaded() {
  static const bool done = [] {
    if (openblas_set_num_threads) openblas_set_num_threads(1);
    return true;
  }();
  (void)done;
}

// linear() computes y in tiles of at most kTileRows x kTileCols, one single-threaded sgemm each,
// spread over the OpenMP threads. The tiles depend only on the sizes, so every output element is
// computed by the same kernel call whatever the thread count. (Left to OpenBLAS's own threads,
// the tile edges move with the thread count, and its edge kernels may sum in another order: the
// bits of y would then depend on how many threads a process or rank has.)
constexpr int64_t kTileRows = 128, kTileCols = 128;

}  // namespace

void set_threads(int n) {
  n = n < 1 ? 1 : n;
  omp_set_num_threads(n);
  blas_single_threaded();
}

int threads() {
  return omp_get_max_threads();
}

std::vector<float> weight_f32(const Tensor& w) {
  std::vector<float> out(static_cast<size_t>(w.numel()));
  if (w.dtype() == DType::kF32) {
    std::copy_n(w.data<float>(), out.size(), out.data());
  } else if (w.dtype() == DType::kBF16) {
    const uint16_t* src = w.data<uint16_t>();
    for (size_t i = 0; i < out.size(); ++i)
      out[i] = bf16_to_f32(src[i]);
  } else {
    for (size_t i = 0; i < out.size(); ++i)
      out[i] = w.item_f32(static_cast<int64_t>(i));
  }
  return out;
}

void linear(const float* x, int64_t m, int64_t k, const float* w, int64_t n, float* y,
            const float* bias) {
  if (m == 0 || n == 0) return;
  blas_single_threaded();
  // y[m, n] = x[m, k] · w[n, k]^T, tile by tile; OpenBLAS sgemm accumulates in fp32.
  const int64_t row_tiles = (m + kTileRows - 1) / kTileRows;
  const int64_t col_tiles = (n + kTileCols - 1) / kTileCols;
  const int64_t tiles = row_tiles * col_tiles;
#pragma omp parallel for schedule(dynamic, 1) if (tiles > 1 && m * n * k >= (1 << 20))
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t r0 = (t / col_tiles) * kTileRows, c0 = (t % col_tiles) * kTileCols;
    const int64_t rows = std::min(kTileRows, m - r0), cols = std::min(kTileCols, n - c0);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
                static_cast<int>(cols), static_cast<int>(k), 1.0f, x + r0 * k, static_cast<int>(k),
                w + c0 * k, static_cast<int>(k), 0.0f, y + r0 * n + c0, static_cast<int>(n));
  }
  if (bias) {
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < n; ++c)
        y[r * n + c] += bias[c];
    }
  }
}

void round_bf16(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    x[i] = bf16(x[i]);
}

void rms_norm(const float* x, int64_t rows, int64_t dim, const float* w, float eps, float* y,
              float w_offset) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double sum = 0.0;
    for (int64_t i = 0; i < dim; ++i)
      sum += static_cast<double>(xr[i]) * xr[i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(sum / static_cast<double>(dim)) + eps);
    if (w && w_offset != 0.0f) {
      for (int64_t i = 0; i < dim; ++i)
        yr[i] = xr[i] * inv * (w_offset + w[i]);
      continue;
    }
    for (int64_t i = 0; i < dim; ++i)
      yr[i] = xr[i] * inv * (w ? w[i] : 1.0f);
  }
}

void softmax(float* x, int64_t rows, int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * dim;
    float mx = -INFINITY;
    for (int64_t i = 0; i < dim; ++i)
      mx = std::max(mx, xr[i]);
    double sum = 0.0;
    for (int64_t i = 0; i < dim; ++i) {
      xr[i] = std::exp(xr[i] - mx);
      sum += xr[i];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < dim; ++i)
      xr[i] *= inv;
  }
}

void swiglu(const float* gate, const float* up, int64_t count, float* h, bool rounded) {
  if (rounded) {
    for (int64_t i = 0; i < count; ++i)
      h[i] = bf16(bf16(silu(gate[i])) * up[i]);
    return;
  }
  for (int64_t i = 0; i < count; ++i)
    h[i] = silu(gate[i]) * up[i];
}

void swiglu_clamped(const float* gu, int64_t count, float alpha, float limit, float* h,
                    bool rounded) {
  for (int64_t i = 0; i < count; ++i) {
    const float g = std::min(gu[2 * i], limit);
    const float u = std::clamp(gu[2 * i + 1], -limit, limit);
    if (rounded) {  // glu = gate * sigmoid(gate * alpha); (up + 1) * glu, each op in bf16
      const float glu = bf16(g * bf16(sigmoid(bf16(g * alpha))));
      h[i] = bf16(bf16(u + 1.0f) * glu);
      continue;
    }
    h[i] = (u + 1.0f) * (g * sigmoid(g * alpha));
  }
}

std::vector<double> rope_inv_freq(const RopeParams& p, int64_t rot_dim) {
  STRATA_ASSERT(rot_dim % 2 == 0);
  const int64_t half = rot_dim / 2;
  std::vector<double> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    f[i] = 1.0 / std::pow(p.theta, static_cast<double>(2 * i) / static_cast<double>(rot_dim));
  }
  switch (p.kind) {
    case RopeParams::Kind::kDefault:
      break;
    case RopeParams::Kind::kLinear:
      for (double& v : f)
        v /= p.factor;
      break;
    case RopeParams::Kind::kLlama3: {
      // wavelen = 2π/f; short wavelengths keep f, long ones use f/factor, a smooth blend between.
      const double low_wavelen = p.original_max_position / p.low_freq_factor;
      const double high_wavelen = p.original_max_position / p.high_freq_factor;
      for (double& v : f) {
        const double wavelen = 2.0 * M_PI / v;
        if (wavelen < high_wavelen) continue;
        if (wavelen > low_wavelen) {
          v /= p.factor;
          continue;
        }
        const double alpha = (p.original_max_position / wavelen - p.low_freq_factor) /
                             (p.high_freq_factor - p.low_freq_factor);
        v = (1.0 - alpha) * v / p.factor + alpha * v;
      }
      break;
    }
    case RopeParams::Kind::kYarn: {
      // Dimensions below `lo` keep f (extrapolate), above `hi` use f/factor (interpolate),
      // with a linear ramp between (spec/architectures.md §3).
      auto corr = [&](double r) {
        return static_cast<double>(rot_dim) * std::log(p.original_max_position / (2.0 * M_PI * r)) /
               (2.0 * std::log(p.theta));
      };
      const double lo_raw = corr(p.beta_fast), hi_raw = corr(p.beta_slow);
      double lo = std::max(p.truncate ? std::floor(lo_raw) : lo_raw, 0.0);
      double hi =
          std::min(p.truncate ? std::ceil(hi_raw) : hi_raw, static_cast<double>(rot_dim - 1));
      if (lo == hi) hi += 0.001;
      for (int64_t i = 0; i < half; ++i) {
        const double ramp = std::clamp((static_cast<double>(i) - lo) / (hi - lo), 0.0, 1.0);
        f[i] = f[i] * (1.0 - ramp) + (f[i] / p.factor) * ramp;
      }
      break;
    }
  }
  return f;
}

void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_stride, int64_t offset,
          int64_t rot_dim, const int64_t* pos, const std::vector<double>& inv_freq,
          double attention_factor, bool interleaved, bool rounded) {
  const int64_t half = rot_dim / 2;
  STRATA_ASSERT(static_cast<int64_t>(inv_freq.size()) == half);
  std::vector<float> cos_v(half), sin_v(half);
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      // The angle is formed in fp32 as transformers does (inv_freq fp32 times position fp32).
      const float angle = static_cast<float>(inv_freq[i]) * static_cast<float>(pos[t]);
      cos_v[i] = static_cast<float>(std::cos(angle) * attention_factor);
      sin_v[i] = static_cast<float>(std::sin(angle) * attention_factor);
      if (rounded) {  // transformers casts cos and sin to the activations' dtype
        cos_v[i] = bf16(cos_v[i]);
        sin_v[i] = bf16(sin_v[i]);
      }
    }
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_stride + offset;
      for (int64_t i = 0; i < half; ++i) {
        const int64_t a = interleaved ? 2 * i : i;
        const int64_t b = interleaved ? 2 * i + 1 : i + half;
        const float x0 = v[a], x1 = v[b];
        if (rounded) {
          v[a] = bf16(bf16(x0 * cos_v[i]) - bf16(x1 * sin_v[i]));
          v[b] = bf16(bf16(x1 * cos_v[i]) + bf16(x0 * sin_v[i]));
          continue;
        }
        v[a] = x0 * cos_v[i] - x1 * sin_v[i];
        v[b] = x1 * cos_v[i] + x0 * sin_v[i];
      }
    }
  }
}

namespace {

// Row i of head h of attention_causal: the causal keys of query i that are not masked out.
struct AttentionRow {
  int64_t first = 0, last = 0;  // keys [first, last]
  const uint32_t* keep = nullptr;
  int64_t keep_words = 0, i = 0;
  bool kept(int64_t j) const {
    return !keep || (keep[i * keep_words + j / 32] >> (j % 32) & 1u) != 0;
  }
};

// out[dv] = Σ_j w[j] v_j over the row's keys (a masked key's weight is 0), fp32, in key order.
void weighted_values(const AttentionRow& r, const float* w, const float* v, int64_t v_stride,
                     int64_t dv, float* out) {
  std::fill(out, out + dv, 0.0f);
  for (int64_t j = r.first; j <= r.last; ++j) {
    const float* vj = v + j * v_stride;
    for (int64_t d = 0; d < dv; ++d)
      out[d] += w[j] * vj[d];
  }
}

// One query row's softmax weights p[first..last] from its fp32 scores s (masked keys: 0), and
// the scale that divides Σ p_j v_j afterwards (1 when p is already normalised), as `rounding`
// computes them (ops.h Bf16Attention). `sink`: the head's sink logit, or null.
float softmax_row(const AttentionRow& r, float* s, float scale, const float* sink,
                  Bf16Attention rounding) {
  float mx = sink ? *sink : -INFINITY;
  for (int64_t j = r.first; j <= r.last; ++j) {
    if (!r.kept(j)) continue;
    s[j] = rounding == Bf16Attention::kEager ? bf16(bf16(s[j]) * scale) : s[j] * scale;
    mx = std::max(mx, s[j]);
  }
  if (rounding == Bf16Attention::kEager) {
    // The scores minus the max, in bf16; then the softmax of that row (its max is 0 now).
    double sum = 0.0;
    for (int64_t j = r.first; j <= r.last; ++j) {
      s[j] = r.kept(j) ? std::exp(bf16(s[j] - mx)) : 0.0f;
      sum += s[j];
    }
    if (sink) sum += std::exp(bf16(*sink - mx));
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t j = r.first; j <= r.last; ++j)
      s[j] = bf16(s[j] * inv);
    return 1.0f;
  }
  double sum = 0.0;
  for (int64_t j = r.first; j <= r.last; ++j) {
    s[j] = r.kept(j) ? std::exp(s[j] - mx) : 0.0f;
    sum += s[j];
  }
  if (sink) sum += std::exp(*sink - mx);
  if (rounding == Bf16Attention::kFlash) {
    // exp(s - max) enters the P·V product in bf16; the sum that divides it stays fp32.
    for (int64_t j = r.first; j <= r.last; ++j)
      s[j] = bf16(s[j]);
    return static_cast<float>(sum);
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t j = r.first; j <= r.last; ++j)
    s[j] *= inv;
  return 1.0f;
}

}  // namespace

void attention_causal(const float* q, int64_t q_stride, const float* k, int64_t k_stride,
                      const float* v, int64_t v_stride, int64_t T, int64_t n_heads,
                      int64_t n_kv_heads, int64_t dq, int64_t dv, float scale, float* out,
                      const float* sinks, int64_t window, const uint32_t* keep, int64_t keep_words,
                      Bf16Attention rounding) {
  STRATA_ASSERT(n_kv_heads > 0 && n_heads % n_kv_heads == 0 && window >= 0);
  STRATA_ASSERT(!keep || keep_words * 32 >= T);
  const int64_t group = n_heads / n_kv_heads;
  // Heads are independent and each writes only its own output columns, so running them on
  // several threads gives the same bytes as one.
#pragma omp parallel for schedule(static)
  for (int64_t h = 0; h < n_heads; ++h) {
    std::vector<float> p(static_cast<size_t>(T));
    const int64_t kvh = h / group;
    for (int64_t i = 0; i < T; ++i) {
      const float* qi = q + i * q_stride + h * dq;
      // causal: keys up to and including i; within the window when there is one
      AttentionRow r{window > 0 ? std::max<int64_t>(0, i - window + 1) : 0, i, keep, keep_words, i};
      for (int64_t j = r.first; j <= r.last; ++j) {
        if (!r.kept(j)) continue;
        const float* kj = k + j * k_stride + kvh * dq;
        float s = 0.0f;
        for (int64_t d = 0; d < dq; ++d)
          s += qi[d] * kj[d];
        p[j] = s;
      }
      const float div = softmax_row(r, p.data(), scale, sinks ? &sinks[h] : nullptr, rounding);
      float* oi = out + (i * n_heads + h) * dv;
      weighted_values(r, p.data(), v + kvh * dv, v_stride, dv, oi);
      if (rounding == Bf16Attention::kNone) continue;
      for (int64_t d = 0; d < dv; ++d)
        oi[d] = bf16(oi[d] / div);
    }
  }
}

void index_topk(const float* q, const float* k, const float* w, int64_t T, int64_t n_heads,
                int64_t d, float scale, float w_scale, int64_t n_top, uint32_t* keep,
                int64_t words) {
  STRATA_ASSERT(n_top >= 1 && words * 32 >= T);
  // Rows are independent and each writes only its own words.
#pragma omp parallel for schedule(dynamic, 8)
  for (int64_t i = 0; i < T; ++i) {
    uint32_t* row = keep + i * words;
    std::fill(row, row + words, 0u);
    const int64_t n = i + 1;  // the causal keys
    if (n <= n_top) {
      for (int64_t j = 0; j < n; ++j)
        row[j / 32] |= 1u << (j % 32);
      continue;
    }
    std::vector<float> s(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) {
      const float* kj = k + j * d;
      float acc = 0.0f;
      for (int64_t h = 0; h < n_heads; ++h) {
        const float* qh = q + (i * n_heads + h) * d;
        float dot = 0.0f;
        for (int64_t c = 0; c < d; ++c)
          dot += qh[c] * kj[c];
        const float wh = w[i * n_heads + h] * w_scale;
        acc += wh * std::max(dot * scale, 0.0f);
      }
      s[j] = acc;
    }
    for (int32_t j : top_k(s.data(), n, n_top))
      row[j / 32] |= 1u << (j % 32);
  }
}

void causal_conv1d(const float* x, int64_t x_stride, int64_t T, int64_t C, const float* w,
                   int64_t K, float* y) {
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < C; ++c) {
      float acc = 0.0f;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t s = t - (K - 1) + j;
        if (s >= 0) acc += w[c * K + j] * x[s * x_stride + c];
      }
      y[t * C + c] = acc;
    }
  }
}

void layer_norm(const float* x, int64_t rows, int64_t dim, const float* w, const float* b,
                float eps, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double sum = 0.0;
    for (int64_t i = 0; i < dim; ++i)
      sum += xr[i];
    const double mean = sum / static_cast<double>(dim);
    double sq = 0.0;
    for (int64_t i = 0; i < dim; ++i)
      sq += (xr[i] - mean) * (xr[i] - mean);
    const float m = static_cast<float>(mean);
    const float inv = 1.0f / std::sqrt(static_cast<float>(sq / static_cast<double>(dim)) + eps);
    for (int64_t i = 0; i < dim; ++i)
      yr[i] = (xr[i] - m) * inv * (w ? w[i] : 1.0f) + (b ? b[i] : 0.0f);
  }
}

void l2_norm(float* x, int64_t rows, int64_t dim, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * dim;
    double sum = 0.0;
    for (int64_t i = 0; i < dim; ++i)
      sum += static_cast<double>(xr[i]) * xr[i];
    const float norm = std::sqrt(static_cast<float>(sum) + eps);
    for (int64_t i = 0; i < dim; ++i)
      xr[i] /= norm;
  }
}

[[gnu::target_clones("avx2", "default")]] void gated_delta_rule(
    const float* q, const float* k, const float* v, const float* g, const float* beta, int64_t T,
    int64_t n_heads, int64_t dk, int64_t dv, float* out, bool head_decay) {
  // The reference's arithmetic with its loops turned so that the inner one runs along a row of
  // S (contiguous, vectorized): each column j still decays before its dot product and sums over
  // i in ascending order, and the update of row i precedes its term of o, so every value is
  // the reference's bit for bit (tests/ops/ops_test.cpp).
#pragma omp parallel for schedule(static)
  for (int64_t h = 0; h < n_heads; ++h) {
    std::vector<float> S(static_cast<size_t>(dk * dv), 0.0f);  // [dk, dv]
    std::vector<float> s(static_cast<size_t>(dv)), u(static_cast<size_t>(dv));
    for (int64_t t = 0; t < T; ++t) {
      const int64_t kq = (t * n_heads + h) * dk, vo = (t * n_heads + h) * dv;
      std::fill(s.begin(), s.end(), 0.0f);
      for (int64_t i = 0; i < dk; ++i) {
        const float a = std::exp(head_decay ? g[t * n_heads + h] : g[kq + i]);
        const float ki = k[kq + i];
        float* Si = S.data() + i * dv;
        for (int64_t j = 0; j < dv; ++j) {
          Si[j] *= a;
          s[j] += Si[j] * ki;
        }
      }
      const float b = beta[t * n_heads + h];
      for (int64_t j = 0; j < dv; ++j)
        u[j] = b * (v[vo + j] - s[j]);
      float* o = out + vo;
      std::fill(o, o + dv, 0.0f);
      for (int64_t i = 0; i < dk; ++i) {
        const float ki = k[kq + i], qi = q[kq + i];
        float* Si = S.data() + i * dv;
        for (int64_t j = 0; j < dv; ++j) {
          Si[j] += ki * u[j];
          o[j] += Si[j] * qi;
        }
      }
    }
  }
}

void gated_delta_rule_reference(const float* q, const float* k, const float* v, const float* g,
                                const float* beta, int64_t T, int64_t n_heads, int64_t dk,
                                int64_t dv, float* out, bool head_decay) {
  // Heads are independent and each writes only its own output columns.
#pragma omp parallel for schedule(static)
  for (int64_t h = 0; h < n_heads; ++h) {
    std::vector<float> S(static_cast<size_t>(dk * dv), 0.0f);  // [dk, dv]
    std::vector<float> u(static_cast<size_t>(dv));             // v_t - S^T k_t
    for (int64_t t = 0; t < T; ++t) {
      const int64_t kq = (t * n_heads + h) * dk, vo = (t * n_heads + h) * dv;
      for (int64_t i = 0; i < dk; ++i) {
        const float a = std::exp(head_decay ? g[t * n_heads + h] : g[kq + i]);
        for (int64_t j = 0; j < dv; ++j)
          S[i * dv + j] *= a;
      }
      for (int64_t j = 0; j < dv; ++j) {
        float s = 0.0f;
        for (int64_t i = 0; i < dk; ++i)
          s += S[i * dv + j] * k[kq + i];
        u[j] = beta[t * n_heads + h] * (v[vo + j] - s);
      }
      for (int64_t i = 0; i < dk; ++i) {
        for (int64_t j = 0; j < dv; ++j)
          S[i * dv + j] += k[kq + i] * u[j];
      }
      for (int64_t j = 0; j < dv; ++j) {
        float s = 0.0f;
        for (int64_t i = 0; i < dk; ++i)
          s += S[i * dv + j] * q[kq + i];
        out[vo + j] = s;
      }
    }
  }
}

std::vector<int32_t> top_k(const float* x, int64_t n, int64_t k) {
  STRATA_ASSERT(k <= n);
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return x[a] > x[b]; });
  idx.resize(static_cast<size_t>(k));
  return idx;
}

float amax(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (std::isnan(a)) return NAN;
    m = std::max(m, a);
  }
  return m;
}

void column_stats(const float* x, int64_t rows, int64_t cols, double* sum, float* max, float* min) {
  for (int64_t c = 0; c < cols; ++c) {
    double s = 0.0;
    float hi = -INFINITY, lo = INFINITY;
    for (int64_t r = 0; r < rows; ++r) {
      const float v = x[r * cols + c];
      s += static_cast<double>(v);
      if (std::isnan(v) || v > hi) hi = std::isnan(hi) ? hi : v;
      if (std::isnan(v) || v < lo) lo = std::isnan(lo) ? lo : v;
    }
    sum[c] = s;
    max[c] = hi;
    min[c] = lo;
  }
}

}  // namespace strata::ops
