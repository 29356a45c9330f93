#include "io/source_weights.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"

namespace strata {

namespace {

constexpr int64_t kFp8Block = 128;
constexpr int64_t kMxfp4Block = 32;
constexpr int64_t kInt4DefaultGroup = 32;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// One row of fp32 products -> bf16 bits (nearest, ties to even: the same bits as f32_to_bf16
// for every finite input). A non-finite input or result is refused naming the first one.
void bf16_row(const float* v, int64_t n, uint16_t* dst, std::string_view what, int64_t r) {
  uint32_t bad = 0;
  for (int64_t c = 0; c < n; ++c) {
    const uint32_t u = std::bit_cast<uint32_t>(v[c]);
    const uint32_t b = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    bad |= static_cast<uint32_t>((u & 0x7F800000u) == 0x7F800000u) |
           static_cast<uint32_t>((b & 0x7F80u) == 0x7F80u);
    dst[c] = static_cast<uint16_t>(b);
  }
  if (bad == 0) return;
  for (int64_t c = 0; c < n; ++c) {
    const uint16_t b = f32_to_bf16(v[c]);
    STRATA_CHECK((b & 0x7F80) != 0x7F80, what, ": decompressed element [", r, ", ", c, "] is ",
                 v[c], ", not a finite bf16 value; the source checkpoint is damaged");
  }
}

// One row of scales as fp32.
void scales_row(const Tensor& t, int64_t offset, int64_t n, std::vector<float>& out) {
  out.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    out[i] = t.item_f32(offset + i);
}

// e4m3 byte -> fp32, all 256 (NaN included).
const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (int b = 0; b < 256; ++b)
      a[b] = e4m3_to_f32(static_cast<uint8_t>(b));
    return a;
  }();
  return t;
}

bool is_float_dtype(DType d) {
  return d == DType::kBF16 || d == DType::kF16 || d == DType::kF32;
}

int64_t read_int(const Tensor& t, int64_t i) {
  if (t.dtype() == DType::kI64) return t.data<int64_t>()[i];
  return t.data<int32_t>()[i];
}

}  // namespace

std::string_view source_compression_name(SourceCompression c) {
  switch (c) {
    case SourceCompression::kNone:
      return "none";
    case SourceCompression::kFp8Block:
      return "fp8_block";
    case SourceCompression::kInt4Pack:
      return "int4_pack";
    case SourceCompression::kMxfp4:
      return "mxfp4";
  }
  STRATA_ASSERT(false, "unhandled SourceCompression ", static_cast<int>(c));
}

Tensor decompress_fp8_block(const Tensor& w8, const Tensor& scale_inv, int64_t block,
                            std::string_view what) {
  STRATA_CHECK(w8.dtype() == DType::kF8E4M3 && w8.ndim() == 2, what,
               ": an FP8-block weight must be F8_E4M3 [out, in], got ", dtype_name(w8.dtype()), " ",
               shape_str(w8.shape()));
  const int64_t out = w8.dim(0), in = w8.dim(1);
  const Shape want{ceil_div(out, block), ceil_div(in, block)};
  STRATA_CHECK(is_float_dtype(scale_inv.dtype()) && scale_inv.shape() == want, what,
               ".weight_scale_inv is ", dtype_name(scale_inv.dtype()), " ",
               shape_str(scale_inv.shape()), "; ", block, "x", block, " blocks of ",
               shape_str(w8.shape()), " need a floating ", shape_str(want));
  Tensor w = Tensor::zeros(DType::kBF16, {out, in});
  uint16_t* dst = w.mutable_data<uint16_t>();
  const uint8_t* src = w8.data<uint8_t>();
  const std::array<float, 256>& e4m3 = e4m3_table();
  std::vector<float> s, v(static_cast<size_t>(in));
  for (int64_t r = 0; r < out; ++r) {
    if (r % block == 0) scales_row(scale_inv, (r / block) * want[1], want[1], s);
    const uint8_t* row = src + r * in;
    for (int64_t b = 0; b < want[1]; ++b) {
      const int64_t end = std::min(in, (b + 1) * block);
      for (int64_t c = b * block; c < end; ++c)
        v[c] = e4m3[row[c]] * s[b];  // one fp32 product
    }
    bf16_row(v.data(), in, dst + r * in, what, r);
  }
  return w;
}

Tensor decompress_int4_pack(const Tensor& packed, const Tensor& scale, int64_t out, int64_t in,
                            int64_t group, std::string_view what) {
  STRATA_CHECK(out > 0 && in > 0 && group > 0, what, ": INT4 weight_shape (", out, ", ", in,
               ") and group ", group, " must be positive");
  const Shape want_packed{out, ceil_div(in, 8)};
  STRATA_CHECK(packed.dtype() == DType::kI32 && packed.shape() == want_packed, what,
               ".weight_packed is ", dtype_name(packed.dtype()), " ", shape_str(packed.shape()),
               "; weight_shape (", out, ", ", in, ") packed 8 to an int32 needs i32 ",
               shape_str(want_packed));
  const Shape want_scale{out, ceil_div(in, group)};
  STRATA_CHECK(is_float_dtype(scale.dtype()) && scale.shape() == want_scale, what,
               ".weight_scale is ", dtype_name(scale.dtype()), " ", shape_str(scale.shape()),
               "; groups of ", group, " along ", in, " inputs need a floating ",
               shape_str(want_scale));
  Tensor w = Tensor::zeros(DType::kBF16, {out, in});
  uint16_t* dst = w.mutable_data<uint16_t>();
  const uint32_t* words = reinterpret_cast<const uint32_t*>(packed.data<int32_t>());
  const int64_t nw = want_packed[1];
  std::vector<float> s, v(static_cast<size_t>(nw * 8));
  std::vector<float> q(static_cast<size_t>(nw * 8));  // [nw * 8]: the row's values, padding too
  for (int64_t r = 0; r < out; ++r) {
    scales_row(scale, r * want_scale[1], want_scale[1], s);
    const uint32_t* row = words + r * nw;
    for (int64_t k = 0; k < nw; ++k) {
      for (int64_t i = 0; i < 8; ++i)  // lowest nibble first
        q[k * 8 + i] = static_cast<float>(static_cast<int32_t>((row[k] >> (4 * i)) & 0xFu) - 8);
    }
    for (int64_t g = 0; g < want_scale[1]; ++g) {
      const int64_t end = std::min(in, (g + 1) * group);
      for (int64_t c = g * group; c < end; ++c)
        v[c] = q[c] * s[g];  // exact in fp32
    }
    bf16_row(v.data(), in, dst + r * in, what, r);
  }
  return w;
}

Tensor decompress_mxfp4(const Tensor& blocks, const Tensor& scales, std::string_view what) {
  STRATA_CHECK(blocks.dtype() == DType::kU8 && blocks.ndim() == 3 && blocks.dim(2) == 16, what,
               ".weight_blocks must be U8 [out, in/32, 16], got ", dtype_name(blocks.dtype()), " ",
               shape_str(blocks.shape()));
  const int64_t out = blocks.dim(0), groups = blocks.dim(1), in = groups * kMxfp4Block;
  STRATA_CHECK((scales.dtype() == DType::kU8 || scales.dtype() == DType::kF8E8M0) &&
                   scales.shape() == Shape({out, groups}),
               what, ".weight_scales is ", dtype_name(scales.dtype()), " ",
               shape_str(scales.shape()), "; it must be U8 (E8M0) ", shape_str({out, groups}));
  Tensor w = Tensor::zeros(DType::kBF16, {out, in});
  uint16_t* dst = w.mutable_data<uint16_t>();
  const uint8_t* b = blocks.data<uint8_t>();
  const uint8_t* s = scales.data<uint8_t>();
  float e2m1[16];
  for (uint8_t code = 0; code < 16; ++code)
    e2m1[code] = e2m1_to_f32(code);
  std::vector<float> v(static_cast<size_t>(in));
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float scale = e8m0_to_f32(s[r * groups + g]);  // 2^(e - 127); 0xFF is NaN
      const uint8_t* bytes = b + (r * groups + g) * 16;
      float* o = v.data() + g * kMxfp4Block;
      for (int64_t j = 0; j < 16; ++j) {  // element 2j in the low nibble
        o[2 * j] = e2m1[bytes[j] & 0xF] * scale;
        o[2 * j + 1] = e2m1[bytes[j] >> 4] * scale;
      }
    }
    bf16_row(v.data(), in, dst + r * in, what, r);
  }
  return w;
}

std::optional<SourceWeight> find_source_weight(const Checkpoint& ckpt, const std::string& m) {
  SourceWeight w;
  w.module = m;
  auto require = [&](const std::string& name, const char* layout) {
    STRATA_CHECK(ckpt.has(name), ckpt.dir(), ": '", w.stored, "' is stored as ", layout, " but '",
                 name, "' is missing");
    w.aux.push_back(name);
  };
  if (ckpt.has(m + ".weight_packed")) {
    w.compression = SourceCompression::kInt4Pack;
    w.stored = m + ".weight_packed";
    require(m + ".weight_scale", "compressed-tensors pack-quantized INT4");
    require(m + ".weight_shape", "compressed-tensors pack-quantized INT4");
    STRATA_CHECK(!ckpt.has(m + ".weight_zero_point"), ckpt.dir(), ": '", m,
                 ".weight_zero_point' is present: asymmetric INT4 sources are not supported "
                 "(only symmetric pack-quantized, as Kimi-K2-Thinking ships)");
    STRATA_CHECK(!ckpt.has(m + ".weight_g_idx"), ckpt.dir(), ": '", m,
                 ".weight_g_idx' is present: INT4 sources with activation order are not supported");
    // The shape from the headers (weight_shape itself is compared later: int4_shape_mismatch).
    const TensorEntry& p = ckpt.entry(w.stored);
    const TensorEntry& s = ckpt.entry(m + ".weight_scale");
    const TensorEntry& d = ckpt.entry(m + ".weight_shape");
    STRATA_CHECK((d.dtype == DType::kI32 || d.dtype == DType::kI64) && shape_numel(d.shape) == 2,
                 ckpt.dir(), ": '", m, ".weight_shape' must hold two integers (out, in), got ",
                 dtype_name(d.dtype), " ", shape_str(d.shape));
    STRATA_CHECK(p.dtype == DType::kI32 && p.shape.size() == 2 && p.shape[0] > 0 && p.shape[1] > 0,
                 ckpt.dir(), ": '", w.stored, "' is ", dtype_name(p.dtype), " ", shape_str(p.shape),
                 "; pack-quantized INT4 codes are I32 [out, in/8]");
    STRATA_CHECK(s.shape.size() == 2 && s.shape[0] == p.shape[0] && s.shape[1] > 0, ckpt.dir(),
                 ": '", m, ".weight_scale' is ", shape_str(s.shape), "; '", w.stored, "' ",
                 shape_str(p.shape), " needs [", p.shape[0], ", in/group]");
    w.shape = {p.shape[0], p.shape[1] * 8};
    w.group = w.shape[1] % s.shape[1] == 0 ? w.shape[1] / s.shape[1] : kInt4DefaultGroup;
    return w;
  }
  if (ckpt.has(m + ".weight_blocks")) {
    w.compression = SourceCompression::kMxfp4;
    w.stored = m + ".weight_blocks";
    require(m + ".weight_scales", "MXFP4 blocks");
    const TensorEntry& b = ckpt.entry(w.stored);
    STRATA_CHECK(b.shape.size() == 3 && b.shape[2] == 16, ckpt.dir(), ": '", w.stored,
                 "' has shape ", shape_str(b.shape), "; MXFP4 blocks are U8 [out, in/32, 16]");
    w.shape = {b.shape[0], b.shape[1] * kMxfp4Block};
    w.group = kMxfp4Block;
    return w;
  }
  if (!ckpt.has(m + ".weight")) return std::nullopt;
  w.stored = m + ".weight";
  const TensorEntry& e = ckpt.entry(w.stored);
  if (e.dtype == DType::kF8E4M3 && ckpt.has(m + ".weight_scale_inv")) {
    w.compression = SourceCompression::kFp8Block;
    w.aux.push_back(m + ".weight_scale_inv");
    w.shape = e.shape;
    w.group = kFp8Block;
    STRATA_CHECK(e.shape.size() == 2, ckpt.dir(), ": '", w.stored, "' has shape ",
                 shape_str(e.shape), "; an FP8-block weight is [out, in]");
    return w;
  }
  w.compression = SourceCompression::kNone;
  w.dtype = e.dtype;
  w.shape = e.shape;
  return w;
}

std::string int4_shape_mismatch(const Checkpoint& ckpt, std::string* tensor) {
  std::vector<std::string> modules, names;  // every M with M.weight_packed, and M.weight_shape
  for (const std::string& n : ckpt.tensor_names()) {
    if (!n.ends_with(".weight_packed")) continue;
    const std::string m = n.substr(0, n.size() - 14);
    if (!ckpt.has(m + ".weight_shape")) continue;
    modules.push_back(m);
    names.push_back(m + ".weight_shape");
  }
  ckpt.will_need(names);  // all at once, at the disk's queue depth
  std::vector<std::string> wrong(names.size());
  parallel_chunks(names.size(), startup_threads(), 1024, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const SourceWeight w = *find_source_weight(ckpt, modules[i]);
      const Tensor shape = ckpt.metadata(names[i]);
      const int64_t out = read_int(shape, 0), in = read_int(shape, 1);
      if (out == w.shape[0] && in == w.shape[1]) continue;
      wrong[i] = str(ckpt.dir(), ": '", names[i], "' is (", out, ", ", in, ") but '", w.stored,
                     "' gives (", w.shape[0], ", ", w.shape[1],
                     "): strata takes INT4 shapes from the packed tensors (rows a multiple of 8 "
                     "long); the checkpoint may be damaged");
    }
  });
  for (size_t i = 0; i < wrong.size(); ++i) {
    if (wrong[i].empty()) continue;
    if (tensor) *tensor = names[i];
    return wrong[i];
  }
  return "";
}

Tensor read_source_weight(const Checkpoint& ckpt, const SourceWeight& w) {
  const std::string what = ckpt.dir() + ": '" + w.module + "'";
  switch (w.compression) {
    case SourceCompression::kNone:
      return ckpt.tensor(w.stored);
    case SourceCompression::kFp8Block:
      return decompress_fp8_block(ckpt.tensor(w.stored), ckpt.tensor(w.aux[0]), w.group, what);
    case SourceCompression::kInt4Pack:
      return decompress_int4_pack(ckpt.tensor(w.stored), ckpt.tensor(w.aux[0]), w.shape[0],
                                  w.shape[1], w.group, what);
    case SourceCompression::kMxfp4:
      return decompress_mxfp4(ckpt.tensor(w.stored), ckpt.tensor(w.aux[0]), what);
  }
  STRATA_ASSERT(false, "unhandled SourceCompression ", static_cast<int>(w.compression));
}

std::optional<std::string> compressed_module_of(const Checkpoint& ckpt, std::string_view name) {
  for (std::string_view suffix : {".weight_packed", ".weight_blocks"}) {
    if (name.ends_with(suffix)) return std::string(name.substr(0, name.size() - suffix.size()));
  }
  if (name.ends_with(".weight")) {
    const std::string m(name.substr(0, name.size() - 7));
    if (ckpt.has(m + ".weight_scale_inv") && ckpt.entry(std::string(name)).dtype == DType::kF8E4M3)
      return m;
  }
  return std::nullopt;
}

bool is_compressed_aux(const Checkpoint& ckpt, std::string_view name) {
  auto module_with = [&](std::string_view suffix, std::string_view value) {
    if (!name.ends_with(suffix)) return false;
    const std::string m(name.substr(0, name.size() - suffix.size()));
    return ckpt.has(m + std::string(value));
  };
  if (name.ends_with(".weight_scale_inv")) {
    const std::string m(name.substr(0, name.size() - 17));
    return ckpt.has(m + ".weight") && ckpt.entry(m + ".weight").dtype == DType::kF8E4M3;
  }
  return module_with(".weight_scale", ".weight_packed") ||
         module_with(".weight_shape", ".weight_packed") ||
         module_with(".weight_scales", ".weight_blocks");
}

}  // namespace strata
