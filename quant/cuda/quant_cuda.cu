// CUDA kernels and host launchers of quant/cuda/quant_cuda.h. Each kernel is the CPU encoder of
// quant/{nvfp4,fp8,mxfp8}.cpp written for one thread per block (NVFP4, MXFP8) or element (FP8),
// with every fp32 operation an explicit round-to-nearest intrinsic (and the file compiled with
// -fmad=false), so the bytes equal the CPU's. The e4m3 and e2m1 encoders are quant/encode.h's
// fast encoders, which tests/quant/encode_test.cpp proves equal to the reference conversions.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "core/cuda_fp.cuh"
#include "core/dtype.h"
#include "core/error.h"
#include "quant/cuda/quant_cuda.h"

// quant/nvfp4.h and quant/fp8.h need C++20 (through quant/encode.h) and CUDA sources compile as
// C++17, so the two scale functions shared with the CPU are declared here; their definitions in
// quant/*.cpp are the single source of the scales.
namespace strata {
float nvfp4_global_scale(float weight_amax);
float fp8_weight_scale(float weight_amax);
}  // namespace strata

namespace strata::quant::cuda {

namespace {

constexpr int kThreads = 256;
constexpr float kInv448 = 1.0f / 448.0f;  // fl32(1/448), as quant/mxfp8.cpp
constexpr int64_t kNvfp4BlockSize = 16;   // quant/nvfp4.h
constexpr int64_t kMxfp8BlockSize = 32;   // quant/mxfp8.h

// quant_detail::round_to on the host (quant/encode.h, which this C++17 CUDA unit cannot
// include): round to `dtype` and back, nearest even.
float round_to(DType dtype, float x) {
  if (dtype == DType::kBF16) return bf16_to_f32(f32_to_bf16(x));
  if (dtype == DType::kF16) return f16_to_f32(f32_to_f16(x));
  return x;
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA error in ", what, ": ", cudaGetErrorString(e));
}

cudaStream_t native(Stream& s) {
  return static_cast<cudaStream_t>(s.native());
}

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(b, 1), 65535 * 64));
}

enum Src : int { kSrcBF16, kSrcF16, kSrcF32 };

Src src_of(DType dt, std::string_view name, const char* format) {
  switch (dt) {
    case DType::kBF16:
      return kSrcBF16;
    case DType::kF16:
      return kSrcF16;
    case DType::kF32:
      return kSrcF32;
    default:
      fail(format, ": tensor ", name, " has dtype ", dtype_name(dt),
           "; only bf16, f16 and f32 weights can be quantized");
  }
}

template <int kSrc>
__device__ __forceinline__ float load(const void* w, int64_t i) {
  if constexpr (kSrc == kSrcBF16) {
    return __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(w)[i]) << 16);
  } else if constexpr (kSrc == kSrcF16) {
    return __half2float(__ushort_as_half(static_cast<const uint16_t*>(w)[i]));
  } else {
    return static_cast<const float*>(w)[i];
  }
}

// Rounds to the source dtype and back (quant_detail::round_to), round to nearest even.
template <int kSrc>
__device__ __forceinline__ float round_src(float x) {
  if constexpr (kSrc == kSrcBF16) {
    const uint32_t u = __float_as_uint(x);  // finite here (fast_round_bf16)
    return __uint_as_float((u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u);
  } else if constexpr (kSrc == kSrcF16) {
    return __half2float(__float2half_rn(x));
  } else {
    return x;
  }
}

// quant_detail::fast_f32_to_e2m1.
__device__ __forceinline__ uint8_t to_e2m1(float x) {
  const uint8_t sign = x < 0.0f ? 0x8 : 0;
  const float a = fabsf(x);
  if (!(a <= 5.0f)) return sign | 0x7;
  const int code =
      (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f);
  return sign | static_cast<uint8_t>(code);
}

// err[0]: lowest flat index of a non-finite element; err[1]: lowest flat index of an element
// (FP8) or block start (NVFP4) whose |W| exceeds the weight amax. ULLONG_MAX when none.
using Err = unsigned long long;

constexpr float kInv6 = 1.0f / 6.0f;  // quant/scale_search.cpp: fl32(1/6)

// quant/scale_search.h nvfp4_static_block_scale.
__device__ __forceinline__ uint8_t static_block_scale(float block_amax, float weight_amax) {
  float s = __fmul_rn(block_amax, kInv6);
  if (s == 0.0f) s = 1.0f;
  s = __fdiv_rn(__fmul_rn(s, 448.0f), __fmul_rn(weight_amax, kInv6));
  s = fminf(fmaxf(s, 0x1p-9f), 448.0f);
  return cuda_fp::to_e4m3(s);
}

// The error of a block encoded with `scale` (scale_search.cpp nvfp4_block_error): dw exact in
// double; without a Hessian Σ dw² in element order, with one (h: the block's 16x16 H, row-major)
// Σ_i dw_i (Σ_j H_ij dw_j), each row sum from 0.0 in j order, then the rows in i order.
__device__ __forceinline__ double block_error(const float v[16], uint8_t scale, float global_scale,
                                              const double* h) {
  const float descale = __fmul_rn(cuda_fp::from_e4m3(scale), global_scale);
  double dw[16];
  for (int i = 0; i < 16; ++i) {
    const float q = __fmul_rn(cuda_fp::from_e2m1(to_e2m1(__fdiv_rn(v[i], descale))), descale);
    dw[i] = __dsub_rn(static_cast<double>(v[i]), static_cast<double>(q));
  }
  double e = 0.0;
  if (h == nullptr) {
    for (int i = 0; i < 16; ++i)
      e = __dadd_rn(e, __dmul_rn(dw[i], dw[i]));
    return e;
  }
  for (int i = 0; i < 16; ++i) {
    double row = 0.0;
    for (int j = 0; j < 16; ++j)
      row = __dadd_rn(row, __dmul_rn(h[i * 16 + j], dw[j]));
    e = __dadd_rn(e, __dmul_rn(dw[i], row));
  }
  return e;
}

// The searched block scale: the first candidate with the least error (nvfp4_search_block_scales).
__device__ __forceinline__ uint8_t searched_scale(const float v[16], float block_amax,
                                                  float weight_amax, float global_scale,
                                                  const Nvfp4Search& search, const double* h) {
  double best = CUDART_INF;
  uint8_t best_byte = 0;
  for (int c = 0; c < search.count; ++c) {
    const uint8_t s = search.sweep ? search.bytes[c]
                                   : static_block_scale(
                                         __fmul_rn(block_amax, search.multipliers[c]), weight_amax);
    if (c == 0) best_byte = s;
    const double e = block_error(v, s, global_scale, h);
    if (e < best) {
      best = e;
      best_byte = s;
    }
  }
  return best_byte;
}

// Block b of 16 consecutive elements: its scale (its own amax's, or searched with the Hessian
// block h or none), its codes, and the checks.
template <int kSrc, bool kSearch>
__device__ __forceinline__ void nvfp4_block(const void* w, int64_t b, float weight_amax,
                                            float global_scale, uint8_t* packed, uint8_t* scales,
                                            Err* err, const Nvfp4Search& search, const double* h) {
  float v[16];
  float block_amax = 0.0f;
  for (int i = 0; i < 16; ++i) {
    v[i] = load<kSrc>(w, b * 16 + i);
    if (!cuda_fp::is_finite(v[i])) atomicMin(&err[0], static_cast<Err>(b * 16 + i));
    block_amax = fmaxf(block_amax, fabsf(v[i]));
  }
  if (block_amax > weight_amax) atomicMin(&err[1], static_cast<Err>(b * 16));
  uint8_t scale_byte;
  if constexpr (kSearch) {
    scale_byte = searched_scale(v, block_amax, weight_amax, global_scale, search, h);
  } else {
    const float six_global = __fmul_rn(6.0f, global_scale);
    float s = __fdiv_rn(block_amax, six_global);
    if (s == 0.0f) s = 1.0f;
    s = fminf(fmaxf(s, 0x1p-9f), 448.0f);
    scale_byte = cuda_fp::to_e4m3(s);
  }
  scales[b] = scale_byte;
  const float descale = __fmul_rn(cuda_fp::from_e4m3(scale_byte), global_scale);
  for (int i = 0; i < 16; i += 2) {
    const uint8_t lo = to_e2m1(__fdiv_rn(v[i], descale));
    const uint8_t hi = to_e2m1(__fdiv_rn(v[i + 1], descale));
    packed[b * 8 + i / 2] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

template <int kSrc, bool kSearch>
__global__ void nvfp4_kernel(const void* w, int64_t n_blocks, float weight_amax, float global_scale,
                             uint8_t* packed, uint8_t* scales, Err* err,
                             const __grid_constant__ Nvfp4Search search) {
  for (int64_t b = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; b < n_blocks;
       b += int64_t{gridDim.x} * blockDim.x)
    nvfp4_block<kSrc, kSearch>(w, b, weight_amax, global_scale, packed, scales, err, search,
                               nullptr);
}

// local_hessian: blockIdx.x the column block n (of blocks_per_row), blockIdx.y a group of
// kThreads rows; the column block's 16x16 H is read once into shared memory, where every thread
// reads the same element at once.
template <int kSrc>
__global__ void nvfp4_hessian_kernel(const void* w, int64_t rows, float weight_amax,
                                     float global_scale, uint8_t* packed, uint8_t* scales, Err* err,
                                     const __grid_constant__ Nvfp4Search search) {
  __shared__ double h[256];
  const int64_t n = blockIdx.x;
  for (int i = static_cast<int>(threadIdx.x); i < 256; i += static_cast<int>(blockDim.x))
    h[i] = search.hessian[n * 256 + i];
  __syncthreads();
  const int64_t r = blockIdx.y * int64_t{blockDim.x} + threadIdx.x;
  if (r >= rows) return;
  nvfp4_block<kSrc, true>(w, r * search.blocks_per_row + n, weight_amax, global_scale, packed,
                          scales, err, search, h);
}

template <int kSrc>
__global__ void fp8_kernel(const void* w, int64_t n, float weight_amax, float divisor, uint8_t* out,
                           Err* err, bool fp32_quotient) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = load<kSrc>(w, i);
    if (!cuda_fp::is_finite(x)) {
      atomicMin(&err[0], static_cast<Err>(i));
      out[i] = 0;
      continue;
    }
    if (fabsf(x) > weight_amax) atomicMin(&err[1], static_cast<Err>(i));
    float q = __fdiv_rn(x, divisor);
    if (!fp32_quotient) q = round_src<kSrc>(q);
    q = fminf(fmaxf(q, -448.0f), 448.0f);
    out[i] = cuda_fp::to_e4m3(q);
  }
}

template <int kSrc>
__global__ void mxfp8_kernel(const void* w, int64_t n_blocks, uint8_t* out, uint8_t* scales,
                             Err* err) {
  for (int64_t b = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; b < n_blocks;
       b += int64_t{gridDim.x} * blockDim.x) {
    float block_amax = 0.0f;
    bool ok = true;
    for (int i = 0; i < 32; ++i) {
      const float x = load<kSrc>(w, b * 32 + i);
      if (!cuda_fp::is_finite(x)) {
        atomicMin(&err[0], static_cast<Err>(b * 32 + i));
        ok = false;
      }
      block_amax = fmaxf(block_amax, fabsf(x));
    }
    if (!ok) continue;
    const float d = __fmul_rn(block_amax, kInv448);
    const int e = d == 0.0f ? -127 : min(max(cuda_fp::ceil_log2(d), -127), 127);
    scales[b] = static_cast<uint8_t>(e + 127);
    // 2^-e as fp32: a normal for -e >= -126, else the subnormal 2^-127.
    const float inv_scale =
        -e >= -126 ? __uint_as_float(static_cast<uint32_t>(-e + 127) << 23) : 0x1p-127f;
    for (int i = 0; i < 32; ++i) {
      const float q =
          fminf(fmaxf(__fmul_rn(load<kSrc>(w, b * 32 + i), inv_scale), -448.0f), 448.0f);
      out[b * 32 + i] = cuda_fp::to_e4m3(q);
    }
  }
}

template <int kSrc>
__global__ void weight_amax_kernel(const void* w, int64_t n, float* out) {
  __shared__ unsigned part[kThreads / 32];
  unsigned m = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    m = max(m, __float_as_uint(load<kSrc>(w, i)) & 0x7FFFFFFFu);  // NaN orders above inf
  for (int o = 16; o > 0; o /= 2)
    m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 1; i < kThreads / 32; ++i)
      m = max(m, part[i]);
    if (m != 0) atomicMax(reinterpret_cast<unsigned*>(out), m);
  }
}

// Error slots in the stream's scratch, set to "none".
Err* error_slots(Stream& stream) {
  Err* err = static_cast<Err*>(stream.scratch(2 * sizeof(Err)));
  check(cudaMemsetAsync(err, 0xFF, 2 * sizeof(Err), native(stream)), "quantizer error slots");
  return err;
}

// Waits for the kernel and reads the error slots.
void read_errors(Err* err, Err host[2], Stream& stream) {
  check(cudaGetLastError(), "quantizer launch");
  strata::cuda::copy_to_host(host, err, 2 * sizeof(Err), stream);
}

template <typename Launch>
void dispatch(Src src, Launch launch) {
  switch (src) {
    case kSrcBF16:
      launch(std::integral_constant<int, kSrcBF16>{});
      break;
    case kSrcF16:
      launch(std::integral_constant<int, kSrcF16>{});
      break;
    case kSrcF32:
      launch(std::integral_constant<int, kSrcF32>{});
      break;
  }
}

void check_shape(int64_t rows, int64_t cols, int64_t block, std::string_view name,
                 const char* format) {
  STRATA_CHECK(rows > 0 && cols > 0, format, ": tensor ", name, " is empty (", rows, " x ", cols,
               ")");
  STRATA_CHECK(cols % block == 0, format, ": tensor ", name, " has an input dimension of ", cols,
               ", not a multiple of the block size ", block);
}

}  // namespace

void weight_amax(const void* w, DType dtype, int64_t n, float* out, Stream& stream) {
  const Src src = src_of(dtype, "(amax)", "weight_amax");
  STRATA_CHECK(n >= 0, "weight_amax: negative size ", n);
  if (n == 0) return;
  const unsigned blocks = std::min(blocks_for(n), 1024u);
  dispatch(src, [&](auto s) {
    weight_amax_kernel<decltype(s)::value><<<blocks, kThreads, 0, native(stream)>>>(w, n, out);
  });
  check(cudaGetLastError(), "weight_amax");
}

unsigned long long* check_slots(Stream& stream) {
  return error_slots(stream);
}

float nvfp4_quantize(const void* w, DType dtype, int64_t rows, int64_t cols, float weight_amax,
                     uint8_t* packed, uint8_t* block_scale, std::string_view name, Stream& stream) {
  Err* err = error_slots(stream);
  const float global_scale = nvfp4_quantize_deferred(w, dtype, rows, cols, weight_amax, packed,
                                                     block_scale, name, err, stream);
  Err host[2];
  read_errors(err, host, stream);
  nvfp4_check(host, name, weight_amax, cols);
  return global_scale;
}

void nvfp4_check(const unsigned long long checks[2], std::string_view name, float weight_amax,
                 int64_t cols) {
  STRATA_CHECK(checks[0] == ULLONG_MAX, "nvfp4: tensor ", name,
               " has a NaN or infinite element at ", "flat index ", checks[0],
               "; no format can give it a finite scale");
  STRATA_CHECK(checks[1] == ULLONG_MAX, "nvfp4: tensor ", name, " has |W| above the weight amax ",
               weight_amax, " it was given in row ", checks[1] / cols,
               "; the amax must be at least max|W|");
}

float nvfp4_quantize_deferred(const void* w, DType dtype, int64_t rows, int64_t cols,
                              float weight_amax, uint8_t* packed, uint8_t* block_scale,
                              std::string_view name, unsigned long long* err, Stream& stream,
                              const Nvfp4Search* search) {
  const Src src = src_of(dtype, name, "nvfp4");
  STRATA_CHECK(search == nullptr || (search->count > 0 && search->count <= kMaxSearchCandidates),
               "nvfp4: a scale search of ", search ? search->count : 0, " candidates for ", name,
               " (the device takes 1 to ", kMaxSearchCandidates, ")");
  check_shape(rows, cols, kNvfp4BlockSize, name, "nvfp4");
  STRATA_CHECK(std::isfinite(weight_amax) && weight_amax > 0.0f, "nvfp4: weight amax ", weight_amax,
               " of ", name,
               " is not a positive finite number (an all-zero weight has no finite NVFP4 "
               "encoding; exclude the module)");
  const float global_scale = nvfp4_global_scale(weight_amax);
  STRATA_CHECK(global_scale > 0.0f, "nvfp4: weight amax ", weight_amax, " of ", name,
               " is too small for an fp32 weight_scale_2");
  const int64_t n_blocks = rows * cols / kNvfp4BlockSize;
  dispatch(src, [&](auto s) {
    if (search && search->hessian) {
      const int64_t groups = (rows + kThreads - 1) / kThreads;
      STRATA_CHECK(groups < 65536 && search->blocks_per_row == cols / kNvfp4BlockSize,
                   "nvfp4: local_hessian on the device takes at most ", 65535 * kThreads, " rows, ",
                   name, " has ", rows);
      const dim3 grid(static_cast<unsigned>(cols / kNvfp4BlockSize), static_cast<unsigned>(groups));
      nvfp4_hessian_kernel<decltype(s)::value><<<grid, kThreads, 0, native(stream)>>>(
          w, rows, weight_amax, global_scale, packed, block_scale, err, *search);
    } else if (search) {
      nvfp4_kernel<decltype(s)::value, true><<<blocks_for(n_blocks), kThreads, 0, native(stream)>>>(
          w, n_blocks, weight_amax, global_scale, packed, block_scale, err, *search);
    } else {
      nvfp4_kernel<decltype(s)::value, false>
          <<<blocks_for(n_blocks), kThreads, 0, native(stream)>>>(
              w, n_blocks, weight_amax, global_scale, packed, block_scale, err, Nvfp4Search{});
    }
  });
  check(cudaGetLastError(), "quantizer launch");
  return global_scale;
}

float fp8_quantize(const void* w, DType dtype, int64_t n, float weight_amax, uint8_t* out,
                   std::string_view name, Stream& stream, bool fp32_quotient) {
  const Src src = src_of(dtype, name, "fp8");
  check_shape(1, n, 1, name, "fp8");
  STRATA_CHECK(std::isfinite(weight_amax) && weight_amax > 0.0f, "fp8: weight amax ", weight_amax,
               " of ", name,
               " is not a positive finite number (an all-zero weight has no finite FP8 scale; "
               "exclude the module)");
  const float scale = fp8_weight_scale(weight_amax);
  // The divisor as PyTorch's kernel sees it: the scale loaded in the weight's dtype (fp32 for an
  // fp32 quotient).
  const float divisor = fp32_quotient ? scale : round_to(dtype, scale);
  STRATA_CHECK(divisor > 0.0f && std::isfinite(divisor), "fp8: weight amax ", weight_amax, " of ",
               name, " gives a scale that is 0 or infinite in ", dtype_name(dtype));
  Err* err = error_slots(stream);
  dispatch(src, [&](auto s) {
    fp8_kernel<decltype(s)::value><<<blocks_for(n), kThreads, 0, native(stream)>>>(
        w, n, weight_amax, divisor, out, err, fp32_quotient);
  });
  Err host[2];
  read_errors(err, host, stream);
  STRATA_CHECK(host[0] == ULLONG_MAX, "fp8: tensor ", name, " has a NaN or infinite element at ",
               "flat index ", host[0], "; no format can give it a finite scale");
  STRATA_CHECK(host[1] == ULLONG_MAX, "fp8: tensor ", name, " has |W| above the weight amax ",
               weight_amax, " it was given at flat element ", host[1],
               "; the amax must be at least max|W|");
  return scale;
}

void mxfp8_quantize(const void* w, DType dtype, int64_t rows, int64_t cols, uint8_t* out,
                    uint8_t* scale, std::string_view name, Stream& stream) {
  const Src src = src_of(dtype, name, "mxfp8");
  check_shape(rows, cols, kMxfp8BlockSize, name, "mxfp8");
  const int64_t n_blocks = rows * cols / kMxfp8BlockSize;
  Err* err = error_slots(stream);
  dispatch(src, [&](auto s) {
    mxfp8_kernel<decltype(s)::value>
        <<<blocks_for(n_blocks), kThreads, 0, native(stream)>>>(w, n_blocks, out, scale, err);
  });
  Err host[2];
  read_errors(err, host, stream);
  STRATA_CHECK(host[0] == ULLONG_MAX, "mxfp8: tensor ", name, " has a NaN or infinite element at ",
               "flat index ", host[0], "; no format can give it a finite scale");
}

}  // namespace strata::quant::cuda
