// dtype conversions and bf16 rounding on the device (host launchers: ops/cuda/convert.h).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "core/cuda_fp.cuh"
#include "core/error.h"
#include "ops/cuda/convert.h"
#include "ops/cuda/launch.cuh"

namespace strata::ops::cuda {
namespace {

using launch::blocks_for;
using launch::kThreads;
using launch::launched;
using launch::st;

__device__ __forceinline__ uint16_t f32_bf16_bits(float x) {
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
__device__ __forceinline__ float bf16_bits_f32(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

__device__ __forceinline__ float load_as_f32(const void* src, int dt, int64_t i) {
  switch (dt) {
    case 0:
      return static_cast<const float*>(src)[i];
    case 1:
      return __half2float(static_cast<const __half*>(src)[i]);
    default:
      return bf16_bits_f32(static_cast<const uint16_t*>(src)[i]);
  }
}

int dtype_code(DType d) {
  switch (d) {
    case DType::kF32:
      return 0;
    case DType::kF16:
      return 1;
    case DType::kBF16:
      return 2;
    default:
      fail("GPU forward: weights of dtype ", dtype_name(d),
           " are not supported (F32, F16, BF16); use --device cpu");
  }
}

__global__ void k_to_f32(const void* src, int dt, float* dst, int64_t n) {
  FOR_N(i, n) dst[i] = load_as_f32(src, dt, i);
}
__global__ void k_to_bf16(const void* src, int dt, uint16_t* dst, int64_t n) {
  FOR_N(i, n)
  dst[i] = dt == 2 ? static_cast<const uint16_t*>(src)[i] : f32_bf16_bits(load_as_f32(src, dt, i));
}
// One 32 x 32 tile of src through shared memory, so that both the reads and the writes of a
// warp are contiguous; blockDim (32, 8), each thread four rows of the tile. The tile holds each
// element's bits; out_code: -1 the source's own dtype (bits copied), 0 fp32, 2 bf16.
constexpr int kTile = 32;
// dt: dtype_code's, or kByteCode for a 1-byte dtype moved as its bits (convert_transposed).
constexpr int kByteCode = 3;
__device__ __forceinline__ uint32_t load_bits(const void* src, int dt, int64_t i) {
  return dt == 0           ? static_cast<const uint32_t*>(src)[i]
         : dt == kByteCode ? static_cast<const uint8_t*>(src)[i]
                           : static_cast<const uint16_t*>(src)[i];
}
__device__ __forceinline__ float bits_f32(uint32_t b, int dt) {
  return dt == 0   ? __uint_as_float(b)
         : dt == 1 ? __half2float(__ushort_as_half(static_cast<unsigned short>(b)))
                   : bf16_bits_f32(static_cast<uint16_t>(b));
}
__global__ void k_transposed(const void* src, int dt, int64_t rows, int64_t cols, void* dst,
                             int out_code) {
  __shared__ uint32_t tile[kTile][kTile + 1];
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile;
  for (int k = threadIdx.y; k < kTile; k += blockDim.y) {
    const int64_t r = r0 + k, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[k][threadIdx.x] = load_bits(src, dt, r * cols + c);
  }
  __syncthreads();
  const int code = out_code < 0 ? dt : out_code;
  for (int k = threadIdx.y; k < kTile; k += blockDim.y) {
    const int64_t c = c0 + k, r = r0 + threadIdx.x;  // dst row c, column r
    if (r >= rows || c >= cols) continue;
    const uint32_t b = tile[threadIdx.x][k];
    const int64_t at = c * rows + r;
    if (code == dt) {  // the same dtype: the bits (a signalling NaN too)
      if (dt == 0)
        static_cast<uint32_t*>(dst)[at] = b;
      else if (dt == kByteCode)
        static_cast<uint8_t*>(dst)[at] = static_cast<uint8_t>(b);
      else
        static_cast<uint16_t*>(dst)[at] = static_cast<uint16_t>(b);
    } else if (code == 0) {
      static_cast<float*>(dst)[at] = bits_f32(b, dt);
    } else {
      static_cast<uint16_t*>(dst)[at] = f32_bf16_bits(bits_f32(b, dt));
    }
  }
}
__global__ void k_cast_bf16(const float* x, uint16_t* y, int64_t n) {
  FOR_N(i, n) y[i] = f32_bf16_bits(x[i]);
}
__global__ void k_bf16_f32(const uint16_t* x, float* y, int64_t n) {
  FOR_N(i, n) y[i] = bf16_bits_f32(x[i]);
}
__global__ void k_round_bf16(float* x, int64_t n) {
  FOR_N(i, n) x[i] = bf16_bits_f32(f32_bf16_bits(x[i]));
}

// Where weight blockIdx.y of a decompression launch is: one weight given by its pointers, or
// many through a device table (WeightTable). Each weight's blocks (blockIdx.x) loop over its
// elements (FOR_N).
struct Where {
  const uint8_t* values = nullptr;
  const void* scales = nullptr;
  void* dst = nullptr;
  const void* const* table =
      nullptr;  // else: values, scales, dst of weight i at i, stride + i, ...
  int64_t stride = 0;
  __device__ __forceinline__ void of(int64_t i, const uint8_t*& v, const void*& s, void*& d) const {
    if (!table) {
      v = values, s = scales, d = dst;
      return;
    }
    v = static_cast<const uint8_t*>(table[i]);
    s = table[stride + i];
    d = const_cast<void*>(table[2 * stride + i]);
  }
};

// Element i of a decompressed weight, as bf16 bits or as the fp32 value of those bits.
__device__ __forceinline__ void put(void* dst, int64_t i, uint16_t b, bool to_bf16) {
  if (to_bf16) {
    static_cast<uint16_t*>(dst)[i] = b;
  } else {
    static_cast<float*>(dst)[i] = bf16_bits_f32(b);
  }
}

// DeepSeek FP8 blocks (io/source_weights.h decompress_fp8_block): w[r, c] = bf16(e4m3(w8[r, c]) *
// scale_inv[r / block, c / block]), one fp32 product rounded to bf16; stored as bf16 bits or as
// the fp32 value of that bf16.
__global__ void k_dequant_fp8_block(Where where, int64_t out, int64_t in, int64_t block,
                                    int scale_dt, bool to_bf16) {
  const uint8_t* w;
  const void* scale;
  void* dst;
  where.of(blockIdx.y, w, scale, dst);
  const int64_t blocks_per_row = (in + block - 1) / block;
  FOR_N(i, out * in) {
    const int64_t r = i / in, c = i % in;
    const float sc = load_as_f32(scale, scale_dt, (r / block) * blocks_per_row + c / block);
    put(dst, i, f32_bf16_bits(__fmul_rn(cuda_fp::from_e4m3(w[i]), sc)), to_bf16);
  }
}

// Compressed-tensors INT4 pack-quantized (io/source_weights.h decompress_int4_pack): w[r, c] =
// bf16((nibble c % 8 of word c / 8 of row r, lowest first, minus 8) * scale[r, c / group]), one
// exact fp32 product rounded to bf16; stored as bf16 bits or as the fp32 value of that bf16. One
// thread a word (8 values; the last word of a row may be padding past `in`).
__global__ void k_dequant_int4_pack(Where where, int64_t out, int64_t in, int64_t group,
                                    int scale_dt, bool to_bf16) {
  const uint8_t* packed;
  const void* scale;
  void* dst;
  where.of(blockIdx.y, packed, scale, dst);
  const int64_t nw = (in + 7) / 8, ng = (in + group - 1) / group;
  FOR_N(wi, out * nw) {
    const int64_t r = wi / nw, c0 = (wi % nw) * 8;
    const uint8_t* p = packed + wi * 4;  // little-endian, any alignment
    const uint32_t word = static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                          (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
    const int64_t n = in - c0 < 8 ? in - c0 : 8;
    for (int64_t k = 0; k < n; ++k) {
      const float q = static_cast<float>(static_cast<int32_t>((word >> (4 * k)) & 0xFu) - 8);
      const float sc = load_as_f32(scale, scale_dt, r * ng + (c0 + k) / group);
      put(dst, r * in + c0 + k, f32_bf16_bits(__fmul_rn(q, sc)), to_bf16);
    }
  }
}

// MXFP4 (io/source_weights.h decompress_mxfp4): w[r, 32 g + j] = bf16(e2m1(code) * 2^(e - 127)),
// code the low nibble of byte j / 2 of block [r, g] for even j, the high one for odd j; e the
// block's E8M0 scale (0xFF: NaN; 0: 2^-127, a subnormal). The product is exact.
using cuda_fp::from_e2m1;
__device__ __forceinline__ float e8m0_f32(uint32_t e) {
  if (e == 0xFFu) return __uint_as_float(0x7fc00000u);
  if (e == 0) return __uint_as_float(0x00400000u);  // 2^-127
  return __uint_as_float(e << 23);
}
// One thread a stored byte (two values, which are stored side by side: [r, g] is row r's group g,
// so byte b of the weight's blocks holds values 2b and 2b + 1 of the [out, 32 groups] output).
__global__ void k_dequant_mxfp4(Where where, int64_t out, int64_t groups, bool to_bf16) {
  const uint8_t* blocks;
  const void* scales_v;
  void* dst;
  where.of(blockIdx.y, blocks, scales_v, dst);
  const auto* scales = static_cast<const uint8_t*>(scales_v);
  FOR_N(b, out * groups * 16) {
    const uint8_t byte = blocks[b];
    const float sc = e8m0_f32(scales[b / 16]);
    const uint16_t lo = f32_bf16_bits(__fmul_rn(from_e2m1(byte & 0xFu), sc));
    const uint16_t hi = f32_bf16_bits(__fmul_rn(from_e2m1(byte >> 4), sc));
    if (to_bf16) {  // 4-byte aligned: dst is (a DeviceBuffer's, a slot's) and 2b is even
      static_cast<uint32_t*>(dst)[b] =
          static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
    } else {
      static_cast<float2*>(dst)[b] = make_float2(bf16_bits_f32(lo), bf16_bits_f32(hi));
    }
  }
}

// Blocks of a decompression launch: per weight enough for `units`, at most about 8192 over all
// `count` weights (each block loops over the rest), at least one per weight.
dim3 dequant_grid(int64_t units, int64_t count) {
  STRATA_ASSERT(count >= 1 && count <= 65535, "decompression of ", count,
                " weights in one launch (1 to 65535)");
  const int64_t cap = 8192 / count > 1 ? 8192 / count : 1;
  const int64_t x = (units + kThreads - 1) / kThreads;
  return dim3(static_cast<unsigned>(x < cap ? (x < 1 ? 1 : x) : cap), static_cast<unsigned>(count));
}

Where table_of(const WeightTable& t) {
  Where w;
  w.table = t.ptrs;
  w.stride = t.stride;
  return w;
}

// The fp32 value v stored as bf16 bits or fp32.
__device__ __forceinline__ void store(void* dst, int64_t i, float v, bool to_bf16) {
  if (to_bf16) {
    static_cast<uint16_t*>(dst)[i] = f32_bf16_bits(v);
  } else {
    static_cast<float*>(dst)[i] = v;
  }
}

// quant/nvfp4.cpp nvfp4_dequantize: e2m1(code) * (e4m3(scale) * global), in that order.
__global__ void k_dequant_nvfp4(const uint8_t* packed, const uint8_t* scales, const float* global,
                                int64_t n, int64_t block, void* dst, bool to_bf16) {
  const float g = *global;
  FOR_N(i, n) {
    const uint8_t byte = packed[i / 2];
    const uint32_t code = (i % 2 == 0) ? (byte & 0xFu) : (byte >> 4);
    const float descale = __fmul_rn(cuda_fp::from_e4m3(scales[i / block]), g);
    store(dst, i, __fmul_rn(from_e2m1(code), descale), to_bf16);
  }
}

// quant/fp8.cpp fp8_dequantize (block 0) and fp8_pb_dequantize (block 128).
__global__ void k_dequant_fp8_export(const uint8_t* w, const float* scales, int64_t out, int64_t in,
                                     int64_t block, void* dst, bool to_bf16) {
  const int64_t nc = block > 0 ? (in + block - 1) / block : 1;
  FOR_N(i, out * in) {
    const int64_t r = i / in, c = i % in;
    const float s = block > 0 ? scales[(r / block) * nc + c / block] : scales[0];
    store(dst, i, __fmul_rn(cuda_fp::from_e4m3(w[i]), s), to_bf16);
  }
}

// quant/mxfp8.cpp mxfp8_dequantize: ldexp(e4m3, e - 127), exact (or infinity, as ldexp).
__global__ void k_dequant_mxfp8_export(const uint8_t* w, const uint8_t* scales, int64_t n,
                                       void* dst, bool to_bf16) {
  FOR_N(i, n) {
    const int e = static_cast<int>(scales[i / 32]) - 127;  // -127 .. 128
    const int k = e < 128 ? e : 127;
    const float p = k >= -126 ? __uint_as_float(static_cast<uint32_t>(k + 127) << 23)
                              : __uint_as_float(0x00400000u);  // 2^-127
    float v = __fmul_rn(cuda_fp::from_e4m3(w[i]), p);
    if (e == 128) v = __fmul_rn(v, 2.0f);
    store(dst, i, v, to_bf16);
  }
}

}  // namespace

void dequant_nvfp4_export(const uint8_t* packed, const uint8_t* block_scales,
                          const float* global_scale, int64_t out, int64_t in, int64_t block,
                          void* dst, bool to_bf16, void* s) {
  if (out * in == 0) return;
  k_dequant_nvfp4<<<blocks_for(out * in), kThreads, 0, st(s)>>>(packed, block_scales, global_scale,
                                                                out * in, block, dst, to_bf16);
  launched("dequant_nvfp4_export");
}
void dequant_fp8_export(const uint8_t* w8, const float* scales, int64_t out, int64_t in,
                        int64_t block, void* dst, bool to_bf16, void* s) {
  if (out * in == 0) return;
  k_dequant_fp8_export<<<blocks_for(out * in), kThreads, 0, st(s)>>>(w8, scales, out, in, block,
                                                                     dst, to_bf16);
  launched("dequant_fp8_export");
}
void dequant_mxfp8_export(const uint8_t* w8, const uint8_t* scales, int64_t out, int64_t in,
                          void* dst, bool to_bf16, void* s) {
  if (out * in == 0) return;
  k_dequant_mxfp8_export<<<blocks_for(out * in), kThreads, 0, st(s)>>>(w8, scales, out * in, dst,
                                                                       to_bf16);
  launched("dequant_mxfp8_export");
}

void convert_to_f32(const void* src, DType dtype, float* dst, int64_t n, void* s) {
  if (n == 0) return;
  k_to_f32<<<blocks_for(n), kThreads, 0, st(s)>>>(src, dtype_code(dtype), dst, n);
  launched("convert_to_f32");
}
void convert_to_bf16(const void* src, DType dtype, uint16_t* dst, int64_t n, void* s) {
  if (n == 0) return;
  k_to_bf16<<<blocks_for(n), kThreads, 0, st(s)>>>(src, dtype_code(dtype), dst, n);
  launched("convert_to_bf16");
}
void convert_transposed(const void* src, DType dtype, int64_t rows, int64_t cols, void* dst,
                        DType out, void* s) {
  const bool bytes = dtype_bits(dtype) == 8;
  STRATA_ASSERT(out == dtype || (!bytes && (out == DType::kF32 || out == DType::kBF16)),
                "convert_transposed: to ", dtype_name(out), " from ", dtype_name(dtype));
  const int dt = bytes ? kByteCode : dtype_code(dtype);
  const int out_code = out == dtype ? -1 : dtype_code(out);
  if (rows <= 0 || cols <= 0) return;
  STRATA_ASSERT((cols + kTile - 1) / kTile <= 0x7fffffff && (rows + kTile - 1) / kTile <= 65535,
                "convert_transposed: ", rows, " x ", cols, " is too large for one launch");
  const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile),
                  static_cast<unsigned>((rows + kTile - 1) / kTile));
  k_transposed<<<grid, dim3(kTile, 8), 0, st(s)>>>(src, dt, rows, cols, dst, out_code);
  launched("convert_transposed");
}
void dequant_fp8_block(const uint8_t* w8, int64_t out, int64_t in, int64_t block,
                       const void* scale_inv, DType scale_dtype, void* dst, bool to_bf16, void* s) {
  if (out * in == 0) return;
  Where where;
  where.values = w8, where.scales = scale_inv, where.dst = dst;
  k_dequant_fp8_block<<<dequant_grid(out * in, 1), kThreads, 0, st(s)>>>(
      where, out, in, block, dtype_code(scale_dtype), to_bf16);
  launched("dequant_fp8_block");
}
void dequant_fp8_block_many(const WeightTable& t, int64_t out, int64_t in, int64_t block,
                            DType scale_dtype, bool to_bf16, void* s) {
  if (out * in == 0 || t.count == 0) return;
  k_dequant_fp8_block<<<dequant_grid(out * in, t.count), kThreads, 0, st(s)>>>(
      table_of(t), out, in, block, dtype_code(scale_dtype), to_bf16);
  launched("dequant_fp8_block_many");
}
void dequant_int4_pack(const uint8_t* packed, int64_t out, int64_t in, int64_t group,
                       const void* scale, DType scale_dtype, void* dst, bool to_bf16, void* s) {
  if (out * in == 0) return;
  STRATA_CHECK(group > 0, "dequant_int4_pack: group ", group, " must be positive");
  Where where;
  where.values = packed, where.scales = scale, where.dst = dst;
  k_dequant_int4_pack<<<dequant_grid(out * ((in + 7) / 8), 1), kThreads, 0, st(s)>>>(
      where, out, in, group, dtype_code(scale_dtype), to_bf16);
  launched("dequant_int4_pack");
}
void dequant_int4_pack_many(const WeightTable& t, int64_t out, int64_t in, int64_t group,
                            DType scale_dtype, bool to_bf16, void* s) {
  if (out * in == 0 || t.count == 0) return;
  STRATA_CHECK(group > 0, "dequant_int4_pack: group ", group, " must be positive");
  k_dequant_int4_pack<<<dequant_grid(out * ((in + 7) / 8), t.count), kThreads, 0, st(s)>>>(
      table_of(t), out, in, group, dtype_code(scale_dtype), to_bf16);
  launched("dequant_int4_pack_many");
}
void dequant_mxfp4(const uint8_t* blocks, const uint8_t* scales, int64_t out, int64_t groups,
                   void* dst, bool to_bf16, void* s) {
  if (out * groups == 0) return;
  STRATA_ASSERT(reinterpret_cast<uintptr_t>(dst) % 8 == 0, "dequant_mxfp4: dst misaligned");
  Where where;
  where.values = blocks, where.scales = scales, where.dst = dst;
  k_dequant_mxfp4<<<dequant_grid(out * groups * 16, 1), kThreads, 0, st(s)>>>(where, out, groups,
                                                                              to_bf16);
  launched("dequant_mxfp4");
}
void dequant_mxfp4_many(const WeightTable& t, int64_t out, int64_t groups, bool to_bf16, void* s) {
  if (out * groups == 0 || t.count == 0) return;
  k_dequant_mxfp4<<<dequant_grid(out * groups * 16, t.count), kThreads, 0, st(s)>>>(
      table_of(t), out, groups, to_bf16);
  launched("dequant_mxfp4_many");
}
void cast_bf16(const float* x, uint16_t* y, int64_t n, void* s) {
  if (n == 0) return;
  k_cast_bf16<<<blocks_for(n), kThreads, 0, st(s)>>>(x, y, n);
  launched("cast_bf16");
}
void bf16_to_f32(const uint16_t* x, float* y, int64_t n, void* s) {
  if (n == 0) return;
  k_bf16_f32<<<blocks_for(n), kThreads, 0, st(s)>>>(x, y, n);
  launched("bf16_to_f32");
}
void round_bf16(float* x, int64_t n, void* s) {
  if (n == 0) return;
  k_round_bf16<<<blocks_for(n), kThreads, 0, st(s)>>>(x, n);
  launched("round_bf16");
}

}  // namespace strata::ops::cuda
