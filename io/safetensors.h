// safetensors reading, with strict validation of untrusted headers.
//
// File layout: 8 bytes little-endian u64 N, then N bytes of UTF-8 JSON (the header; writers pad
// it with spaces), then the data section. The header maps each tensor name to
// {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]} (offsets relative to the start
// of the data section) and may hold "__metadata__": {string: string}.
//
// Validation (each failure is a one-line strata::Error naming the file and, where there is one,
// the tensor): N within bounds and inside the file; valid JSON with no duplicate keys; every
// entry an object with exactly those three keys; a known dtype; non-negative integer dims;
// begin <= end, both inside the data section; shape x dtype size == end - begin; no two tensors'
// byte ranges overlap; __metadata__ an object of strings.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "io/mapped_file.h"

namespace strata {

// Largest header accepted (the reference implementation uses the same 100 MB bound).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct TensorEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0;  // byte offsets relative to the data section
  uint64_t end = 0;
};

struct SafetensorsHeader {
  uint64_t data_offset = 0;          // 8 + N: where the data section starts in the file
  uint64_t data_size = 0;            // the data section's length: file size - data_offset
  std::vector<TensorEntry> entries;  // sorted by begin offset (then end, then name)
  std::vector<uint32_t> by_name;     // indices into entries, sorted by name
  std::map<std::string, std::string> metadata;
};

// How parse_safetensors_header reads the JSON. kAny: a direct reader of the plain form writers
// produce (strings without escapes, unsigned integers, each entry's three keys) reads the header
// without building a JSON tree; a header outside that form, or with any problem, is read again by
// the strict JSON parser (io/json.h), which accepts the rest and names every problem. kTree: the
// JSON parser alone, the reference the direct reader is tested against (tests, fuzz target).
// Both give the same header, or the same error.
enum class HeaderPath : uint8_t { kAny, kTree };

// Parses and validates the header of a complete safetensors file held in memory (`size` bytes
// at `data`). `what` names the file in errors. Exposed on its own for the fuzzer and tests.
SafetensorsHeader parse_safetensors_header(const uint8_t* data, size_t size,
                                           const std::string& what,
                                           HeaderPath path = HeaderPath::kAny);

class SafetensorsFile {
 public:
  // Maps and validates the file. Throws strata::Error on any problem.
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const { return file_->path(); }
  uint64_t file_size() const { return file_->size(); }
  const SafetensorsHeader& header() const { return header_; }
  const std::vector<TensorEntry>& entries() const { return header_.entries; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }

  const TensorEntry* find(std::string_view name) const;  // nullptr when absent
  // A zero-copy, read-only view of the tensor's bytes.
  Tensor tensor(const TensorEntry& entry) const;
  Tensor tensor(std::string_view name) const;  // throws strata::Error when absent
  const std::shared_ptr<const MappedFile>& mapping() const { return file_; }

 private:
  std::shared_ptr<const MappedFile> file_;
  SafetensorsHeader header_;
};

}  // namespace strata
