#include "io/safetensors_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "io/json.h"

namespace strata {

namespace {

namespace fs = std::filesystem;

std::string parent_dir(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

// `<dir>/.<name>.tmp-<pid>-<n>`: hidden, in the same directory (so rename is atomic), and
// distinct per process and per call (two threads writing one path never share a temporary).
std::string temp_path_for(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  const fs::path p(path);
  const std::string name = "." + p.filename().string() + ".tmp-" + std::to_string(::getpid()) +
                           "-" + std::to_string(counter.fetch_add(1));
  return (p.parent_path() / name).string();
}

// Flushes a directory so that a rename inside it survives a crash. Best effort: some
// filesystems refuse fsync on directories, which changes nothing about correctness here.
void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

// A file being written under its temporary name. commit() flushes it and renames it to the
// final path; destroying it uncommitted removes the temporary file. Every error names the final
// path (what the user asked for), and removes the temporary file before throwing.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path) : path_(std::move(path)), temp_(temp_path_for(path_)) {
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      fail(path_, ": cannot create ", temp_, ": ", std::strerror(errno));
    }
  }
  ~AtomicFile() { abort(); }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    while (n > 0) {
      const size_t chunk = n < (size_t{1} << 30) ? n : (size_t{1} << 30);
      const ssize_t w = ::write(fd_, p, chunk);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const int err = w < 0 ? errno : EIO;
        abort();
        fail(path_, ": write failed: ", std::strerror(err),
             err == ENOSPC ? " (the disk is full; free space or choose another output)" : "");
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
  }

  void commit() {
    STRATA_ASSERT(fd_ >= 0, "commit of ", path_, " twice");
    if (::fsync(fd_) != 0) {
      const int err = errno;
      abort();
      fail(path_, ": fsync failed: ", std::strerror(err));
    }
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) {
      const int err = errno;
      abort();
      fail(path_, ": close failed: ", std::strerror(err));
    }
    if (::rename(temp_.c_str(), path_.c_str()) != 0) {
      const int err = errno;
      abort();
      fail(path_, ": cannot rename ", temp_, " into place: ", std::strerror(err));
    }
    committed_ = true;
    fsync_dir(parent_dir(path_));
  }

 private:
  void abort() {
    if (fd_ >= 0) {
      ::close(fd_);
      fd_ = -1;
    }
    if (!committed_) {
      ::unlink(temp_.c_str());
      committed_ = true;  // nothing left to clean up
    }
  }

  std::string path_;
  std::string temp_;
  int fd_ = -1;
  bool committed_ = false;
};

constexpr uint64_t kAlign = 8;

uint64_t round_up(uint64_t x, uint64_t a) {
  return (x + a - 1) / a * a;
}

// Writes the safetensors bytes of `tensors` to `out`:
//   [0, 8)          header length N (u64, little-endian), N a multiple of 8
//   [8, 8+N)        JSON header: __metadata__ first (when there is any), then each tensor in
//                   data order as {"dtype", "shape", "data_offsets"}; padded with spaces
//   [8+N, ...)      data, contiguous (the reference safetensors library rejects gaps between
//                   tensors). Data order: tensors with the widest elements first (8-, 4-, 2-,
//                   then 1-byte and packed), the given order within each width, so that every
//                   tensor starts at a multiple of its element size.
void write_safetensors_to(AtomicFile& out, const std::string& path, const NamedTensors& tensors,
                          const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) {
    Json m = Json::object();
    for (const auto& [k, v] : metadata)
      m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  auto width = [&](size_t i) { return dtype_bits(tensors[i].second.dtype()); };
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return width(a) > width(b); });
  std::set<std::string_view> seen;
  uint64_t offset = 0;
  for (size_t i : order) {
    const auto& [name, t] = tensors[i];
    STRATA_CHECK(!name.empty(), path, ": a tensor has an empty name");
    STRATA_CHECK(name != "__metadata__", path, ": a tensor may not be named __metadata__");
    STRATA_CHECK(seen.insert(name).second, path, ": tensor '", name, "' given twice");
    STRATA_CHECK(t.defined(), path, ": tensor '", name, "' is undefined");
    STRATA_CHECK(t.device() == Device::kCPU, path, ": tensor '", name,
                 "' is not in host memory; copy it to the CPU before writing");
    Json shape = Json::array();
    for (int64_t d : t.shape())
      shape.push_back(d);
    Json entry = Json::object();
    entry["dtype"] = std::string(dtype_safetensors_name(t.dtype()));
    entry["shape"] = std::move(shape);
    entry["data_offsets"] = Json::array({offset, offset + t.nbytes()});
    header[name] = std::move(entry);
    offset += t.nbytes();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    fail(path,
         ": cannot encode the header (a tensor or metadata name is not valid UTF-8): ", e.what());
  }
  text.resize(round_up(text.size(), kAlign), ' ');

  uint8_t len[8];
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));
  out.write(len, 8);
  out.write(text.data(), text.size());
  for (size_t i : order)
    out.write(tensors[i].second.bytes(), tensors[i].second.nbytes());
}

std::string shard_name(const std::string& prefix, size_t k, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu.safetensors", k, n);
  return prefix + buf;
}

}  // namespace

void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata) {
  AtomicFile out(path);
  write_safetensors_to(out, path, tensors, metadata);
  out.commit();
}

void write_file_atomic(const std::string& path, std::string_view contents) {
  AtomicFile out(path);
  out.write(contents.data(), contents.size());
  out.commit();
}

ShardedWriter::ShardedWriter(std::string out_dir, ShardedWriterOptions options)
    : out_dir_(std::move(out_dir)), options_(std::move(options)) {
  std::error_code ec;
  STRATA_CHECK(fs::is_directory(out_dir_, ec), out_dir_,
               ": output directory does not exist (create it first)");
  STRATA_CHECK(!options_.prefix.empty() && options_.prefix.find('/') == std::string::npos, out_dir_,
               ": shard prefix \"", options_.prefix, "\" must be a plain file name");
  STRATA_CHECK(options_.max_shard_bytes > 0, out_dir_, ": max_shard_bytes must be positive");
}

ShardedWriter::~ShardedWriter() {
  if (finished_) return;
  for (const std::string& t : temp_shards_)
    ::unlink(t.c_str());
}

void ShardedWriter::add(std::string name, Tensor tensor) {
  STRATA_ASSERT(!finished_, "ShardedWriter::add after finish()");
  STRATA_CHECK(!name.empty(), out_dir_, ": a tensor has an empty name");
  STRATA_CHECK(names_.insert(name).second, out_dir_, ": tensor '", name, "' added twice");
  STRATA_CHECK(tensor.defined(), out_dir_, ": tensor '", name, "' is undefined");
  const uint64_t n = tensor.nbytes();
  if (!pending_.empty() && pending_bytes_ + n > options_.max_shard_bytes) flush_shard();
  pending_.emplace_back(std::move(name), std::move(tensor));
  pending_bytes_ += n;
  total_bytes_ += n;
}

void ShardedWriter::flush_shard() {
  if (pending_.empty()) return;
  // The final name needs the shard count, known only at finish(): write under a numbered
  // temporary name now and rename later.
  const size_t k = temp_shards_.size() + 1;
  char buf[48];
  std::snprintf(buf, sizeof buf, "-%05zu.safetensors.part-%d", k, static_cast<int>(::getpid()));
  const std::string temp = (fs::path(out_dir_) / ("." + options_.prefix + buf)).string();
  temp_shards_.push_back(temp);  // before writing, so the destructor cleans up a failure
  write_safetensors(temp, pending_, options_.metadata);
  std::vector<std::string> names;
  for (const auto& kv : pending_)
    names.push_back(kv.first);
  shard_names_.push_back(std::move(names));
  pending_.clear();
  pending_bytes_ = 0;
}

std::vector<std::string> ShardedWriter::finish() {
  STRATA_ASSERT(!finished_, "ShardedWriter::finish called twice");
  flush_shard();
  STRATA_CHECK(!temp_shards_.empty(), out_dir_, ": no tensors to write");
  const size_t n = temp_shards_.size();
  std::vector<std::string> finals;
  Json weight_map = Json::object();
  std::map<std::string, std::string> sorted;  // tensor name -> shard file, sorted by name
  for (size_t i = 0; i < n; ++i) {
    finals.push_back(shard_name(options_.prefix, i + 1, n));
    for (const std::string& t : shard_names_[i])
      sorted.emplace(t, finals.back());
  }
  for (size_t i = 0; i < n; ++i) {
    const std::string final_path = (fs::path(out_dir_) / finals[i]).string();
    if (::rename(temp_shards_[i].c_str(), final_path.c_str()) != 0) {
      fail(final_path, ": cannot rename ", temp_shards_[i], " into place: ", std::strerror(errno));
    }
    temp_shards_[i].clear();  // now owned by its final name
  }
  fsync_dir(out_dir_);
  for (const auto& [t, shard] : sorted)
    weight_map[t] = shard;
  // {"metadata": {"total_size": N}, "weight_map": {...}}, as transformers writes it
  // (indent 2, keys sorted, trailing newline). Written last: its presence means complete.
  Json index = Json::object();
  index["metadata"] = Json::object({{"total_size", total_bytes_}});
  index["weight_map"] = std::move(weight_map);
  write_file_atomic((fs::path(out_dir_) / (options_.prefix + ".safetensors.index.json")).string(),
                    index.dump(2) + "\n");
  finished_ = true;
  return finals;
}

}  // namespace strata
