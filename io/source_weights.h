// Compressed source weights (spec/format.md §8, docs/SOURCES.md): how a linear module's weight is
// stored in a source checkpoint, and its decompression to bf16, one module at a time as it is
// fetched (never the whole model). The forward (model/common.cpp load_weight), the plan and the
// exporter's source reads all go through read_source_weight, so they see the same values.
//
// Stored layouts, for a linear module M with logical weight W[out, in]:
//
//   kNone      M.weight            BF16/F16/F32 [out, in]               read as stored (a view)
//
//   kFp8Block  M.weight            F8_E4M3 [out, in]                    DeepSeek-V3 / Kimi-K2
//              M.weight_scale_inv  F32 (or BF16) [ceil(out/128), ceil(in/128)]
//              W[r, c] = e4m3(W8[r, c]) * S[r / 128, c / 128]
//
//   kInt4Pack  M.weight_packed     I32 [out, ceil(in/8)]                compressed-tensors
//              M.weight_scale      BF16/F16/F32 [out, ceil(in/g)]       "pack-quantized",
//              M.weight_shape      I32/I64 [2] = (out, in)              symmetric, group g
//              u = (packed[r, c/8] >> 4*(c%8)) & 0xF   (lowest nibble is element 0; as bytes of a
//              little-endian int32: byte 0 holds elements 0 (low nibble) and 1 (high nibble))
//              W[r, c] = (u - 8) * scale[r, c / g]
//              g is the group size: in / ncols(scale) when that divides, else 32 (the quantize
//              plan checks it against the quantization_config). Columns past `in` (padding to a
//              multiple of 8) are ignored. weight_zero_point (asymmetric) and weight_g_idx
//              (activation order) are refused.
//
//   kMxfp4     M.weight_blocks     U8 [out, in/32, 16]                  gpt-oss style: the
//              M.weight_scales     U8 (E8M0) [out, in/32]               parameter name + _blocks
//              byte j of a block holds elements 2j (low nibble) and 2j+1 (high nibble); a nibble
//              is an E2M1 code (bit 3 sign, magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6})
//              W[r, 32b + i] = e2m1(code_i) * 2^(scales[r, b] - 127)
//
// Every formula is evaluated as one fp32 multiplication of the decoded operands, and the result is
// rounded once more to bf16 (round to nearest, ties to even): the decompressed bf16 checkpoint
// DeepSeek's fp8_cast_bf16 (fp32 product stored as bf16) or compressed-tensors' decompression
// would write. The INT4 and MXFP4 products are exact in fp32; INT4 products carry up to 11
// significant bits and are not always bf16 values, FP8-block products (up to 28 bits) are rounded
// by the fp32 product and again by bf16, as DeepSeek's converter does; MXFP4 values are bf16
// values (within bf16's range). A result that is not finite in bf16 (an E8M0 or e4m3 NaN, an
// overflow past bf16's largest value) is a strata::Error naming the tensor.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "io/checkpoint.h"

namespace strata {

enum class SourceCompression : uint8_t {
  kNone,
  kFp8Block,
  kInt4Pack,
  kMxfp4,
};

// "none", "fp8_block128", "int4_pack_g32" style names are built by source_weight_label; this is
// the short one: "none", "fp8_block", "int4_pack", "mxfp4".
std::string_view source_compression_name(SourceCompression c);

struct SourceWeight {
  std::string module;  // M
  SourceCompression compression = SourceCompression::kNone;
  DType dtype = DType::kBF16;    // of the weight as read_source_weight returns it
  Shape shape;                   // logical [out, in] (kNone: the stored shape)
  int64_t group = 0;             // INT4 group size; FP8-block block edge (128); MXFP4 block (32)
  std::string stored;            // the tensor holding the values (M.weight, M.weight_packed, ...)
  std::vector<std::string> aux;  // the tensors read with it (scales, shape); none for kNone
};

// How module M's weight is stored; std::nullopt when the checkpoint has none of M.weight,
// M.weight_packed, M.weight_blocks. A compressed layout whose companion tensors are missing or
// have another shape or dtype is a strata::Error naming them.
std::optional<SourceWeight> find_source_weight(const Checkpoint& ckpt, const std::string& module);

// An INT4 module's shape is taken from its headers: [out, 8c] for M.weight_packed [out, c], in
// groups of 8c / s for M.weight_scale [out, s]. M.weight_shape itself (8 bytes a module, spread
// over the files: a 61-layer Kimi-K2 has 70k of them, which a cold start would wait for one
// page at a time) is compared later by int4_shape_mismatch; a source whose rows are not a
// multiple of 8 and of the group fails there.
//
// The first INT4 module of the checkpoint (in name order) whose M.weight_shape differs from the
// shape taken from its headers, as an error message naming both (and its name in *tensor); ""
// when every one agrees. Asks for every weight_shape at once, then reads them on several threads.
std::string int4_shape_mismatch(const Checkpoint& ckpt, std::string* tensor = nullptr);

// The module's weight: for kNone a view of the stored tensor; else a new BF16 tensor [out, in].
Tensor read_source_weight(const Checkpoint& ckpt, const SourceWeight& w);

// The decompressions themselves, on tensors (what read_source_weight applies; `what` names the
// module in messages). Each returns BF16 [out, in].
Tensor decompress_fp8_block(const Tensor& w8, const Tensor& scale_inv, int64_t block,
                            std::string_view what);
Tensor decompress_int4_pack(const Tensor& packed, const Tensor& scale, int64_t out, int64_t in,
                            int64_t group, std::string_view what);
Tensor decompress_mxfp4(const Tensor& blocks, const Tensor& scales, std::string_view what);

// If `name` is a compressed layout's value tensor (M.weight of an FP8 M.weight + weight_scale_inv
// pair, M.weight_packed, M.weight_blocks), its module M; else std::nullopt.
std::optional<std::string> compressed_module_of(const Checkpoint& ckpt, std::string_view name);
// Whether `name` is a companion tensor a compressed layout consumes (M.weight_scale_inv of an FP8
// weight, M.weight_scale / M.weight_shape of M.weight_packed, M.weight_scales of M.weight_blocks):
// decompression replaces it, so the export does not copy it.
bool is_compressed_aux(const Checkpoint& ckpt, std::string_view name);

}  // namespace strata
