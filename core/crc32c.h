// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, initial value and final XOR 0xFFFFFFFF):
// the checksum of the resume files (engine/resume.h). With SSE4.2 (x86-64) the CPU's crc32
// instruction computes it at several GB/s; elsewhere a slicing-by-8 table does.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata {

// The CRC-32C of `n` bytes at `data`, continuing `crc` (the CRC-32C of the bytes before them;
// 0 to start): crc32c(b, crc32c(a)) is the CRC-32C of a followed by b.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

// The same without the CPU instruction (the table), for tests and CPUs without it.
uint32_t crc32c_portable(const void* data, size_t n, uint32_t crc = 0);

}  // namespace strata
