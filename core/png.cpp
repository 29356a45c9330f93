#include "core/png.h"

#include <algorithm>
#include <array>

#include "core/error.h"

namespace strata {
namespace {

// table[b]: the CRC-32 register after byte b (reflected polynomial 0xEDB88320).
const std::array<uint32_t, 256>& crc32_table() {
  static const std::array<uint32_t, 256> t = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = b;
      for (int i = 0; i < 8; ++i)
        c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
      t[b] = c;
    }
    return t;
  }();
  return t;
}

void put_u32_be(std::string& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8)
    out.push_back(static_cast<char>((v >> s) & 0xffu));
}

// Deflate's bit order: values LSB first; Huffman codes MSB first (RFC 1951, 3.1.1).
class BitWriter {
 public:
  explicit BitWriter(std::string& out) : out_(out) {}
  void bits(uint32_t value, int n) {
    for (int i = 0; i < n; ++i) {
      acc_ |= ((value >> i) & 1u) << fill_;
      if (++fill_ == 8) flush_byte();
    }
  }
  void code(uint32_t code, int len) {
    for (int i = len - 1; i >= 0; --i)
      bits((code >> i) & 1u, 1);
  }
  void finish() {
    if (fill_ > 0) flush_byte();
  }

 private:
  void flush_byte() {
    out_.push_back(static_cast<char>(acc_));
    acc_ = 0;
    fill_ = 0;
  }
  std::string& out_;
  uint32_t acc_ = 0;
  int fill_ = 0;
};

// The fixed literal/length code (RFC 1951, 3.2.6).
void put_literal_length(BitWriter& w, int sym) {
  if (sym < 144) {
    w.code(0x30u + static_cast<uint32_t>(sym), 8);
  } else if (sym < 256) {
    w.code(0x190u + static_cast<uint32_t>(sym - 144), 9);
  } else if (sym < 280) {
    w.code(static_cast<uint32_t>(sym - 256), 7);
  } else {
    w.code(0xC0u + static_cast<uint32_t>(sym - 280), 8);
  }
}

constexpr std::array<int, 29> kLengthBase = {3,  4,  5,  6,   7,   8,   9,   10,  11, 13,
                                             15, 17, 19, 23,  27,  31,  35,  43,  51, 59,
                                             67, 83, 99, 115, 131, 163, 195, 227, 258};
constexpr std::array<int, 29> kLengthExtra = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                              2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
constexpr std::array<int, 30> kDistBase = {
    1,   2,   3,   4,   5,   7,    9,    13,   17,   25,   33,   49,   65,    97,    129,
    193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
constexpr std::array<int, 30> kDistExtra = {0, 0, 0, 0, 1, 1, 2, 2,  3,  3,  4,  4,  5,  5,  6,
                                            6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};

void put_match(BitWriter& w, int length, int distance) {
  int k = 28;
  while (kLengthBase[static_cast<size_t>(k)] > length)
    --k;
  put_literal_length(w, 257 + k);
  w.bits(static_cast<uint32_t>(length - kLengthBase[static_cast<size_t>(k)]),
         kLengthExtra[static_cast<size_t>(k)]);
  int d = 29;
  while (kDistBase[static_cast<size_t>(d)] > distance)
    --d;
  w.code(static_cast<uint32_t>(d), 5);  // fixed distance codes: 5 bits each
  w.bits(static_cast<uint32_t>(distance - kDistBase[static_cast<size_t>(d)]),
         kDistExtra[static_cast<size_t>(d)]);
}

void deflate_stored(const uint8_t* data, size_t n, std::string& out) {
  size_t at = 0;
  do {
    const size_t len = std::min<size_t>(65535, n - at);
    const bool last = at + len == n;
    out.push_back(last ? 1 : 0);  // BFINAL, BTYPE 00, the rest of the byte padding
    out.push_back(static_cast<char>(len & 0xffu));
    out.push_back(static_cast<char>(len >> 8));
    out.push_back(static_cast<char>(~len & 0xffu));
    out.push_back(static_cast<char>((~len >> 8) & 0xffu));
    out.append(reinterpret_cast<const char*>(data + at), len);
    at += len;
  } while (at < n);
}

// One fixed-Huffman block; greedy matching, the longest of at most kChain earlier positions with
// the same 3-byte hash within the window.
void deflate_fixed(const uint8_t* data, size_t n, std::string& out) {
  constexpr int kHashBits = 15, kChain = 32, kMaxLen = 258, kMinLen = 3;
  constexpr size_t kWindow = 32768;
  std::vector<int64_t> head(size_t{1} << kHashBits, -1), prev(n, -1);
  auto hash = [&](size_t i) {
    const uint32_t v = (uint32_t{data[i]} << 16) | (uint32_t{data[i + 1]} << 8) | data[i + 2];
    return (v * 2654435761u) >> (32 - kHashBits);
  };
  auto insert = [&](size_t i) {
    if (i + kMinLen > n) return;
    const uint32_t h = hash(i);
    prev[i] = head[h];
    head[h] = static_cast<int64_t>(i);
  };
  BitWriter w(out);
  w.bits(1, 1);  // BFINAL
  w.bits(1, 2);  // BTYPE 01: fixed Huffman codes
  size_t i = 0;
  while (i < n) {
    int best_len = 0;
    size_t best_dist = 0;
    if (i + kMinLen <= n) {
      const size_t max_len = std::min<size_t>(kMaxLen, n - i);
      int64_t cand = head[hash(i)];
      for (int tries = 0; cand >= 0 && tries < kChain; ++tries) {
        const size_t c = static_cast<size_t>(cand);
        if (i - c > kWindow) break;
        size_t len = 0;
        while (len < max_len && data[c + len] == data[i + len])
          ++len;
        if (static_cast<int>(len) > best_len) {
          best_len = static_cast<int>(len);
          best_dist = i - c;
          if (len == max_len) break;
        }
        cand = prev[c];
      }
    }
    if (best_len >= kMinLen) {
      put_match(w, best_len, static_cast<int>(best_dist));
      for (int k = 0; k < best_len; ++k)
        insert(i + static_cast<size_t>(k));
      i += static_cast<size_t>(best_len);
    } else {
      put_literal_length(w, data[i]);
      insert(i);
      ++i;
    }
  }
  put_literal_length(w, 256);  // end of block
  w.finish();
}

void put_chunk(std::string& out, const char* type, const std::string& data) {
  put_u32_be(out, static_cast<uint32_t>(data.size()));
  const size_t at = out.size();
  out.append(type, 4);
  out += data;
  put_u32_be(out, crc32(out.data() + at, out.size() - at));
}

}  // namespace

uint32_t crc32(const void* data, size_t n, uint32_t crc) {
  const auto& t = crc32_table();
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  for (size_t i = 0; i < n; ++i)
    c = (c >> 8) ^ t[(c ^ p[i]) & 0xffu];
  return ~c;
}

uint32_t adler32(const void* data, size_t n, uint32_t adler) {
  constexpr uint32_t kMod = 65521;
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t a = adler & 0xffffu, b = adler >> 16;
  while (n > 0) {
    // 5552 bytes keep b below 2^32 before the reduction (zlib's NMAX).
    const size_t run = std::min<size_t>(n, 5552);
    for (size_t i = 0; i < run; ++i) {
      a += p[i];
      b += a;
    }
    a %= kMod;
    b %= kMod;
    p += run;
    n -= run;
  }
  return (b << 16) | a;
}

std::string zlib_compress(const uint8_t* data, size_t n, Deflate mode) {
  std::string out;
  out.push_back(0x78);  // CM 8 (deflate), CINFO 7 (32 KiB window)
  out.push_back(0x01);  // FLEVEL 0, no dictionary; 0x7801 is a multiple of 31
  switch (mode) {
    case Deflate::kStored:
      deflate_stored(data, n, out);
      break;
    case Deflate::kFixed:
      deflate_fixed(data, n, out);
      break;
  }
  put_u32_be(out, adler32(data, n));
  return out;
}

std::string png_encode(const std::vector<uint8_t>& rgb, int64_t width, int64_t height,
                       Deflate mode) {
  constexpr int64_t kMaxSide = int64_t{1} << 24;
  STRATA_CHECK(width >= 1 && width <= kMaxSide && height >= 1 && height <= kMaxSide,
               "png: image of ", width, " x ", height, " pixels; each side must be 1..", kMaxSide);
  const size_t row = static_cast<size_t>(width) * 3;
  STRATA_CHECK(rgb.size() == row * static_cast<size_t>(height), "png: ", rgb.size(),
               " bytes of pixels for a ", width, " x ", height, " RGB image");
  std::vector<uint8_t> raw;  // filter byte 0, then the row
  raw.reserve((row + 1) * static_cast<size_t>(height));
  for (int64_t y = 0; y < height; ++y) {
    raw.push_back(0);
    raw.insert(raw.end(), rgb.begin() + static_cast<std::ptrdiff_t>(row * y),
               rgb.begin() + static_cast<std::ptrdiff_t>(row * (y + 1)));
  }
  std::string out("\x89PNG\r\n\x1a\n", 8);
  std::string ihdr;
  put_u32_be(ihdr, static_cast<uint32_t>(width));
  put_u32_be(ihdr, static_cast<uint32_t>(height));
  ihdr += std::string("\x08\x02\x00\x00\x00", 5);  // depth 8, RGB, deflate, filter 0, no interlace
  put_chunk(out, "IHDR", ihdr);
  put_chunk(out, "IDAT", zlib_compress(raw.data(), raw.size(), mode));
  put_chunk(out, "IEND", "");
  return out;
}

}  // namespace strata
