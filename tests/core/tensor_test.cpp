#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace strata {
namespace {

TEST(Tensor, ZerosAndShape) {
  Tensor t = Tensor::zeros(DType::kBF16, {3, 4});
  EXPECT_EQ(t.numel(), 12);
  EXPECT_EQ(t.nbytes(), 24u);
  EXPECT_EQ(t.dim(-1), 4);
  EXPECT_EQ(shape_str(t.shape()), "[3, 4]");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.bytes()) % 64, 0u);
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t.item_f32(i), 0.0f);
  Tensor s = Tensor::scalar_f32(2.5f);
  EXPECT_EQ(s.ndim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.item_f32(), 2.5f);
}

TEST(Tensor, ViewIsZeroCopyAndReadOnly) {
  auto buffer = std::make_shared<std::vector<uint16_t>>(std::vector<uint16_t>{0x3F80, 0x4000, 0xC040, 0});
  Tensor v = Tensor::view(DType::kBF16, {2, 2}, buffer->data(), 8, buffer);
  EXPECT_EQ(v.bytes(), reinterpret_cast<const uint8_t*>(buffer->data()));
  EXPECT_TRUE(v.read_only());
  EXPECT_THROW(v.mutable_bytes(), InternalError);
  Tensor f = v.to_f32();
  EXPECT_EQ(f.item_f32(0), 1.0f);
  EXPECT_EQ(f.item_f32(1), 2.0f);
  EXPECT_EQ(f.item_f32(2), -3.0f);
  Tensor r = v.reshape({4});
  EXPECT_EQ(r.bytes(), v.bytes());
  Tensor c = v.clone();
  EXPECT_FALSE(c.read_only());
  EXPECT_NE(c.bytes(), v.bytes());
  buffer.reset();  // the view keeps the storage alive
  EXPECT_EQ(v.item_f32(2), -3.0f);
}

TEST(Tensor, BadShapes) {
  EXPECT_THROW(Tensor::zeros(DType::kF32, {-1}), Error);
  EXPECT_THROW(shape_numel({1ll << 40, 1ll << 40}), Error);
  EXPECT_THROW(Tensor::zeros(DType::kE2M1, {3}), Error);
}

}  // namespace
}  // namespace strata
