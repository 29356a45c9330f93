// A Hugging Face checkpoint directory: config.json plus weights in one `model.safetensors` or
// in shards listed by `model.safetensors.index.json` ({"metadata": {...}, "weight_map":
// {tensor name: shard file name}}).
//
// Opening validates every shard header (safetensors.h) and cross-checks the index: a shard the
// index names that does not exist, a tensor listed but absent from its shard, a tensor present
// in two shards, or a shard file name that leaves the directory are one-line errors naming the
// file and tensor. Tensors present in a shard but missing from the index are errors too (vLLM
// would silently ignore them).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"

namespace strata {

// Parses an index file's text into tensor name -> shard file name. Validates the JSON shape
// (an object with an object "weight_map" of strings; shard names are plain file names).
std::map<std::string, std::string> parse_safetensors_index(std::string_view text,
                                                           const std::string& what);

class Checkpoint {
 public:
  Checkpoint();
  // `dir` holds model.safetensors.index.json or model.safetensors (or exactly one *.safetensors).
  static Checkpoint open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  // Every tensor name, sorted.
  std::vector<std::string> tensor_names() const;
  // The names starting with `prefix`, sorted (tensor_names() filtered, in O(log n + matches)).
  std::vector<std::string> tensor_names_with_prefix(std::string_view prefix) const;
  bool has(std::string_view name) const;
  const TensorEntry& entry(std::string_view name) const;         // throws when absent
  const SafetensorsFile& shard_of(std::string_view name) const;  // throws when absent
  Tensor tensor(std::string_view name) const;  // zero-copy view; throws when absent
  // tensor() for a few bytes every rank reads while planning, part of the checkpoint's
  // description like its headers (an INT4 source's weight_shape): never counted in bytes_read(),
  // not even when tensor() reads it again later.
  Tensor metadata(std::string_view name) const;
  const std::vector<SafetensorsFile>& shards() const { return shards_; }
  // Asks the kernel to start reading these tensors' pages into the page cache, all at once and
  // without waiting (madvise WILLNEED): many small tensors spread over the files (an INT4
  // source's weight_shape of every module) then arrive at the disk's queue depth instead of one
  // page fault at a time. Advice only; a held tensor is skipped.
  void will_need(const std::vector<std::string>& names) const;
  // Drops the tensor's pages from this process's resident set (they stay in the page cache and
  // fault back in if read again): what keeps RSS at one layer while the whole file is mapped.
  void release(std::string_view name) const;
  // Sum of the shard files' sizes.
  uint64_t bytes_on_disk() const;

  // Views (io/fused_experts.h). add_view makes `name` the `dtype` `shape` tensor whose bytes start
  // `offset` bytes into stored tensor `base` (a range inside it); hide removes a stored tensor
  // from the names served once its views replace it.
  // A `transposed` view (gpt-oss's bf16 experts) is the 2-D `shape` [rows, cols] tensor whose
  // range stores its transpose [cols, rows]: tensor() returns a transposed copy; its entry's
  // begin/end are the stored range (the same byte count), so code that moves raw ranges moves
  // the stored layout and must not read it as `shape` (transposed_view() tells; the GPU's layer
  // blobs refuse it).
  void add_view(const std::string& name, const std::string& base, uint64_t offset, DType dtype,
                const Shape& shape, bool transposed = false);
  void hide(const std::string& base);
  // The fused tensor a view was cut from; empty for a stored tensor.
  std::string view_base(std::string_view name) const;
  bool transposed_view(std::string_view name) const;

  // Ranks (engine/parallel.h): a tensor one rank read and sent to the others is held in memory
  // here, and tensor() serves the held bytes instead of the file's; release() drops it. `bytes`
  // must hold the tensor's bytes exactly (entry(name).end - begin).
  void hold(const std::string& name, std::shared_ptr<const std::vector<uint8_t>> bytes) const;
  bool held(std::string_view name) const;
  // Bytes of the distinct tensors this process has taken from the files (not from held copies):
  // what it read of the checkpoint.
  uint64_t bytes_read() const;

 private:
  std::string dir_;
  std::vector<SafetensorsFile> shards_;
  // Opening with an index: the index and the shards must agree in both directions.
  void check_index(const std::map<std::string, std::string>& index,
                   const std::vector<std::string>& shard_files) const;

  struct Where {
    size_t shard = 0;
    size_t entry = 0;  // in the shard's entries, or in views_ for a view
    bool view = false;
    bool transposed = false;
  };
  std::map<std::string, Where, std::less<>> where_;
  std::vector<TensorEntry> views_;                         // begin/end in the shard's data
  std::map<std::string, std::string, std::less<>> bases_;  // view name -> fused tensor name
  struct Held;                  // held copies and the names read, shared by copies of this
  std::shared_ptr<Held> held_;  // object and guarded by a mutex (the prefetch thread reads)
};

// The routed expert a decoder-layer tensor belongs to: e for "...experts.<e>.<rest>" (per-expert
// modules and their compressed scales), -1 for any other tensor (shared experts, the router,
// transformers v5's fused [E, ...] expert tensors).
int64_t routed_expert_of(std::string_view name);

}  // namespace strata
