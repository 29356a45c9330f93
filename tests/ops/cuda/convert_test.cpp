// ops/cuda/convert.h against core/dtype.h's conversions, io/source_weights.h's FP8-block, INT4
// pack-quantized and MXFP4 decompressions, and quant/'s dequantization of ModelOpt exports.
#include <cmath>
#include <cstring>
#include <tuple>
#include <utility>

#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"
#include "io/source_weights.h"
#include "ops/cuda/convert.h"
#include "ops/ops.h"
#include "quant/fp8.h"
#include "quant/mxfp8.h"
#include "quant/nvfp4.h"
#include "tests/ops/cuda/cuda_test_util.h"

namespace strata::ops::cuda {
namespace {

// Finite values over many binades plus ties (both directions), the largest finite values
// (rounding up to infinity and not), subnormals, signed zeros and infinities.
std::vector<float> rounding_cases(std::vector<float> x) {
  for (uint32_t u :
       {0x3F808000u, 0x3F818000u, 0xBF808000u, 0x3F808001u, 0x7F7FFFFFu, 0x7F7F7FFFu, 0xFF7F8000u,
        0x00000001u, 0x00008000u, 0x80018000u, 0x80000000u, 0x00000000u, 0x7F800000u, 0xFF800000u})
    x.push_back(float_of(u));
  return x;
}

// cast_bf16 / round_bf16: nearest, ties to even, bit for bit as core/dtype.h f32_to_bf16 and
// ops::round_bf16 for every value that is not NaN; bf16_to_f32 exact.
TEST_F(CudaOps, Bf16RoundingMatchesCoreForEveryNonNan) {
  std::vector<float> x = normal(4000, 1.0f);
  for (float& v : x)
    v = std::ldexp(v, static_cast<int>(rng()() % 200) - 100);
  x = rounding_cases(std::move(x));
  const size_t n = x.size();
  gpu::DeviceBuffer dx = up(x), dy = buffer(n * 2), db = buffer(n * 4);
  cast_bf16(dx.as<float>(), dy.as<uint16_t>(), static_cast<int64_t>(n), st());
  bf16_to_f32(dy.as<uint16_t>(), db.as<float>(), static_cast<int64_t>(n), st());
  round_bf16(dx.as<float>(), static_cast<int64_t>(n), st());
  const auto y = down<uint16_t>(dy, n);
  const auto back = down<float>(db, n);
  const auto rounded = down<float>(dx, n);
  std::vector<float> cpu = x;
  ops::round_bf16(cpu.data(), static_cast<int64_t>(n));
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(y[i], f32_to_bf16(x[i])) << "element " << i << " bits " << std::hex << bits_of(x[i]);
    ASSERT_EQ(bits_of(back[i]), static_cast<uint32_t>(y[i]) << 16) << i;
    ASSERT_EQ(bits_of(rounded[i]), bits_of(cpu[i])) << i;
  }
}

// The production rule for NaN (which the CPU does not share: core's f32_to_bf16 and
// ops::round_bf16 give the canonical 0x7FC0 for every NaN): a NaN keeps its sign and the top 7
// bits of its payload and is made quiet, i.e. bf16 = (top 16 bits of x) | 0x0040.
TEST_F(CudaOps, Bf16RoundingKeepsANansSignAndTopPayload) {
  const std::vector<uint32_t> nans = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF812345u,
                                      0x7FBFFFFFu, 0x7FFFFFFFu, 0xFFA00000u};
  std::vector<float> x;
  for (uint32_t u : nans)
    x.push_back(float_of(u));
  const size_t n = x.size();
  gpu::DeviceBuffer dx = up(x), dy = buffer(n * 2);
  cast_bf16(dx.as<float>(), dy.as<uint16_t>(), static_cast<int64_t>(n), st());
  round_bf16(dx.as<float>(), static_cast<int64_t>(n), st());
  const auto y = down<uint16_t>(dy, n);
  const auto rounded = down<float>(dx, n);
  for (size_t i = 0; i < n; ++i) {
    const uint16_t want = static_cast<uint16_t>((nans[i] >> 16) | 0x0040u);
    EXPECT_EQ(y[i], want) << std::hex << nans[i];
    EXPECT_EQ(bits_of(rounded[i]), static_cast<uint32_t>(want) << 16) << std::hex << nans[i];
    EXPECT_TRUE(std::isnan(rounded[i]));
    EXPECT_EQ(std::signbit(rounded[i]), (nans[i] >> 31) != 0);
  }
}

// convert_to_f32 is exact from F32, F16 and BF16; convert_to_bf16 copies BF16 and rounds the
// others' fp32 values as f32_to_bf16 (F16 -> fp32 is exact). Other dtypes are refused.
TEST_F(CudaOps, ConversionsFromEachFloatingDtype) {
  const std::vector<float> f = rounding_cases(normal(3000, 50.0f));
  const size_t n = f.size();
  std::vector<uint16_t> h(n), b(n);
  for (size_t i = 0; i < n; ++i) {
    h[i] = f32_to_f16(f[i]);
    b[i] = f32_to_bf16(f[i]);
  }
  h.push_back(0x7E01);  // an F16 NaN: converted to fp32, it stays NaN
  b.push_back(0xFF81);  // a BF16 NaN: copied as it is
  gpu::DeviceBuffer df = up(f), dh = up(h), db = up(b);
  gpu::DeviceBuffer out32 = buffer((n + 1) * 4), out16 = buffer((n + 1) * 2);
  const int64_t nn = static_cast<int64_t>(n);

  convert_to_f32(df.data(), DType::kF32, out32.as<float>(), nn, st());
  auto g32 = down<float>(out32, n);
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(bits_of(g32[i]), bits_of(f[i])) << "F32 " << i;
  convert_to_bf16(df.data(), DType::kF32, out16.as<uint16_t>(), nn, st());
  auto g16 = down<uint16_t>(out16, n);
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(g16[i], f32_to_bf16(f[i])) << "F32 -> bf16 " << i;

  convert_to_f32(dh.data(), DType::kF16, out32.as<float>(), nn + 1, st());
  g32 = down<float>(out32, n + 1);
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(bits_of(g32[i]), bits_of(f16_to_f32(h[i]))) << "F16 " << i;
  EXPECT_TRUE(std::isnan(g32[n]));
  convert_to_bf16(dh.data(), DType::kF16, out16.as<uint16_t>(), nn, st());
  g16 = down<uint16_t>(out16, n);
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(g16[i], f32_to_bf16(f16_to_f32(h[i]))) << "F16 -> bf16 " << i;

  convert_to_f32(db.data(), DType::kBF16, out32.as<float>(), nn, st());
  g32 = down<float>(out32, n);
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(bits_of(g32[i]), bits_of(strata::bf16_to_f32(b[i]))) << "BF16 " << i;
  convert_to_bf16(db.data(), DType::kBF16, out16.as<uint16_t>(), nn + 1, st());
  EXPECT_EQ(down<uint16_t>(out16, n + 1), b);

  EXPECT_THROW(convert_to_f32(df.data(), DType::kF8E4M3, out32.as<float>(), nn, st()), Error);
  EXPECT_THROW(convert_to_bf16(df.data(), DType::kI32, out16.as<uint16_t>(), nn, st()), Error);
}

// convert_transposed: element [c, r] of the output is element [r, c] of the input, converted
// as convert_to_f32 / convert_to_bf16, or its bits in the input's own dtype; shapes that are not
// multiples of the 32 x 32 tile, one row, one column; a bf16 input's bits (a signalling NaN too)
// copied to a bf16 output.
TEST_F(CudaOps, TransposedConversionMovesEveryElementAndConvertsLikeTheFlatOne) {
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {1, 70}, {70, 1}, {33, 31}, {64, 96}, {97, 130}}) {
    const size_t n = static_cast<size_t>(rows * cols);
    const std::vector<float> f = normal(n, 3.0f);
    std::vector<uint16_t> h(n), b(n);
    for (size_t i = 0; i < n; ++i) {
      h[i] = f32_to_f16(f[i]);
      b[i] = f32_to_bf16(f[i]);
    }
    b[n / 2] = 0xFF81;  // a signalling bf16 NaN
    gpu::DeviceBuffer out32 = buffer(n * 4), out16 = buffer(n * 2);
    for (const DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
      gpu::DeviceBuffer src = dt == DType::kF32 ? up(f) : up(dt == DType::kF16 ? h : b);
      auto value = [&](size_t i) {  // the input's element i in fp32, as the CPU reads it
        return dt == DType::kF32   ? f[i]
               : dt == DType::kF16 ? f16_to_f32(h[i])
                                   : strata::bf16_to_f32(b[i]);
      };
      convert_transposed(src.data(), dt, rows, cols, out32.data(), DType::kF32, st());
      convert_transposed(src.data(), dt, rows, cols, out16.data(), DType::kBF16, st());
      const auto g32 = down<float>(out32, n);
      const auto g16 = down<uint16_t>(out16, n);
      // In its own dtype: the input's bits, moved.
      gpu::DeviceBuffer same = buffer(n * (dt == DType::kF32 ? 4 : 2));
      convert_transposed(src.data(), dt, rows, cols, same.data(), dt, st());
      const auto g32s = down<uint32_t>(same, dt == DType::kF32 ? n : 0);
      const auto g16s = down<uint16_t>(same, dt == DType::kF32 ? 0 : n);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const size_t in = static_cast<size_t>(r * cols + c),
                       at = static_cast<size_t>(c * rows + r);
          const float v = value(in);
          if (std::isnan(v)) {
            ASSERT_TRUE(std::isnan(g32[at]));
          } else {
            ASSERT_EQ(bits_of(g32[at]), bits_of(v))
                << dtype_name(dt) << " " << rows << "x" << cols << " [" << r << "," << c << "]";
          }
          const uint16_t want = dt == DType::kBF16 ? b[in] : f32_to_bf16(v);
          ASSERT_EQ(g16[at], want) << dtype_name(dt) << " -> bf16 " << rows << "x" << cols << " ["
                                   << r << "," << c << "]";
          if (dt == DType::kF32)
            ASSERT_EQ(g32s[at], bits_of(f[in])) << "F32 as is [" << r << "," << c << "]";
          else
            ASSERT_EQ(g16s[at], dt == DType::kF16 ? h[in] : b[in])
                << dtype_name(dt) << " as is [" << r << "," << c << "]";
        }
      }
    }
  }
}

// convert_transposed of a 1-byte dtype (an export's NVFP4 bytes, its E4M3 block scales, FP8
// values): every byte moved to [c, r], on shapes that are not multiples of the tile; to another
// dtype it is refused.
TEST_F(CudaOps, TransposedBytesMoveEveryByte) {
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {1, 70}, {70, 1}, {33, 31}, {100, 1600}, {97, 130}}) {
    const size_t n = static_cast<size_t>(rows * cols);
    std::vector<uint8_t> b(n);
    for (size_t i = 0; i < n; ++i)
      b[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
    gpu::DeviceBuffer src = up(b), out = buffer(n);
    for (const DType dt : {DType::kU8, DType::kF8E4M3}) {
      convert_transposed(src.data(), dt, rows, cols, out.data(), dt, st());
      const auto got = down<uint8_t>(out, n);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          ASSERT_EQ(got[static_cast<size_t>(c * rows + r)], b[static_cast<size_t>(r * cols + c)])
              << dtype_name(dt) << " " << rows << "x" << cols << " [" << r << "," << c << "]";
    }
    EXPECT_ANY_THROW(
        convert_transposed(src.data(), DType::kU8, rows, cols, out.data(), DType::kBF16, st()));
  }
}

// The decompressions: the device's bf16 bits and its fp32 values against the CPU's.
class CudaDecompress : public CudaOps {
 protected:
  // Calls launch(dst, to_bf16) for a bf16 and an fp32 output of ref's size. A BF16 ref (a source's
  // decompression): both outputs are ref's values. An F32 ref (an export's dequantization): the
  // fp32 output is ref bit for bit, the bf16 one its rounding.
  template <typename Launch>
  void expect_like_cpu(const Tensor& ref, Launch launch) {
    const int64_t n = ref.numel();
    const bool f32 = ref.dtype() == DType::kF32;
    gpu::DeviceBuffer d16 = buffer(static_cast<uint64_t>(n) * 2);
    gpu::DeviceBuffer d32 = buffer(static_cast<uint64_t>(n) * 4);
    launch(d16.data(), true);
    launch(d32.data(), false);
    const auto g16 = down<uint16_t>(d16, static_cast<size_t>(n));
    const auto g32 = down<float>(d32, static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t want32 = f32 ? bits_of(ref.data<float>()[i])
                                  : static_cast<uint32_t>(ref.data<uint16_t>()[i]) << 16;
      const uint16_t want16 = f32 ? f32_to_bf16(ref.data<float>()[i]) : ref.data<uint16_t>()[i];
      ASSERT_EQ(g16[i], want16) << "element " << i << " of " << shape_str(ref.shape());
      ASSERT_EQ(bits_of(g32[i]), want32) << "fp32 element " << i;
    }
  }
};

TEST_F(CudaDecompress, Fp8BlocksLikeTheCpu) {
  std::mt19937 rng(3);
  // Odd sizes (partial blocks), every e4m3 code but NaN, scales over several binades.
  for (auto [out, in] : {std::pair<int64_t, int64_t>{130, 260}, {7, 128}, {256, 100}}) {
    const int64_t br = (out + 127) / 128, bc = (in + 127) / 128;
    Tensor w8 = Tensor::zeros(DType::kF8E4M3, {out, in});
    uint8_t* w = w8.mutable_data<uint8_t>();
    for (int64_t i = 0; i < out * in; ++i) {
      uint8_t b = static_cast<uint8_t>(rng() & 0xFF);
      if ((b & 0x7F) == 0x7F) b ^= 1;  // not NaN
      w[i] = b;
    }
    Tensor sc = Tensor::zeros(DType::kF32, {br, bc});
    std::uniform_real_distribution<float> e(-12.0f, 4.0f);
    for (int64_t i = 0; i < br * bc; ++i)
      sc.mutable_data<float>()[i] = std::exp2(e(rng)) * (1.0f + static_cast<float>(i % 7) / 9.0f);
    const Tensor ref = decompress_fp8_block(w8, sc, 128, "test");
    std::vector<uint8_t> hw(w, w + out * in);
    std::vector<float> hs(sc.data<float>(), sc.data<float>() + br * bc);
    gpu::DeviceBuffer dw = up(hw), ds = up(hs);
    expect_like_cpu(ref, [&](void* dst, bool to_bf16) {
      dequant_fp8_block(dw.as<uint8_t>(), out, in, 128, ds.data(), DType::kF32, dst, to_bf16, st());
    });
  }
}

// Every nibble, a width that is not a multiple of 8 (a padded last word) nor of the group, bf16
// and fp32 scales over several binades; the packed words at an odd byte offset.
TEST_F(CudaDecompress, Int4PackLikeTheCpu) {
  std::mt19937 rng(5);
  for (auto [out, in, group] :
       {std::tuple<int64_t, int64_t, int64_t>{9, 100, 32}, {4, 64, 128}, {33, 257, 16}}) {
    const int64_t nw = (in + 7) / 8, ng = (in + group - 1) / group;
    Tensor packed = Tensor::zeros(DType::kI32, {out, nw});
    uint32_t* words = reinterpret_cast<uint32_t*>(packed.mutable_data<int32_t>());
    for (int64_t i = 0; i < out * nw; ++i)
      words[i] = static_cast<uint32_t>(rng());
    for (DType sdt : {DType::kBF16, DType::kF32}) {
      Tensor sc = Tensor::zeros(sdt, {out, ng});
      std::uniform_real_distribution<float> e(-14.0f, 3.0f);
      std::vector<uint8_t> hs(sc.nbytes());
      for (int64_t i = 0; i < out * ng; ++i) {
        const float v = std::exp2(e(rng)) * (1.0f + static_cast<float>(i % 5) / 7.0f);
        if (sdt == DType::kBF16) {
          sc.mutable_data<uint16_t>()[i] = f32_to_bf16(v);
        } else {
          sc.mutable_data<float>()[i] = v;
        }
      }
      std::memcpy(hs.data(), sc.bytes(), sc.nbytes());
      const Tensor ref = decompress_int4_pack(packed, sc, out, in, group, "test");
      std::vector<uint8_t> hw(1 + packed.nbytes());  // one byte before: misaligned words
      std::memcpy(hw.data() + 1, packed.bytes(), packed.nbytes());
      gpu::DeviceBuffer dw = up(hw), ds = up(hs);
      expect_like_cpu(ref, [&](void* dst, bool to_bf16) {
        dequant_int4_pack(dw.as<uint8_t>() + 1, out, in, group, ds.data(), sdt, dst, to_bf16, st());
      });
    }
  }
}

// Every E2M1 code in both nibbles, E8M0 scales from 2^-127 (a subnormal) to 2^127 where the
// product stays a finite bf16.
TEST_F(CudaDecompress, Mxfp4LikeTheCpu) {
  std::mt19937 rng(9);
  const int64_t out = 37, groups = 5;
  Tensor blocks = Tensor::zeros(DType::kU8, {out, groups, 16});
  Tensor scales = Tensor::zeros(DType::kU8, {out, groups});
  for (int64_t i = 0; i < out * groups * 16; ++i)
    blocks.mutable_data<uint8_t>()[i] = static_cast<uint8_t>(rng() & 0xFF);
  for (int64_t i = 0; i < out * groups; ++i)
    scales.mutable_data<uint8_t>()[i] = static_cast<uint8_t>(i == 0 ? 0 : rng() % 252);
  const Tensor ref = decompress_mxfp4(blocks, scales, "test");
  std::vector<uint8_t> hb(blocks.bytes(), blocks.bytes() + blocks.nbytes());
  std::vector<uint8_t> hs(scales.bytes(), scales.bytes() + scales.nbytes());
  gpu::DeviceBuffer db = up(hb), ds = up(hs);
  expect_like_cpu(ref, [&](void* dst, bool to_bf16) {
    dequant_mxfp4(db.as<uint8_t>(), ds.as<uint8_t>(), out, groups, dst, to_bf16, st());
  });
}

// The batched launchers (a slice of routed experts in one launch): three weights of one shape
// and kind, each with its own values and scales, listed in a table with a stride larger than the
// launch's count (a slice in the middle of a layer's table); each output must be the CPU's
// decompression of its own weight, and the table's entries outside the slice left alone.
class CudaDecompressMany : public CudaDecompress {
 protected:
  // Weights w (host bytes of values and scales) and the CPU's decompression of each; launch(table,
  // to_bf16) must decompress table entries [1, 4) of a stride-5 table.
  template <typename Launch>
  void expect_each_like_cpu(const std::vector<std::vector<uint8_t>>& values,
                            const std::vector<std::vector<uint8_t>>& scales,
                            const std::vector<Tensor>& refs, int64_t value_offset, Launch launch) {
    const size_t n = refs.size();
    const int64_t numel = refs[0].numel();
    std::vector<gpu::DeviceBuffer> dv, ds;
    for (size_t i = 0; i < n; ++i) {
      dv.push_back(up(values[i]));
      ds.push_back(up(scales[i]));
    }
    for (bool to_bf16 : {true, false}) {
      const uint64_t each = static_cast<uint64_t>(numel) * (to_bf16 ? 2 : 4);
      // Outputs one after another at 256-byte aligned offsets, plus a sentinel one past them.
      const uint64_t slot = (each + 255) / 256 * 256;
      gpu::DeviceBuffer out = up(std::vector<uint8_t>(slot * (n + 1), 0xEE));
      std::vector<const void*> table(15, nullptr);  // stride 5: entries 1..3 are the weights
      for (size_t i = 0; i < n; ++i) {
        table[1 + i] = dv[i].as<uint8_t>() + value_offset;
        table[5 + 1 + i] = ds[i].data();
        table[10 + 1 + i] = out.as<uint8_t>() + slot * i;
      }
      gpu::DeviceBuffer dt = up(table);
      launch(WeightTable{dt.as<const void*>() + 1, 5, static_cast<int64_t>(n)}, to_bf16);
      const auto got = down<uint8_t>(out, static_cast<size_t>(slot * (n + 1)));
      for (size_t i = 0; i < n; ++i) {
        const uint16_t* r = refs[i].data<uint16_t>();
        for (int64_t j = 0; j < numel; ++j) {
          const uint8_t* g = got.data() + slot * i;
          if (to_bf16) {
            uint16_t b;
            std::memcpy(&b, g + j * 2, 2);
            ASSERT_EQ(b, r[j]) << "weight " << i << " element " << j;
          } else {
            uint32_t b;
            std::memcpy(&b, g + j * 4, 4);
            ASSERT_EQ(b, static_cast<uint32_t>(r[j]) << 16) << "weight " << i << " element " << j;
          }
        }
      }
      for (size_t j = slot * n; j < got.size(); ++j)
        ASSERT_EQ(got[j], 0xEE) << "written past the weights at byte " << j;
    }
  }
};

TEST_F(CudaDecompressMany, Mxfp4) {
  std::mt19937 rng(11);
  const int64_t out = 19, groups = 3;
  std::vector<std::vector<uint8_t>> values, scales;
  std::vector<Tensor> refs;
  for (int w = 0; w < 3; ++w) {
    Tensor blocks = Tensor::zeros(DType::kU8, {out, groups, 16});
    Tensor sc = Tensor::zeros(DType::kU8, {out, groups});
    for (int64_t i = 0; i < out * groups * 16; ++i)
      blocks.mutable_data<uint8_t>()[i] = static_cast<uint8_t>(rng() & 0xFF);
    for (int64_t i = 0; i < out * groups; ++i)
      sc.mutable_data<uint8_t>()[i] = static_cast<uint8_t>(rng() % 252);
    refs.push_back(decompress_mxfp4(blocks, sc, "test"));
    values.emplace_back(blocks.bytes(), blocks.bytes() + blocks.nbytes());
    scales.emplace_back(sc.bytes(), sc.bytes() + sc.nbytes());
  }
  expect_each_like_cpu(values, scales, refs, 0, [&](const WeightTable& t, bool to_bf16) {
    dequant_mxfp4_many(t, out, groups, to_bf16, st());
  });
}

TEST_F(CudaDecompressMany, Int4Pack) {
  std::mt19937 rng(13);
  // A width that is neither a multiple of 8 nor of the group; words at an odd byte offset.
  const int64_t out = 7, in = 75, group = 16, nw = (in + 7) / 8, ng = (in + group - 1) / group;
  std::vector<std::vector<uint8_t>> values, scales;
  std::vector<Tensor> refs;
  for (int w = 0; w < 3; ++w) {
    Tensor packed = Tensor::zeros(DType::kI32, {out, nw});
    uint32_t* words = reinterpret_cast<uint32_t*>(packed.mutable_data<int32_t>());
    for (int64_t i = 0; i < out * nw; ++i)
      words[i] = static_cast<uint32_t>(rng());
    Tensor sc = Tensor::zeros(DType::kBF16, {out, ng});
    std::uniform_real_distribution<float> e(-14.0f, 3.0f);
    for (int64_t i = 0; i < out * ng; ++i)
      sc.mutable_data<uint16_t>()[i] = f32_to_bf16(std::exp2(e(rng)));
    refs.push_back(decompress_int4_pack(packed, sc, out, in, group, "test"));
    std::vector<uint8_t> v(1 + packed.nbytes());
    std::memcpy(v.data() + 1, packed.bytes(), packed.nbytes());
    values.push_back(std::move(v));
    scales.emplace_back(sc.bytes(), sc.bytes() + sc.nbytes());
  }
  expect_each_like_cpu(values, scales, refs, 1, [&](const WeightTable& t, bool to_bf16) {
    dequant_int4_pack_many(t, out, in, group, DType::kBF16, to_bf16, st());
  });
}

TEST_F(CudaDecompressMany, Fp8Blocks) {
  std::mt19937 rng(17);
  const int64_t out = 130, in = 140;
  std::vector<std::vector<uint8_t>> values, scales;
  std::vector<Tensor> refs;
  for (int w = 0; w < 3; ++w) {
    Tensor w8 = Tensor::zeros(DType::kF8E4M3, {out, in});
    for (int64_t i = 0; i < out * in; ++i) {
      uint8_t b = static_cast<uint8_t>(rng() & 0xFF);
      if ((b & 0x7F) == 0x7F) b ^= 1;  // not NaN
      w8.mutable_data<uint8_t>()[i] = b;
    }
    Tensor sc = Tensor::zeros(DType::kF32, {2, 2});
    for (int64_t i = 0; i < 4; ++i)
      sc.mutable_data<float>()[i] = std::exp2(static_cast<float>(w * 3 - 5 + i));
    refs.push_back(decompress_fp8_block(w8, sc, 128, "test"));
    values.emplace_back(w8.bytes(), w8.bytes() + w8.nbytes());
    scales.emplace_back(sc.bytes(), sc.bytes() + sc.nbytes());
  }
  expect_each_like_cpu(values, scales, refs, 0, [&](const WeightTable& t, bool to_bf16) {
    dequant_fp8_block_many(t, out, in, 128, DType::kF32, to_bf16, st());
  });
}

// A ModelOpt export's weights (strata compare on the GPU): quant/'s encodings of weights over
// many binades (zeros, negatives, values that saturate), dequantized on the device bit for bit as
// quant/'s nvfp4_dequantize, fp8_dequantize, fp8_pb_dequantize and mxfp8_dequantize, in fp32 and
// rounded to bf16.
class CudaExportDequant : public CudaDecompress {
 protected:
  static Tensor weights(int64_t out, int64_t in, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> e(-20.0f, 6.0f), u(-1.0f, 1.0f);
    Tensor w = Tensor::zeros(DType::kF32, {out, in});
    float* p = w.mutable_data<float>();
    for (int64_t i = 0; i < out * in; ++i)
      p[i] = i % 29 == 0 ? 0.0f : u(rng) * std::exp2(e(rng));
    return w;
  }
  static float amax(const Tensor& w) {
    float a = 0.0f;
    for (int64_t i = 0; i < w.numel(); ++i)
      a = std::max(a, std::fabs(w.data<float>()[i]));
    return a;
  }
  template <typename T>
  static std::vector<T> host(const Tensor& t) {
    std::vector<T> v(t.nbytes() / sizeof(T));
    std::memcpy(v.data(), t.bytes(), t.nbytes());
    return v;
  }
};

TEST_F(CudaExportDequant, Nvfp4BothBlocks) {
  for (int64_t block : {kNvfp4BlockSize, kNvfp4Bs32BlockSize}) {
    const Tensor w = weights(37, 192, 11);
    // An amax above the weights' own max: the largest blocks do not reach code 6.
    const Nvfp4Weight q = nvfp4_quantize(w, amax(w) * 1.5f, "test", block);
    const Tensor ref = nvfp4_dequantize(q);
    gpu::DeviceBuffer dp = up(host<uint8_t>(q.packed)), ds = up(host<uint8_t>(q.block_scale));
    gpu::DeviceBuffer dg = up(host<float>(q.global_scale));
    expect_like_cpu(ref, [&](void* dst, bool to_bf16) {
      dequant_nvfp4_export(dp.as<uint8_t>(), ds.as<uint8_t>(), dg.as<float>(), 37, 192, block, dst,
                           to_bf16, st());
    });
  }
}

TEST_F(CudaExportDequant, Fp8PerTensorAndPerBlock) {
  {
    const Tensor w = weights(600, 1100, 12);
    const Fp8Weight q = fp8_quantize(w, amax(w), "test");
    const Tensor ref = fp8_dequantize(q);
    gpu::DeviceBuffer dw = up(host<uint8_t>(q.weight)), ds = up(host<float>(q.scale));
    expect_like_cpu(ref, [&](void* dst, bool to_bf16) {
      dequant_fp8_export(dw.as<uint8_t>(), ds.as<float>(), 600, 1100, 0, dst, to_bf16, st());
    });
  }
  {
    const Tensor w = weights(200, 300, 13);  // 2 x 3 blocks, the last row and column partial
    const Fp8Weight q = fp8_pb_quantize(w, "test");
    ASSERT_EQ(q.scale.numel(), 6);
    const Tensor ref = fp8_pb_dequantize(q);
    gpu::DeviceBuffer dw = up(host<uint8_t>(q.weight)), ds = up(host<float>(q.scale));
    expect_like_cpu(ref, [&](void* dst, bool to_bf16) {
      dequant_fp8_export(dw.as<uint8_t>(), ds.as<float>(), 200, 300, 128, dst, to_bf16, st());
    });
  }
}

TEST_F(CudaExportDequant, Mxfp8) {
  const Tensor w = weights(45, 320, 14);
  const Mxfp8Weight q = mxfp8_quantize(w, "test");
  const Tensor ref = mxfp8_dequantize(q);
  gpu::DeviceBuffer dw = up(host<uint8_t>(q.weight)), ds = up(host<uint8_t>(q.scale));
  expect_like_cpu(ref, [&](void* dst, bool to_bf16) {
    dequant_mxfp8_export(dw.as<uint8_t>(), ds.as<uint8_t>(), 45, 320, dst, to_bf16, st());
  });
}

}  // namespace
}  // namespace strata::ops::cuda
