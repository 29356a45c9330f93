// Writing safetensors, never half-written: every file goes to a temporary name in the same
// directory and is renamed into place only once complete and flushed.
//
// Layout written: tensors in the order given, data 8-byte aligned relative to the data section,
// header keys in that same order with "__metadata__" first, header padded with spaces to a
// multiple of 8. The same inputs give the same bytes.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace strata {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Writes one safetensors file atomically (temp name, fsync, rename).
void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata = {});

struct ShardedWriterOptions {
  uint64_t max_shard_bytes = 5ull << 30;  // a shard closes before it would exceed this
  std::string prefix = "model";           // shards are <prefix>-0000k-of-0000n.safetensors
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
};

// Streams tensors into shards. A shard is written (under a temporary name) as soon as it is
// full; finish() gives the shards their final names and writes <prefix>.safetensors.index.json.
class ShardedWriter {
 public:
  ShardedWriter(std::string out_dir, ShardedWriterOptions options = {});
  ~ShardedWriter();  // removes temporary files if finish() was not reached
  ShardedWriter(const ShardedWriter&) = delete;
  ShardedWriter& operator=(const ShardedWriter&) = delete;

  void add(std::string name, Tensor tensor);
  // Returns the final shard file names, in order.
  std::vector<std::string> finish();

 private:
  void flush_shard();
  std::string out_dir_;
  ShardedWriterOptions options_;
  NamedTensors pending_;
  uint64_t pending_bytes_ = 0;
  std::vector<std::string> temp_shards_;
  std::vector<std::vector<std::string>> shard_names_;  // tensor names per written shard
  std::set<std::string> names_;                        // every name added, to refuse repeats
  uint64_t total_bytes_ = 0;
  bool finished_ = false;
};

// Writes `contents` to `path` atomically (temp name in the same directory, fsync, rename).
// A full disk or any write error is a strata::Error naming the file; the temp file is removed.
void write_file_atomic(const std::string& path, std::string_view contents);

}  // namespace strata
