#include "io/fused_experts.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io_test_util.h"

namespace strata {
namespace {

using test::expect_error;
using test::st_bytes;
using test::TempDir;
using test::write_bytes;

struct Stored {
  std::string name, dtype;
  Shape shape;
  std::string bytes;
};

// One model.safetensors holding `tensors` back to back (each tensor's bytes a multiple of 4).
void write_checkpoint(const TempDir& dir, const std::vector<Stored>& tensors) {
  std::string header = "{", data;
  for (const Stored& t : tensors) {
    if (header.size() > 1) header += ",";
    std::string shape;
    for (int64_t d : t.shape)
      shape += (shape.empty() ? "" : ",") + std::to_string(d);
    header += "\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":[" + shape +
              "],\"data_offsets\":[" + std::to_string(data.size()) + "," +
              std::to_string(data.size() + t.bytes.size()) + "]}";
    data += t.bytes;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');  // the data section 8-aligned, as writers pad
  write_bytes(dir.file("model.safetensors"), st_bytes(header, data));
}

std::string f32_bytes(const std::vector<float>& v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), v.data(), s.size());
  return s;
}

// Expert e's weights, each element telling where it comes from: leaf 1 gate, 2 up, 3 down.
float value(int e, int leaf, int r, int c) {
  return static_cast<float>(1000 * e + 100 * leaf + 10 * r + c);
}

constexpr int kE = 3, kI = 2, kH = 4;
const std::string kX = "model.layers.0.mlp.experts.";

// transformers 5's layout, built by stacking: gate_up[e] = [gate_e; up_e], down[e] = down_e.
std::vector<Stored> fused_f32(bool bias = false, int64_t down_in = kI) {
  std::vector<float> gate_up, down;
  for (int e = 0; e < kE; ++e) {
    for (int leaf : {1, 2}) {
      for (int r = 0; r < kI; ++r) {
        for (int c = 0; c < kH; ++c)
          gate_up.push_back(value(e, leaf, r, c));
      }
    }
    for (int r = 0; r < kH; ++r) {
      for (int c = 0; c < down_in; ++c)
        down.push_back(value(e, 3, r, c));
    }
  }
  std::vector<Stored> t = {
      {kX + "gate_up_proj", "F32", {kE, 2 * kI, kH}, f32_bytes(gate_up)},
      {kX + "down_proj", "F32", {kE, kH, down_in}, f32_bytes(down)},
      {"model.norm.weight", "F32", {kH}, f32_bytes(std::vector<float>(kH, 1.0f))},
  };
  if (bias)
    t.push_back({kX + "gate_up_proj_bias",
                 "F32",
                 {kE, 2 * kI},
                 f32_bytes({0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})});
  return t;
}

TEST(FusedExperts, ServesEachExpertAsAView) {
  TempDir dir;
  write_checkpoint(dir, fused_f32());
  const Checkpoint c = Checkpoint::open(dir.path());
  EXPECT_FALSE(c.has(kX + "gate_up_proj"));
  EXPECT_FALSE(c.has(kX + "down_proj"));
  EXPECT_EQ(c.tensor_names().size(), 3u * kE + 1);
  const char* leaves[] = {"gate_proj", "up_proj", "down_proj"};
  for (int e = 0; e < kE; ++e) {
    for (int leaf = 1; leaf <= 3; ++leaf) {
      const std::string name = kX + std::to_string(e) + "." + leaves[leaf - 1] + ".weight";
      ASSERT_TRUE(c.has(name)) << name;
      EXPECT_EQ(c.view_base(name), kX + (leaf == 3 ? "down_proj" : "gate_up_proj"));
      const Tensor t = c.tensor(name);
      const int rows = leaf == 3 ? kH : kI, cols = leaf == 3 ? kI : kH;
      ASSERT_EQ(t.shape(), Shape({rows, cols})) << name;
      ASSERT_EQ(t.dtype(), DType::kF32);
      for (int r = 0; r < rows; ++r) {
        for (int col = 0; col < cols; ++col)
          EXPECT_EQ(t.data<float>()[r * cols + col], value(e, leaf, r, col)) << name;
      }
    }
  }
  EXPECT_EQ(c.view_base("model.norm.weight"), "");
  // Reading every view reads the fused tensors' bytes once.
  EXPECT_EQ(c.bytes_read(), static_cast<uint64_t>(kE * (2 * kI * kH + kH * kI) * 4));
}

TEST(FusedExperts, OtherLayoutsStayFused) {
  {  // gpt-oss style but incomplete: a gate_up bias without the down bias
    TempDir dir;
    write_checkpoint(dir, fused_f32(/*bias=*/true));
    const Checkpoint c = Checkpoint::open(dir.path());
    EXPECT_TRUE(c.has(kX + "gate_up_proj"));
    EXPECT_FALSE(c.has(kX + "0.gate_proj.weight"));
  }
  {  // down_proj's input width disagrees with gate_up_proj's I
    TempDir dir;
    write_checkpoint(dir, fused_f32(false, kI + 1));
    const Checkpoint c = Checkpoint::open(dir.path());
    EXPECT_TRUE(c.has(kX + "gate_up_proj"));
    EXPECT_TRUE(c.has(kX + "down_proj"));
    EXPECT_EQ(c.tensor_names().size(), 3u);
  }
}

TEST(FusedExperts, FusedAndPerExpertTogetherIsAnError) {
  TempDir dir;
  std::vector<Stored> t = fused_f32();
  t.push_back({kX + "0.gate_proj.weight", "F32", {kI, kH}, std::string(kI * kH * 4, '\0')});
  write_checkpoint(dir, t);
  expect_error([&] { Checkpoint::open(dir.path()); },
               {"both the fused '" + kX + "gate_up_proj'", kX + "0.gate_proj.weight"});
}

TEST(FusedExperts, Mxfp4BlocksAndScales) {
  // E = 2, I = 32, H = 64: gate_up blocks [2, 64, 2, 16], scales [2, 64, 2]; down blocks
  // [2, 64, 1, 16], scales [2, 64, 1]. Byte k of each tensor is k mod 251.
  auto bytes = [](size_t n) {
    std::string s(n, '\0');
    for (size_t k = 0; k < n; ++k)
      s[k] = static_cast<char>(k % 251);
    return s;
  };
  TempDir dir;
  write_checkpoint(dir, {{kX + "gate_up_proj_blocks", "U8", {2, 64, 2, 16}, bytes(2 * 64 * 32)},
                         {kX + "gate_up_proj_scales", "U8", {2, 64, 2}, bytes(2 * 64 * 2)},
                         {kX + "down_proj_blocks", "U8", {2, 64, 1, 16}, bytes(2 * 64 * 16)},
                         {kX + "down_proj_scales", "U8", {2, 64, 1}, bytes(2 * 64)}});
  const Checkpoint c = Checkpoint::open(dir.path());
  EXPECT_EQ(c.tensor_names().size(), 12u);
  // Expert 1's up_proj blocks: rows 32..63 of gate_up [1], i.e. bytes from (64 + 32) * 32.
  const Tensor up = c.tensor(kX + "1.up_proj.weight_blocks");
  ASSERT_EQ(up.shape(), Shape({32, 2, 16}));
  for (int k = 0; k < 32 * 32; ++k)
    ASSERT_EQ(up.data<uint8_t>()[k], ((64 + 32) * 32 + k) % 251) << k;
  const Tensor s = c.tensor(kX + "1.down_proj.weight_scales");
  ASSERT_EQ(s.shape(), Shape({64, 1}));
  for (int k = 0; k < 64; ++k)
    ASSERT_EQ(s.data<uint8_t>()[k], (64 + k) % 251) << k;
  EXPECT_EQ(c.entry(kX + "0.gate_proj.weight_scales").shape, Shape({32, 2}));
}

// gpt-oss: gate_up_proj [E, H, 2I] and down_proj [E, I, H] stored transposed (x · W + b), biases
// [E, 2I] and [E, H]; served as experts.e.gate_up_proj.{weight [2I, H], bias} and
// experts.e.down_proj.{weight [H, I], bias}. Element (e, c, r) of the stored weights is
// value(e, leaf, r, c): the view's [r, c].
TEST(FusedExperts, GptOssTransposedWeightsAndBiases) {
  std::vector<float> gate_up, down, gbias, dbias;
  for (int e = 0; e < kE; ++e) {
    for (int c = 0; c < kH; ++c)
      for (int r = 0; r < 2 * kI; ++r)
        gate_up.push_back(value(e, 4, r, c));
    for (int c = 0; c < kI; ++c)
      for (int r = 0; r < kH; ++r)
        down.push_back(value(e, 3, r, c));
    for (int j = 0; j < 2 * kI; ++j)
      gbias.push_back(value(e, 5, 0, j));
    for (int j = 0; j < kH; ++j)
      dbias.push_back(value(e, 6, 0, j));
  }
  TempDir dir;
  write_checkpoint(dir, {{kX + "gate_up_proj", "F32", {kE, kH, 2 * kI}, f32_bytes(gate_up)},
                         {kX + "gate_up_proj_bias", "F32", {kE, 2 * kI}, f32_bytes(gbias)},
                         {kX + "down_proj", "F32", {kE, kI, kH}, f32_bytes(down)},
                         {kX + "down_proj_bias", "F32", {kE, kH}, f32_bytes(dbias)}});
  const Checkpoint c = Checkpoint::open(dir.path());
  EXPECT_EQ(c.tensor_names().size(), 4u * kE);
  EXPECT_FALSE(c.has(kX + "gate_up_proj_bias"));
  for (int e = 0; e < kE; ++e) {
    const std::string p = kX + std::to_string(e) + ".";
    EXPECT_TRUE(c.transposed_view(p + "gate_up_proj.weight"));
    EXPECT_FALSE(c.transposed_view(p + "gate_up_proj.bias"));
    const Tensor gu = c.tensor(p + "gate_up_proj.weight");
    ASSERT_EQ(gu.shape(), Shape({2 * kI, kH}));
    for (int r = 0; r < 2 * kI; ++r)
      for (int col = 0; col < kH; ++col)
        EXPECT_EQ(gu.data<float>()[r * kH + col], value(e, 4, r, col)) << e << " " << r;
    const Tensor dn = c.tensor(p + "down_proj.weight");
    ASSERT_EQ(dn.shape(), Shape({kH, kI}));
    for (int r = 0; r < kH; ++r)
      for (int col = 0; col < kI; ++col)
        EXPECT_EQ(dn.data<float>()[r * kI + col], value(e, 3, r, col)) << e << " " << r;
    const Tensor gb = c.tensor(p + "gate_up_proj.bias"), db = c.tensor(p + "down_proj.bias");
    ASSERT_EQ(gb.shape(), Shape({2 * kI}));
    ASSERT_EQ(db.shape(), Shape({kH}));
    EXPECT_EQ(gb.data<float>()[3], value(e, 5, 0, 3));
    EXPECT_EQ(db.data<float>()[1], value(e, 6, 0, 1));
    // The stored range is the expert's [H, 2I] slice, as a byte-range reader sees it.
    EXPECT_EQ(c.entry(p + "gate_up_proj.weight").end - c.entry(p + "gate_up_proj.weight").begin,
              static_cast<uint64_t>(2 * kI * kH * 4));
  }
}

// gpt-oss's MXFP4 form: blocks and scales are [E, out, ...] with rows = outputs, so each
// expert's are a byte range (no transposition); the biases as in bf16.
TEST(FusedExperts, GptOssMxfp4) {
  auto bytes = [](size_t n) {
    std::string s(n, '\0');
    for (size_t k = 0; k < n; ++k)
      s[k] = static_cast<char>(k % 251);
    return s;
  };
  // E = 2, I = 32, H = 64.
  TempDir dir;
  write_checkpoint(dir, {{kX + "gate_up_proj_blocks", "U8", {2, 64, 2, 16}, bytes(2 * 64 * 32)},
                         {kX + "gate_up_proj_scales", "U8", {2, 64, 2}, bytes(2 * 64 * 2)},
                         {kX + "gate_up_proj_bias", "F32", {2, 64}, bytes(2 * 64 * 4)},
                         {kX + "down_proj_blocks", "U8", {2, 64, 1, 16}, bytes(2 * 64 * 16)},
                         {kX + "down_proj_scales", "U8", {2, 64, 1}, bytes(2 * 64)},
                         {kX + "down_proj_bias", "F32", {2, 64}, bytes(2 * 64 * 4)}});
  const Checkpoint c = Checkpoint::open(dir.path());
  EXPECT_EQ(c.tensor_names().size(), 12u);
  const Tensor gu = c.tensor(kX + "1.gate_up_proj.weight_blocks");
  ASSERT_EQ(gu.shape(), Shape({64, 2, 16}));
  for (int k = 0; k < 64 * 32; ++k)
    ASSERT_EQ(gu.data<uint8_t>()[k], (64 * 32 + k) % 251) << k;
  EXPECT_EQ(c.entry(kX + "0.gate_up_proj.weight_scales").shape, Shape({64, 2}));
  EXPECT_EQ(c.entry(kX + "1.down_proj.weight_blocks").shape, Shape({64, 1, 16}));
  EXPECT_EQ(c.entry(kX + "1.down_proj.bias").shape, Shape({64}));
  EXPECT_FALSE(c.transposed_view(kX + "1.gate_up_proj.weight_blocks"));
}

}  // namespace
}  // namespace strata
