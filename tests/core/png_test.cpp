// core/png.h against independent references: CRC-32 and Adler-32 against their published check
// values (the CRC catalogue's CRC-32/ISO-HDLC check of "123456789"; Adler-32 of "Wikipedia" from
// its definition's worked example) and their definitions computed naively; every PNG decoded by
// tests/core/png_decode.py (Python's struct and zlib: chunk CRCs, inflate, Adler-32, filters)
// back to exactly the pixels written, with stored and with fixed-Huffman deflate blocks.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/plot.h"
#include "core/png.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

TEST(Crc32, PublishedCheckValue) {
  EXPECT_EQ(crc32("123456789", 9), 0xCBF43926u);
  EXPECT_EQ(crc32("", 0), 0u);
  // "IEND" with no data: the CRC every PNG ends with.
  EXPECT_EQ(crc32("IEND", 4), 0xAE426082u);
  // Continuing a CRC: crc32(b, crc32(a)) is the CRC of a followed by b.
  EXPECT_EQ(crc32("56789", 5, crc32("1234", 4)), 0xCBF43926u);
}

uint32_t adler32_naive(const std::vector<uint8_t>& v) {
  uint64_t a = 1, b = 0;
  for (uint8_t x : v) {
    a = (a + x) % 65521;
    b = (b + a) % 65521;
  }
  return static_cast<uint32_t>((b << 16) | a);
}

TEST(Adler32, PublishedCheckValueAndDefinition) {
  EXPECT_EQ(adler32("Wikipedia", 9), 0x11E60398u);
  EXPECT_EQ(adler32("", 0), 1u);
  EXPECT_EQ(adler32("pedia", 5, adler32("Wiki", 4)), 0x11E60398u);
  // Long runs of 0xFF: the sums must be reduced before they overflow (zlib's NMAX).
  for (size_t n : {size_t{5551}, size_t{5552}, size_t{5553}, size_t{100000}}) {
    std::vector<uint8_t> v(n, 0xFF);
    EXPECT_EQ(adler32(v.data(), v.size()), adler32_naive(v)) << n;
  }
}

TEST(Zlib, StoredBlocksLayout) {
  // 70000 bytes: a block of 65535 and one of 4465, each with a 5-byte header.
  std::vector<uint8_t> v(70000, 7);
  const std::string z = zlib_compress(v.data(), v.size(), Deflate::kStored);
  ASSERT_EQ(z.size(), 2 + 5 + 65535 + 5 + 4465 + 4u);
  EXPECT_EQ(static_cast<uint8_t>(z[0]), 0x78);
  EXPECT_EQ((0x78 * 256 + static_cast<uint8_t>(z[1])) % 31, 0);  // the header check bits
  EXPECT_EQ(static_cast<uint8_t>(z[2]), 0);                      // not final, stored
  EXPECT_EQ(static_cast<uint8_t>(z[3]), 0xFF);                   // LEN 65535
  EXPECT_EQ(static_cast<uint8_t>(z[2 + 5 + 65535]), 1);          // final, stored
}

// The decoder's verdict on `png` holding exactly `rgb`.
struct Decoded {
  int rc = -1;
  std::string out;
};
Decoded decode_with_python(const std::string& png, const std::vector<uint8_t>& rgb,
                           const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("strata_png_test_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const fs::path p = dir / (name + ".png"), raw = dir / (name + ".rgb"), log = dir / "log";
  std::ofstream(p, std::ios::binary) << png;
  std::ofstream(raw, std::ios::binary)
      .write(reinterpret_cast<const char*>(rgb.data()), static_cast<std::streamsize>(rgb.size()));
  const std::string cmd = "python3 '" + std::string(STRATA_SOURCE_DIR) +
                          "/tests/core/png_decode.py' '" + p.string() + "' --expect '" +
                          raw.string() + "' >'" + log.string() + "' 2>&1";
  const int status = std::system(cmd.c_str());
  Decoded d;
  d.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  d.out = ss.str();
  fs::remove_all(dir);
  return d;
}

void expect_round_trip(const std::vector<uint8_t>& rgb, int64_t w, int64_t h,
                       const std::string& name) {
  for (Deflate mode : {Deflate::kStored, Deflate::kFixed}) {
    const std::string png = png_encode(rgb, w, h, mode);
    const std::string what = name + (mode == Deflate::kStored ? ".stored" : ".fixed");
    const Decoded d = decode_with_python(png, rgb, what);
    EXPECT_EQ(d.rc, 0) << what << ": " << d.out;
  }
}

TEST(Png, DecodedByAnIndependentReader) {
  // 3 x 2: red green blue / white black grey.
  expect_round_trip({255, 0, 0, 0, 255, 0, 0, 0, 255, 255, 255, 255, 0, 0, 0, 128, 128, 128}, 3, 2,
                    "tiny");
  expect_round_trip({42, 43, 44}, 1, 1, "one_pixel");
  // Noise: literals of every value, few matches.
  std::mt19937 rng(1);
  std::vector<uint8_t> noise(97 * 61 * 3);
  for (uint8_t& b : noise)
    b = static_cast<uint8_t>(rng());
  expect_round_trip(noise, 97, 61, "noise");
  // Noise of few values: short matches at every distance.
  for (uint8_t& b : noise)
    b = static_cast<uint8_t>(rng() % 3 * 100);
  expect_round_trip(noise, 97, 61, "few_values");
  // Over 65535 bytes (several stored blocks), long runs (258-byte matches) and matches at the
  // window's far end.
  std::vector<uint8_t> big(300 * 250 * 3, 255);
  for (size_t i = 0; i < big.size(); i += 7919)
    big[i] = static_cast<uint8_t>(i);
  expect_round_trip(big, 300, 250, "big");
}

TEST(Png, PlotCompressesAndDecodes) {
  Canvas c(640, 360);
  c.fill_rect(100, 50, 300, 200, kBlue);
  c.line(0, 359, 639, 0, kRed, 2);
  c.text(10, 10, "0.125 -1e+05 99%", kBlack, 2);
  const std::string fixed = png_encode(c.pixels(), 640, 360, Deflate::kFixed);
  EXPECT_LT(fixed.size(), c.pixels().size() / 50) << "flat colours should compress well";
  const Decoded d = decode_with_python(fixed, c.pixels(), "plot");
  EXPECT_EQ(d.rc, 0) << d.out;
  EXPECT_EQ(c.png(), fixed);
}

TEST(Png, BadSizesAreErrors) {
  EXPECT_THROW(png_encode({1, 2, 3}, 2, 1), Error);
  EXPECT_THROW(png_encode({}, 0, 0), Error);
}

}  // namespace
}  // namespace strata
