#include "io/checkpoint.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <set>
#include <system_error>

#include "core/error.h"
#include "core/log.h"
#include "core/parallel.h"
#include "core/transpose.h"
#include "io/fused_experts.h"
#include "io/json.h"
#include "io/plain_json.h"

namespace strata {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kIndexName = "model.safetensors.index.json";
constexpr std::string_view kSingleName = "model.safetensors";
constexpr std::string_view kSuffix = ".safetensors";

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// A shard name must be a plain file name inside the checkpoint directory.
void check_shard_name(const std::string& what, const std::string& tensor,
                      const std::string& shard) {
  const std::string where = str(what, ": tensor '", tensor, "': shard name \"", shard, "\"");
  STRATA_CHECK(!shard.empty(), where, " is empty");
  STRATA_CHECK(shard.find('/') == std::string::npos && shard.find('\\') == std::string::npos, where,
               " contains a path separator; shards must sit in the checkpoint directory");
  STRATA_CHECK(shard != "." && shard != ".." && shard.find("..") == std::string::npos, where,
               " contains \"..\"");
  STRATA_CHECK(shard.find('\0') == std::string::npos, where, " contains a NUL byte");
  STRATA_CHECK(ends_with(shard, kSuffix) && shard.size() > kSuffix.size(), where,
               " does not end in .safetensors (strata reads safetensors checkpoints only)");
}

}  // namespace

namespace {

// The tree path: the strict JSON parser, then the checks. Every problem is reported here.
std::map<std::string, std::string> parse_index_tree(std::string_view text,
                                                    const std::string& what) {
  const Json j = json_parse_strict(text, what);
  STRATA_CHECK(j.is_object(), what, ": index must be a JSON object, got ", j.type_name());
  if (j.contains("metadata")) {
    STRATA_CHECK(j["metadata"].is_object() || j["metadata"].is_null(), what,
                 ": \"metadata\" must be an object, got ", j["metadata"].type_name());
  }
  STRATA_CHECK(j.contains("weight_map"), what, ": missing \"weight_map\"");
  const Json& wm = j["weight_map"];
  STRATA_CHECK(wm.is_object(), what, ": \"weight_map\" must be an object, got ", wm.type_name());
  std::map<std::string, std::string> out;
  for (const auto& [name, shard] : wm.items()) {
    STRATA_CHECK(shard.is_string(), what, ": tensor '", name,
                 "': shard must be a file name string, got ", shard.type_name());
    check_shard_name(what, name, shard.get_ref<const std::string&>());
    out.emplace(name, shard.get<std::string>());  // duplicates were refused by the parser
  }
  return out;
}

// The direct path (io/plain_json.h): {"metadata": null or {key: string, integer or null},
// "weight_map": {tensor: shard}} with ASCII strings, each key once, every shard name valid. False
// on anything else, and the tree path reads the text again.
bool parse_index_plain(std::string_view text, const std::string& what,
                       std::map<std::string, std::string>& out) {
  PlainJson j(text);
  bool seen_metadata = false, seen_map = false;
  if (!j.take('{') || j.take('}')) return false;
  do {
    std::string_view key;
    if (!j.string(&key, false) || !j.take(':')) return false;
    if (key == "metadata" && !seen_metadata) {
      seen_metadata = true;
      if (j.null()) continue;
      if (!j.take('{')) return false;
      if (j.take('}')) continue;
      std::vector<std::string_view> keys;
      do {
        std::string_view k, v;
        uint64_t n = 0;
        if (!j.string(&k, false) || !j.take(':')) return false;
        if (!j.string(&v, false) && !j.uint(UINT64_MAX, &n) && !j.null()) return false;
        keys.push_back(k);
      } while (j.take(','));
      if (!j.take('}')) return false;
      std::sort(keys.begin(), keys.end());
      if (std::adjacent_find(keys.begin(), keys.end()) != keys.end()) return false;
    } else if (key == "weight_map" && !seen_map) {
      seen_map = true;
      if (!j.take('{')) return false;
      if (j.take('}')) continue;
      std::optional<std::string_view> checked;  // the last shard name found valid (they repeat)
      do {
        std::string_view name, shard;
        if (!j.string(&name, false) || !j.take(':') || !j.string(&shard, false)) return false;
        if (shard != checked) {
          try {
            check_shard_name(what, std::string(name), std::string(shard));
          } catch (const Error&) {
            return false;
          }
          checked = shard;
        }
        const size_t before = out.size();
        out.emplace_hint(out.end(), std::string(name), std::string(shard));
        if (out.size() == before) return false;  // a duplicate
      } while (j.take(','));
      if (!j.take('}')) return false;
    } else {
      return false;
    }
  } while (j.take(','));
  return seen_map && j.take('}') && j.at_end();
}

}  // namespace

std::map<std::string, std::string> parse_safetensors_index(std::string_view text,
                                                           const std::string& what) {
  std::map<std::string, std::string> out;
  if (parse_index_plain(text, what, out)) return out;
  return parse_index_tree(text, what);
}

Checkpoint Checkpoint::open(const std::string& dir) {
  std::error_code ec;
  STRATA_CHECK(fs::is_directory(dir, ec), dir, ": not a directory (expected a Hugging Face ",
               "checkpoint directory with config.json and *.safetensors)");
  Checkpoint c;
  c.dir_ = dir;
  const fs::path root(dir);

  // Which shard files, and (with an index) which shard each tensor should be in.
  std::vector<std::string> shard_files;
  std::map<std::string, std::string> index;
  const fs::path index_path = root / kIndexName;
  const bool has_index = fs::exists(index_path, ec);
  if (has_index) {
    const std::string what = index_path.string();
    const auto mapped = MappedFile::open(what);
    const std::string_view text(reinterpret_cast<const char*>(mapped->data()), mapped->size());
    index = parse_safetensors_index(text, what);
    STRATA_CHECK(!index.empty(), what, ": weight_map lists no tensors");
    std::set<std::string> names;
    for (const auto& [tensor, shard] : index) {
      if (names.insert(shard).second) {
        STRATA_CHECK(fs::is_regular_file(root / shard, ec), what, ": tensor '", tensor,
                     "' is in shard ", shard, ", which does not exist in ", dir);
      }
    }
    shard_files.assign(names.begin(), names.end());
  } else if (fs::exists(root / kSingleName, ec)) {
    shard_files.push_back(std::string(kSingleName));
  } else {
    for (const auto& de : fs::directory_iterator(root, ec)) {
      const std::string name = de.path().filename().string();
      if (ends_with(name, kSuffix) && de.is_regular_file(ec)) shard_files.push_back(name);
    }
    STRATA_CHECK(!ec, dir, ": cannot list the directory: ", ec.message());
    std::sort(shard_files.begin(), shard_files.end());
    STRATA_CHECK(!shard_files.empty(), dir, ": no ", kIndexName, ", ", kSingleName,
                 " or other *.safetensors file; expected a Hugging Face checkpoint directory");
    STRATA_CHECK(shard_files.size() == 1, dir, ": ", shard_files.size(),
                 " .safetensors files but no ", kIndexName, " saying which tensors they hold (",
                 shard_files[0], ", ", shard_files[1], ", ...)");
  }

  // Open every shard (validating its header; on several threads, the first failing shard in
  // order reported) and record where each tensor lives.
  std::vector<std::optional<SafetensorsFile>> opened(shard_files.size());
  parallel_chunks(shard_files.size(), startup_threads(), 1, [&](size_t begin, size_t end) {
    for (size_t s = begin; s < end; ++s)
      opened[s].emplace(SafetensorsFile::open((root / shard_files[s]).string()));
  });
  for (size_t s = 0; s < shard_files.size(); ++s) {
    c.shards_.push_back(std::move(*opened[s]));
    const std::vector<TensorEntry>& entries = c.shards_.back().entries();
    for (size_t e = 0; e < entries.size(); ++e) {
      auto [it, inserted] = c.where_.emplace(entries[e].name, Where{s, e, false});
      if (!inserted) {
        fail(dir, ": tensor '", entries[e].name, "' is present in two shards, ",
             shard_files[it->second.shard], " and ", shard_files[s]);
      }
    }
  }
  if (has_index) c.check_index(index, shard_files);
  split_fused_experts(c);
  return c;
}

void Checkpoint::check_index(const std::map<std::string, std::string>& index,
                             const std::vector<std::string>& shard_files) const {
  const fs::path root(dir_);
  // The index and the shards must agree in both directions.
  for (const auto& [name, loc] : where_) {
    const SafetensorsFile& shard = shards_[loc.shard];
    auto listed = index.find(name);
    if (listed == index.end()) {
      fail(shard.path(), ": tensor '", name, "' is not listed in ", kIndexName,
           " (loaders would ignore it)");
    }
    STRATA_CHECK(listed->second == shard_files[loc.shard], shard.path(), ": tensor '", name,
                 "' is here but ", kIndexName, " lists it in ", listed->second);
  }
  for (const auto& [tensor, shard] : index) {
    STRATA_CHECK(where_.count(tensor) == 1, (root / shard).string(), ": tensor '", tensor,
                 "' is listed in ", kIndexName, " but absent from this shard");
  }
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(where_.size());
  for (const auto& kv : where_)
    names.push_back(kv.first);
  return names;  // std::map iterates in sorted order
}

std::vector<std::string> Checkpoint::tensor_names_with_prefix(std::string_view prefix) const {
  std::vector<std::string> names;
  for (auto it = where_.lower_bound(prefix); it != where_.end() && it->first.starts_with(prefix);
       ++it)
    names.push_back(it->first);
  return names;
}

bool Checkpoint::has(std::string_view name) const {
  return where_.find(name) != where_.end();
}

const TensorEntry& Checkpoint::entry(std::string_view name) const {
  auto it = where_.find(name);
  STRATA_CHECK(it != where_.end(), dir_, ": no tensor '", name, "' in the checkpoint");
  const Where& w = it->second;
  return w.view ? views_[w.entry] : shards_[w.shard].entries()[w.entry];
}

const SafetensorsFile& Checkpoint::shard_of(std::string_view name) const {
  auto it = where_.find(name);
  STRATA_CHECK(it != where_.end(), dir_, ": no tensor '", name, "' in the checkpoint");
  return shards_[it->second.shard];
}

void Checkpoint::add_view(const std::string& name, const std::string& base, uint64_t offset,
                          DType dtype, const Shape& shape, bool transposed) {
  const TensorEntry& b = entry(base);
  STRATA_ASSERT(!where_.count(name), "view '", name, "' names a tensor already present");
  STRATA_ASSERT(!transposed || shape.size() == 2, "transposed view '", name, "' is not 2-D");
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  TensorEntry v;
  v.name = name;
  v.dtype = dtype;
  v.shape = shape;
  v.begin = b.begin + offset;
  v.end = v.begin + static_cast<uint64_t>(n) * dtype_bits(dtype) / 8;
  STRATA_ASSERT(v.end <= b.end, "view '", name, "' ends past '", base, "'");
  where_.emplace(name, Where{where_.find(base)->second.shard, views_.size(), true, transposed});
  views_.push_back(std::move(v));
  bases_.emplace(name, base);
}

void Checkpoint::hide(const std::string& base) {
  where_.erase(base);
}

std::string Checkpoint::view_base(std::string_view name) const {
  auto it = bases_.find(name);
  return it == bases_.end() ? std::string() : it->second;
}

bool Checkpoint::transposed_view(std::string_view name) const {
  auto it = where_.find(name);
  return it != where_.end() && it->second.transposed;
}

struct Checkpoint::Held {
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<const std::vector<uint8_t>>, std::less<>> copies;
  std::set<std::string, std::less<>> read;
  uint64_t bytes_read = 0;
};

Checkpoint::Checkpoint() : held_(std::make_shared<Held>()) {}

Tensor Checkpoint::tensor(std::string_view name) const {
  const TensorEntry& e = entry(name);
  {
    std::lock_guard<std::mutex> lock(held_->mutex);
    auto it = held_->copies.find(name);
    if (it != held_->copies.end()) {
      const std::shared_ptr<const std::vector<uint8_t>>& b = it->second;
      return Tensor::view(e.dtype, e.shape, b->data(), b->size(), b);
    }
    if (held_->read.insert(std::string(name)).second) held_->bytes_read += e.end - e.begin;
  }
  if (!transposed_view(name)) return shard_of(name).tensor(e);
  // Stored [cols, rows]: a copy in the view's [rows, cols] (held copies above are such copies).
  TensorEntry stored = e;
  stored.shape = {e.shape[1], e.shape[0]};
  const Tensor src = shard_of(name).tensor(stored);
  Tensor out = Tensor::zeros(e.dtype, e.shape);
  const size_t es = static_cast<size_t>(dtype_bits(e.dtype) / 8);
  STRATA_ASSERT(es * 8 == static_cast<size_t>(dtype_bits(e.dtype)), "transposed view '", name,
                "' of a sub-byte dtype");
  const int64_t rows = e.shape[0], cols = e.shape[1];
  transpose_bytes(src.bytes(), cols, rows, es,
                  out.mutable_bytes());  // [cols, rows] -> [rows, cols]
  return out;
}

Tensor Checkpoint::metadata(std::string_view name) const {
  const TensorEntry& e = entry(name);
  STRATA_CHECK(e.end - e.begin <= 64, dir_, ": '", name, "' is ", e.end - e.begin,
               " bytes; it should hold a few integers (a shape)");
  {
    std::lock_guard<std::mutex> lock(held_->mutex);
    held_->read.insert(std::string(name));  // so that tensor() does not count it later either
  }
  return shard_of(name).tensor(e);
}

void Checkpoint::hold(const std::string& name,
                      std::shared_ptr<const std::vector<uint8_t>> bytes) const {
  const TensorEntry& e = entry(name);
  STRATA_ASSERT(bytes && bytes->size() == e.end - e.begin, "held copy of '", name, "' has ",
                bytes ? bytes->size() : 0, " bytes, the tensor ", e.end - e.begin);
  std::lock_guard<std::mutex> lock(held_->mutex);
  held_->copies[name] = std::move(bytes);
}

bool Checkpoint::held(std::string_view name) const {
  std::lock_guard<std::mutex> lock(held_->mutex);
  return held_->copies.find(name) != held_->copies.end();
}

uint64_t Checkpoint::bytes_read() const {
  std::lock_guard<std::mutex> lock(held_->mutex);
  return held_->bytes_read;
}

void Checkpoint::will_need(const std::vector<std::string>& names) const {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  for (const std::string& name : names) {
    if (held(name)) continue;
    const SafetensorsFile& f = shard_of(name);
    const TensorEntry& e = entry(name);
    const uint8_t* base = f.mapping()->data();
    if (base == nullptr) continue;
    const uintptr_t a =
        reinterpret_cast<uintptr_t>(base + f.header().data_offset + e.begin) / page * page;
    const uintptr_t z = reinterpret_cast<uintptr_t>(base + f.header().data_offset + e.end);
    if (z > a) (void)::madvise(reinterpret_cast<void*>(a), z - a, MADV_WILLNEED);
  }
}

void Checkpoint::release(std::string_view name) const {
  {
    std::lock_guard<std::mutex> lock(held_->mutex);
    auto it = held_->copies.find(name);
    if (it != held_->copies.end()) {
      held_->copies.erase(it);
      return;
    }
  }
  const SafetensorsFile& f = shard_of(name);
  const TensorEntry& e = entry(name);
  const uint8_t* base = f.mapping()->data();
  if (base == nullptr) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t a =
      reinterpret_cast<uintptr_t>(base + f.header().data_offset + e.begin) / page * page;
  const uintptr_t z = reinterpret_cast<uintptr_t>(base + f.header().data_offset + e.end);
  if (z > a) (void)::madvise(reinterpret_cast<void*>(a), z - a, MADV_DONTNEED);  // advice only
}

uint64_t Checkpoint::bytes_on_disk() const {
  uint64_t total = 0;
  for (const SafetensorsFile& s : shards_)
    total += s.file_size();
  return total;
}

int64_t routed_expert_of(std::string_view name) {
  static constexpr std::string_view kMark = "experts.";
  for (size_t at = name.find(kMark); at != std::string_view::npos; at = name.find(kMark, at + 1)) {
    if (at > 0 && name[at - 1] != '.') continue;  // "shared_experts." is not routed
    size_t i = at + kMark.size(), digits = 0;
    int64_t e = 0;
    while (i < name.size() && name[i] >= '0' && name[i] <= '9' && digits < 9) {
      e = e * 10 + (name[i] - '0');
      ++i;
      ++digits;
    }
    if (digits > 0 && i < name.size() && name[i] == '.') return e;
  }
  return -1;
}

}  // namespace strata
