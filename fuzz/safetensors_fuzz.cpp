// Fuzzes the safetensors header parser with whole files held in memory. Accepted files must
// satisfy what the parser promises (sorted, disjoint, in-bounds entries whose byte counts match
// their shapes, an index by name); anything else must be a strata::Error. The direct reader and the
// JSON tree (HeaderPath) must agree: the same header, or an error from both with the same message.
// A crash, a sanitizer report, an uncaught exception (InternalError included) or a broken promise
// (__builtin_trap) is a finding.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/error.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  strata::SafetensorsHeader h, tree;
  std::string error, tree_error;
  try {
    h = strata::parse_safetensors_header(data, size, "fuzz.safetensors");
  } catch (const strata::Error& e) {
    error = e.what();
  }
  try {
    tree =
        strata::parse_safetensors_header(data, size, "fuzz.safetensors", strata::HeaderPath::kTree);
  } catch (const strata::Error& e) {
    tree_error = e.what();
  }
  if (error != tree_error) __builtin_trap();
  if (!error.empty()) return 0;
  if (h.data_offset != tree.data_offset || h.data_size != tree.data_size ||
      h.metadata != tree.metadata || h.by_name != tree.by_name ||
      h.entries.size() != tree.entries.size())
    __builtin_trap();
  for (size_t i = 0; i < h.entries.size(); ++i) {
    const strata::TensorEntry &a = h.entries[i], &b = tree.entries[i];
    if (a.name != b.name || a.dtype != b.dtype || a.shape != b.shape || a.begin != b.begin ||
        a.end != b.end)
      __builtin_trap();
  }
  if (h.by_name.size() != h.entries.size()) __builtin_trap();
  for (size_t i = 1; i < h.by_name.size(); ++i) {
    if (!(h.entries[h.by_name[i - 1]].name < h.entries[h.by_name[i]].name)) __builtin_trap();
  }
  if (h.data_offset < 8 || h.data_offset > size) __builtin_trap();
  const uint64_t data_size = size - h.data_offset;
  uint64_t prev_end = 0;
  // A stand-in owner: the bytes belong to libFuzzer and outlive this call.
  auto owner = std::make_shared<int>(0);
  for (const strata::TensorEntry& e : h.entries) {
    if (e.begin > e.end || e.end > data_size) __builtin_trap();
    if (e.begin != e.end) {
      if (e.begin < prev_end) __builtin_trap();
      prev_end = e.end;
    }
    // Builds the same view SafetensorsFile::tensor() returns; it asserts the byte count.
    strata::Tensor t = strata::Tensor::view(e.dtype, e.shape, data + h.data_offset + e.begin,
                                            e.end - e.begin, owner);
    if (t.nbytes() != e.end - e.begin) __builtin_trap();
    if (t.nbytes() > 0) {
      volatile uint8_t last = t.bytes()[t.nbytes() - 1];  // in bounds, or ASan says so
      (void)last;
    }
  }
  return 0;
}
