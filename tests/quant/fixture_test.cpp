// Bit-for-bit agreement with the independent numpy implementation in make_quant_vectors.py
// (fixture format documented there; regenerate with the command at its top).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "quant/fp8.h"
#include "quant/mxfp8.h"
#include "quant/nvfp4.h"
#include "tests/quant/test_util.h"

namespace strata {
namespace {

using quant_test::bits;
using quant_test::bytes_of;

struct Blob {
  int type;  // 0 u8, 1 bf16, 2 f32, 3 f16
  Shape shape;
  std::vector<uint8_t> bytes;

  std::vector<float> floats() const {
    std::vector<float> v(bytes.size() / 4);
    std::memcpy(v.data(), bytes.data(), bytes.size());
    return v;
  }
  Tensor tensor() const {
    static constexpr DType kType[] = {DType::kU8, DType::kBF16, DType::kF32, DType::kF16};
    Tensor t = Tensor::zeros(kType[type], shape);
    EXPECT_EQ(t.nbytes(), bytes.size());
    std::memcpy(t.mutable_bytes(), bytes.data(), bytes.size());
    return t;
  }
};

std::map<std::string, Blob> read_fixture() {
  const std::string path =
      std::string(STRATA_SOURCE_DIR) + "/tests/quant/fixtures/quant_vectors.bin";
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::vector<uint8_t> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::map<std::string, Blob> out;
  EXPECT_GE(data.size(), 8u);
  EXPECT_EQ(std::string(data.begin(), data.begin() + 8), "STQVEC01");
  size_t pos = 8;
  auto take = [&](size_t n) {
    EXPECT_LE(pos + n, data.size());
    const uint8_t* p = data.data() + pos;
    pos += n;
    return p;
  };
  auto u16 = [&] {
    uint16_t v;
    std::memcpy(&v, take(2), 2);
    return v;
  };
  auto u32 = [&] {
    uint32_t v;
    std::memcpy(&v, take(4), 4);
    return v;
  };
  while (pos < data.size()) {
    const uint16_t n = u16();
    const uint8_t* name = take(n);
    Blob b;
    b.type = *take(1);
    const int ndim = *take(1);
    for (int i = 0; i < ndim; ++i)
      b.shape.push_back(u32());
    const uint32_t nbytes = u32();
    const uint8_t* p = take(nbytes);
    b.bytes.assign(p, p + nbytes);
    out[std::string(reinterpret_cast<const char*>(name), n)] = std::move(b);
  }
  return out;
}

// Case names "<format>/<case>" present in the fixture.
std::set<std::string> cases(const std::map<std::string, Blob>& f, const std::string& format) {
  std::set<std::string> out;
  for (const auto& [name, blob] : f) {
    if (name.rfind(format + "/", 0) == 0) out.insert(name.substr(0, name.rfind('/')));
  }
  return out;
}

class Fixture : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { fixture_ = new std::map<std::string, Blob>(read_fixture()); }
  static void TearDownTestSuite() { delete fixture_; }
  const Blob& at(const std::string& name) {
    auto it = fixture_->find(name);
    if (it == fixture_->end()) {
      ADD_FAILURE() << "fixture lacks " << name;
      static Blob empty;
      return empty;
    }
    return it->second;
  }
  static std::map<std::string, Blob>* fixture_;
};
std::map<std::string, Blob>* Fixture::fixture_ = nullptr;

TEST_F(Fixture, Nvfp4MatchesNumpy) {
  const auto names = cases(*fixture_, "nvfp4");
  EXPECT_GE(names.size(), 9u);
  for (const std::string& c : names) {
    SCOPED_TRACE(c);
    const float amax = at(c + "/amax").floats().at(0);
    for (auto encoders : {quant_detail::Encoders::kReference, quant_detail::Encoders::kFast}) {
      Nvfp4Weight q =
          quant_detail::nvfp4_quantize_with(encoders, at(c + "/input").tensor(), amax, c);
      EXPECT_EQ(bytes_of(q.packed), at(c + "/packed").bytes);
      EXPECT_EQ(q.packed.shape(), at(c + "/packed").shape);
      EXPECT_EQ(bytes_of(q.block_scale), at(c + "/block_scale").bytes);
      EXPECT_EQ(q.block_scale.shape(), at(c + "/block_scale").shape);
      EXPECT_EQ(bits(q.global_scale.item_f32()), bits(at(c + "/global_scale").floats().at(0)));
    }
  }
}

TEST_F(Fixture, Fp8MatchesNumpy) {
  const auto names = cases(*fixture_, "fp8");
  EXPECT_GE(names.size(), 9u);
  for (const std::string& c : names) {
    SCOPED_TRACE(c);
    const float amax = at(c + "/amax").floats().at(0);
    for (auto encoders : {quant_detail::Encoders::kReference, quant_detail::Encoders::kFast}) {
      Fp8Weight q = quant_detail::fp8_quantize_with(encoders, at(c + "/input").tensor(), amax, c);
      EXPECT_EQ(bytes_of(q.weight), at(c + "/weight").bytes);
      EXPECT_EQ(bits(q.scale.item_f32()), bits(at(c + "/scale").floats().at(0)));
    }
  }
}

TEST_F(Fixture, Mxfp8MatchesNumpy) {
  const auto names = cases(*fixture_, "mxfp8");
  EXPECT_GE(names.size(), 9u);
  for (const std::string& c : names) {
    SCOPED_TRACE(c);
    for (auto encoders : {quant_detail::Encoders::kReference, quant_detail::Encoders::kFast}) {
      Mxfp8Weight q = quant_detail::mxfp8_quantize_with(encoders, at(c + "/input").tensor(), c);
      EXPECT_EQ(bytes_of(q.weight), at(c + "/weight").bytes);
      EXPECT_EQ(bytes_of(q.scale), at(c + "/scale").bytes);
      EXPECT_EQ(q.scale.shape(), at(c + "/scale").shape);
    }
  }
}

TEST_F(Fixture, ScalarScalesMatchNumpy) {
  auto check = [&](const std::string& prefix, auto fn) {
    const auto amax = at(prefix + "/amax").floats();
    const auto scale = at(prefix + "/scale").floats();
    ASSERT_EQ(amax.size(), scale.size());
    EXPECT_GE(amax.size(), 40u);
    for (size_t i = 0; i < amax.size(); ++i) {
      EXPECT_EQ(bits(fn(amax[i])), bits(scale[i])) << prefix << " amax " << amax[i];
    }
  };
  check("nvfp4_input_scale/all", [](float a) { return nvfp4_input_scale(a, "x"); });
  check("fp8_input_scale/all", [](float a) { return fp8_input_scale(a); });
  check("fp8_kv_scale/all", [](float a) { return fp8_kv_cache_scale(a, "x"); });
}

}  // namespace
}  // namespace strata
