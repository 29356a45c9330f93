// CRC-32C against published check values: the CRC catalogue's check value (the CRC of the nine
// ASCII bytes "123456789") and the iSCSI test vectors of RFC 3720, appendix B.4.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "core/crc32c.h"

namespace strata {
namespace {

struct Vector {
  std::vector<uint8_t> bytes;
  uint32_t crc;
};

std::vector<Vector> published() {
  std::vector<Vector> v;
  const char* check = "123456789";
  v.push_back({std::vector<uint8_t>(check, check + 9), 0xE3069283u});
  v.push_back({std::vector<uint8_t>(32, 0x00), 0x8A9136AAu});
  v.push_back({std::vector<uint8_t>(32, 0xFF), 0x62A8AB43u});
  std::vector<uint8_t> up(32), down(32);
  std::iota(up.begin(), up.end(), uint8_t{0});
  for (int i = 0; i < 32; ++i)
    down[static_cast<size_t>(i)] = static_cast<uint8_t>(31 - i);
  v.push_back({up, 0x46DD794Eu});
  v.push_back({down, 0x113FDB5Cu});
  v.push_back({{}, 0u});
  return v;
}

TEST(Crc32c, PublishedVectors) {
  for (const Vector& v : published()) {
    EXPECT_EQ(crc32c(v.bytes.data(), v.bytes.size()), v.crc);
    EXPECT_EQ(crc32c_portable(v.bytes.data(), v.bytes.size()), v.crc);
  }
}

// Any split of the input gives the CRC of the whole; the instruction and the table agree on
// every length and alignment.
TEST(Crc32c, SplitsAndAlignments) {
  std::mt19937 rng(7);
  std::vector<uint8_t> buf(1000);
  for (uint8_t& b : buf)
    b = static_cast<uint8_t>(rng());
  for (size_t off = 0; off < 9; ++off) {
    for (size_t n : {0, 1, 7, 8, 9, 63, 64, 65, 500, 991}) {
      const uint32_t whole = crc32c_portable(buf.data() + off, n);
      EXPECT_EQ(crc32c(buf.data() + off, n), whole) << off << " " << n;
      for (size_t cut : {size_t{0}, n / 3, n}) {
        const uint32_t a = crc32c(buf.data() + off, cut);
        EXPECT_EQ(crc32c(buf.data() + off + cut, n - cut, a), whole) << off << " " << n;
        EXPECT_EQ(crc32c_portable(buf.data() + off + cut, n - cut, a), whole);
      }
    }
  }
}

// A CRC detects every single-bit error.
TEST(Crc32c, EveryBitFlipDetected) {
  std::vector<uint8_t> buf(256);
  std::iota(buf.begin(), buf.end(), uint8_t{0});
  const uint32_t good = crc32c(buf.data(), buf.size());
  for (size_t i = 0; i < buf.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      buf[i] ^= static_cast<uint8_t>(1u << bit);
      EXPECT_NE(crc32c(buf.data(), buf.size()), good);
      buf[i] ^= static_cast<uint8_t>(1u << bit);
    }
  }
}

}  // namespace
}  // namespace strata
