// dtype conversions and bf16 rounding on the device (kernels: ops/cuda/convert.cu). Conventions
// of every ops/cuda header (docs/CUDA.md): no CUDA header is needed to include it; pointers are
// device pointers; `stream` is a cudaStream_t passed as void*, and every launcher is asynchronous
// on it; layouts are row-major, shapes in the comments; bf16 values are their uint16_t bits.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace strata::ops::cuda {

// dst[n] = src[n] converted from a floating dtype (F32, F16, BF16) to fp32 (exact) / bf16 bits
// (as cast_bf16); any other dtype throws strata::Error before the launch.
void convert_to_f32(const void* src, DType dtype, float* dst, int64_t n, void* stream);
void convert_to_bf16(const void* src, DType dtype, uint16_t* dst, int64_t n, void* stream);
// dst[c, r] = src[r, c]: src [rows, cols] of a floating dtype (F32, F16, BF16), dst [cols, rows]
// in `out`: the source's own dtype (its bits copied), or F32 / BF16 converted as convert_to_f32 /
// convert_to_bf16; a 1-byte dtype (U8, F8_E4M3, ...) only to itself, its bytes copied. For
// weights stored transposed (gpt-oss's experts [E, in, out] in bf16, and an export's in NVFP4
// bytes or FP8, io/checkpoint.h transposed views): the CPU's transposed copy of the view.
void convert_transposed(const void* src, DType dtype, int64_t rows, int64_t cols, void* dst,
                        DType out, void* stream);
// A DeepSeek FP8-block weight w8 F8_E4M3 [out, in] with scale_inv [ceil(out/block),
// ceil(in/block)] (F32, F16 or BF16) decompressed as the CPU does (io/source_weights.h
// decompress_fp8_block, bit-identical): one fp32 product rounded to bf16; dst is bf16 bits
// (to_bf16) or the fp32 value of that bf16.
void dequant_fp8_block(const uint8_t* w8, int64_t out, int64_t in, int64_t block,
                       const void* scale_inv, DType scale_dtype, void* dst, bool to_bf16,
                       void* stream);
// A compressed-tensors INT4 pack-quantized weight (8 nibbles to a little-endian int32, lowest
// first, value nibble - 8; any alignment) [out, ceil(in/8)] with group-wise scales [out,
// ceil(in/group)] (F32, F16 or BF16), decompressed as the CPU does (io/source_weights.h
// decompress_int4_pack, bit-identical on every finite result; the CPU refuses a non-finite one, the
// device writes it): dst [out, in] as dequant_fp8_block's.
void dequant_int4_pack(const uint8_t* packed, int64_t out, int64_t in, int64_t group,
                       const void* scale, DType scale_dtype, void* dst, bool to_bf16, void* stream);
// An MXFP4 weight: blocks U8 [out, groups, 16] (two E2M1 codes a byte, the even element low),
// scales E8M0 [out, groups]; decompressed as io/source_weights.h decompress_mxfp4 (bit-identical on
// every finite result): dst [out, 32 * groups] as dequant_fp8_block's.
void dequant_mxfp4(const uint8_t* blocks, const uint8_t* scales, int64_t out, int64_t groups,
                   void* dst, bool to_bf16, void* stream);
// The three above for several weights of one shape in one launch (a slice of routed experts,
// ops::decompress_weights): weight i < count has its stored values (w8, packed or blocks), its
// scales and its output at ptrs[i], ptrs[stride + i] and ptrs[2 * stride + i], a device array of
// device pointers; each is decompressed as its one-weight launcher does. dequant_mxfp4's outputs
// (one or many) must be 8-byte aligned.
struct WeightTable {
  const void* const* ptrs = nullptr;
  int64_t stride = 0, count = 0;
};
void dequant_fp8_block_many(const WeightTable& t, int64_t out, int64_t in, int64_t block,
                            DType scale_dtype, bool to_bf16, void* stream);
void dequant_int4_pack_many(const WeightTable& t, int64_t out, int64_t in, int64_t group,
                            DType scale_dtype, bool to_bf16, void* stream);
void dequant_mxfp4_many(const WeightTable& t, int64_t out, int64_t groups, bool to_bf16,
                        void* stream);
// A ModelOpt export's weight [out, in] dequantized as model/common.cpp reads it (bit-identical to
// quant/nvfp4.cpp nvfp4_dequantize, quant/fp8.cpp fp8_dequantize / fp8_pb_dequantize,
// quant/mxfp8.cpp mxfp8_dequantize): fp32 values, or those rounded to bf16 bits (to_bf16).
// NVFP4: packed U8 [out, in/2] (even element low), E4M3 block scales [out, in/block], the F32
// global scale at global_scale: e2m1 · (e4m3 · global). FP8: F8_E4M3 times one F32 scale
// (block 0) or the F32 scale of its 128 x 128 block (block 128). MXFP8: F8_E4M3 · 2^(e - 127).
void dequant_nvfp4_export(const uint8_t* packed, const uint8_t* block_scales,
                          const float* global_scale, int64_t out, int64_t in, int64_t block,
                          void* dst, bool to_bf16, void* stream);
void dequant_fp8_export(const uint8_t* w8, const float* scales, int64_t out, int64_t in,
                        int64_t block, void* dst, bool to_bf16, void* stream);
void dequant_mxfp8_export(const uint8_t* w8, const uint8_t* scales, int64_t out, int64_t in,
                          void* dst, bool to_bf16, void* stream);
// y[n] = bf16(x[n]): nearest, ties to even, as core/dtype.h f32_to_bf16 for every non-NaN x
// (infinities and overflow to infinity included). A NaN stays NaN with its sign and the top
// bits of its payload, made quiet: the top 16 bits of x with bit 6 (the bf16 quiet bit) set.
// (The CPU's f32_to_bf16 and ops::round_bf16 give 0x7FC0 for every NaN instead.)
void cast_bf16(const float* x, uint16_t* y, int64_t n, void* stream);
// y[n] = the fp32 value of bf16 x[n] (exact).
void bf16_to_f32(const uint16_t* x, float* y, int64_t n, void* stream);
// x[n] = float(bf16(x[n])) in place, with cast_bf16's rounding: ops::round_bf16 for every
// non-NaN value.
void round_bf16(float* x, int64_t n, void* stream);

}  // namespace strata::ops::cuda
