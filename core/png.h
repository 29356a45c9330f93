// PNG images of 8-bit RGB pixels (the plots of `strata compare --report`), written without a
// library: the PNG signature, IHDR, one IDAT and IEND (PNG spec, ISO/IEC 15948), each chunk
//   length (u32 big-endian) | type (4 ASCII bytes) | data | CRC-32 of type + data (big-endian)
// IHDR: width, height (u32 BE), bit depth 8, colour type 2 (RGB), compression 0, filter 0,
// interlace 0. The image data is, per row, filter byte 0 (none) followed by width x 3 bytes
// (R, G, B, left to right; rows top to bottom), as a zlib stream (RFC 1950):
//   0x78 0x01 | deflate blocks (RFC 1951) | Adler-32 of the uncompressed bytes (big-endian)
// The deflate blocks are either stored (uncompressed, at most 65535 bytes each) or one block of
// fixed Huffman codes with greedy LZ77 matches (hash chains over a 32 KiB window), which shrinks
// a plot's flat colours some hundred times.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace strata {

// CRC-32 as PNG and zlib use it (ISO-HDLC: reflected polynomial 0xEDB88320, initial value and
// final XOR 0xFFFFFFFF), continuing `crc` (the CRC-32 of the bytes before; 0 to start).
// crc32("123456789") = 0xCBF43926.
uint32_t crc32(const void* data, size_t n, uint32_t crc = 0);

// Adler-32 (RFC 1950), continuing `adler` (1 to start). adler32("Wikipedia") = 0x11E60398.
uint32_t adler32(const void* data, size_t n, uint32_t adler = 1);

enum class Deflate {
  kStored,  // uncompressed blocks
  kFixed,   // fixed Huffman codes with LZ77 matches
};

// A zlib stream (RFC 1950) of `n` bytes.
std::string zlib_compress(const uint8_t* data, size_t n, Deflate mode = Deflate::kFixed);

// The PNG file of `rgb` (height rows of width x 3 bytes, top row first). Throws strata::Error when
// rgb.size() != width * height * 3 or a side is not in 1..2^24.
std::string png_encode(const std::vector<uint8_t>& rgb, int64_t width, int64_t height,
                       Deflate mode = Deflate::kFixed);

}  // namespace strata
