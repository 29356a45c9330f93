#include "io/safetensors_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "core/error.h"
#include "core/log.h"
#include "core/parallel.h"
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

// A file being written under its temporary name (temp_path_for's, or the one given). commit()
// flushes it and renames it to the final path; keep() flushes it and leaves it under its
// temporary name for the caller to rename (StagedFiles); destroying it otherwise removes the
// temporary file. Every error names the final path (what the user asked for), and removes the
// temporary file before throwing.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path) : AtomicFile(path, temp_path_for(path)) {}
  AtomicFile(std::string path, std::string temp) : path_(std::move(path)), temp_(std::move(temp)) {
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail_write(errno, path_, 0, path_, ": cannot create ", temp_, ": ");
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
        fail_write(err, path_, n, path_, ": write failed: ");
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
  }

  void keep() {
    close_synced();
    committed_ = true;  // left for the caller
  }

  void commit() {
    close_synced();
    if (::rename(temp_.c_str(), path_.c_str()) != 0) {
      const int err = errno;
      abort();
      fail_write(err, path_, 0, path_, ": cannot rename ", temp_, " into place: ");
    }
    committed_ = true;
    fsync_dir(parent_dir(path_));
  }

 private:
  void close_synced() {
    STRATA_ASSERT(fd_ >= 0, "commit of ", path_, " twice");
    if (::fsync(fd_) != 0) {
      const int err = errno;
      abort();
      fail_write(err, path_, 0, path_, ": fsync failed: ");
    }
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) {
      const int err = errno;
      abort();
      fail_write(err, path_, 0, path_, ": close failed: ");
    }
  }

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

constexpr uint64_t kHeaderAlign = 8;

uint64_t round_up(uint64_t x, uint64_t a) {
  return (x + a - 1) / a * a;
}

// Writes the safetensors bytes of `tensors` to `out` (layout: safetensors_layout).
void write_safetensors_to(AtomicFile& out, const std::string& path, const NamedTensors& tensors,
                          const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  for (const auto& [name, t] : tensors) {
    STRATA_CHECK(t.defined(), path, ": tensor '", name, "' is undefined");
    STRATA_CHECK(t.device() == Device::kCPU, path, ": tensor '", name,
                 "' is not in host memory; copy it to the CPU before writing");
    specs.push_back({name, t.dtype(), t.shape()});
  }
  const SafetensorsLayout layout = safetensors_layout(specs, metadata, path);
  out.write(layout.head.data(), layout.head.size());
  // Data is contiguous, so writing the tensors in offset order writes the file front to back.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return layout.offsets[a] < layout.offsets[b]; });
  for (size_t i : order)
    out.write(tensors[i].second.bytes(), tensors[i].second.nbytes());
}

std::string shard_name(const std::string& prefix, size_t k, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu.safetensors", k, n);
  return prefix + buf;
}

// {"metadata": {"total_size": N}, "weight_map": {...}}, as transformers writes it (indent 2, keys
// sorted, trailing newline). Written last: its presence means complete.
std::string shard_index_text(const std::vector<std::string>& finals,
                             const std::vector<std::vector<std::string>>& names,
                             uint64_t total_bytes) {
  std::map<std::string, std::string> sorted;  // tensor name -> shard file, sorted by name
  for (size_t i = 0; i < finals.size(); ++i) {
    for (const std::string& t : names[i])
      sorted.emplace(t, finals[i]);
  }
  Json weight_map = Json::object();
  for (const auto& [t, shard] : sorted)
    json_append(weight_map, t, shard);  // distinct names: no search (io/json.h)
  Json index = Json::object();
  index["metadata"] = Json::object({{"total_size", total_bytes}});
  index["weight_map"] = std::move(weight_map);
  return index.dump(2) + "\n";
}

}  // namespace

uint64_t TensorSpec::nbytes() const {
  return dtype_bytes(dtype, shape_numel(shape));
}

namespace {

// `s` as a JSON string, as nlohmann's dump writes it: printable ASCII without quotes or
// backslashes as is (every hub name), anything else through nlohmann itself (escapes, UTF-8
// checked).
void append_json_string(std::string& out, const std::string& s, const std::string& path) {
  const bool plain = std::all_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u >= 0x20 && u < 0x80 && c != '"' && c != '\\';
  });
  if (plain) {
    out += '"';
    out += s;
    out += '"';
    return;
  }
  try {
    out += Json(s).dump();
  } catch (const nlohmann::json::exception& e) {
    fail(path,
         ": cannot encode the header (a tensor or metadata name is not valid UTF-8): ", e.what());
  }
}

}  // namespace

// The layout of a safetensors file:
//   [0, 8)          header length N (u64, little-endian), N a multiple of 8
//   [8, 8+N)        JSON header: __metadata__ first (when there is any), then each tensor in
//                   data order as {"dtype", "shape", "data_offsets"}; padded with spaces
//   [8+N, ...)      data, contiguous (the reference safetensors library rejects gaps between
//                   tensors). Data order: tensors with the widest elements first (8-, 4-, 2-,
//                   then 1-byte and packed), the given order within each width, so that every
//                   tensor starts at a multiple of its element size.
SafetensorsLayout safetensors_layout(std::span<const TensorSpec> tensors,
                                     const std::map<std::string, std::string>& metadata,
                                     const std::string& path) {
  // The header's JSON written directly (a JSON tree of 200k entries and its dump took most of the
  // exporter's start-up on a Kimi-K2-sized plan): compact, keys in this order, as nlohmann's
  // dump() of the same object writes it (tests/io/writer_test.cpp compares the two).
  std::string text = "{";
  size_t name_bytes = 0;
  for (const TensorSpec& t : tensors)
    name_bytes += t.name.size();
  text.reserve(name_bytes + 96 * tensors.size() + 64);
  auto append_uint = [&](uint64_t v) {
    char buf[24];
    text.append(buf, static_cast<size_t>(std::to_chars(buf, buf + sizeof buf, v).ptr - buf));
  };
  if (!metadata.empty()) {
    text += "\"__metadata__\":{";
    for (const auto& [k, v] : metadata) {
      if (text.back() != '{') text += ',';
      append_json_string(text, k, path);
      text += ':';
      append_json_string(text, v, path);
    }
    text += '}';
  }
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  auto width = [&](size_t i) { return dtype_bits(tensors[i].dtype); };
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return width(a) > width(b); });
  std::unordered_set<std::string_view> seen;
  seen.reserve(tensors.size());
  SafetensorsLayout layout;
  layout.offsets.resize(tensors.size());
  uint64_t offset = 0;
  for (size_t i : order) {
    const TensorSpec& t = tensors[i];
    STRATA_CHECK(!t.name.empty(), path, ": a tensor has an empty name");
    STRATA_CHECK(t.name != "__metadata__", path, ": a tensor may not be named __metadata__");
    STRATA_CHECK(seen.insert(t.name).second, path, ": tensor '", t.name, "' given twice");
    if (text.size() > 1) text += ',';
    append_json_string(text, t.name, path);
    text += ":{\"dtype\":\"";
    text += dtype_safetensors_name(t.dtype);
    text += "\",\"shape\":[";
    for (size_t d = 0; d < t.shape.size(); ++d) {
      if (d > 0) text += ',';
      STRATA_CHECK(t.shape[d] >= 0, path, ": tensor '", t.name, "' has a negative dimension");
      append_uint(static_cast<uint64_t>(t.shape[d]));
    }
    text += "],\"data_offsets\":[";
    append_uint(offset);
    text += ',';
    append_uint(offset + t.nbytes());
    text += "]}";
    layout.offsets[i] = offset;
    offset += t.nbytes();
  }
  text += '}';
  text.resize(round_up(text.size(), kHeaderAlign), ' ');
  layout.head.resize(8);
  for (int i = 0; i < 8; ++i)
    layout.head[static_cast<size_t>(i)] = static_cast<char>(uint64_t{text.size()} >> (8 * i));
  layout.head += text;
  for (uint64_t& o : layout.offsets)
    o += layout.head.size();
  layout.file_size = layout.head.size() + offset;
  return layout;
}

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

void StagedFiles::stage(const std::string& name, std::string_view contents) {
  AtomicFile out((fs::path(dir_) / name).string(), temp_of(name));
  out.write(contents.data(), contents.size());
  out.keep();
  names_.push_back(name);
}

std::string StagedFiles::temp_of(const std::string& name) const {
  return (fs::path(dir_) / ("." + name + ".staged")).string();
}

std::vector<std::string> StagedFiles::publish() {
  for (const std::string& name : names_) {
    const std::string path = (fs::path(dir_) / name).string();
    const std::string temp = temp_of(name);
    if (::rename(temp.c_str(), path.c_str()) != 0)
      fail_write(errno, path, 0, path, ": cannot rename ", temp, " into place: ");
  }
  if (!names_.empty()) fsync_dir(dir_);
  std::vector<std::string> out;
  out.swap(names_);
  return out;
}

// ---- PlannedShardWriter ------------------------------------------------------------------

namespace {

// `path` is the file being written, `shown` the name errors give it (the shard's final name).
void pwrite_all(int fd, const void* data, size_t n, uint64_t offset, const std::string& path,
                const std::string& shown) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const size_t chunk = n < (size_t{1} << 30) ? n : (size_t{1} << 30);
    const ssize_t w = ::pwrite(fd, p, chunk, static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      fail_write(w < 0 ? errno : EIO, shown, n, path, ": write failed: ");
    }
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
}

}  // namespace

PlannedShardWriter::PlannedShardWriter(std::string out_dir, std::vector<TensorSpec> plan,
                                       ShardOptions options)
    : out_dir_(std::move(out_dir)), options_(std::move(options)), plan_(std::move(plan)) {
  std::error_code ec;
  STRATA_CHECK(fs::is_directory(out_dir_, ec), out_dir_,
               ": output directory does not exist (create it first)");
  STRATA_CHECK(!options_.prefix.empty() && options_.prefix.find('/') == std::string::npos, out_dir_,
               ": shard prefix \"", options_.prefix, "\" must be a plain file name");
  STRATA_CHECK(options_.max_shard_bytes > 0, out_dir_, ": max_shard_bytes must be positive");
  STRATA_CHECK(!plan_.empty(), out_dir_, ": no tensors to write");
  // A shard closes before a tensor that would take it past max_shard_bytes.
  std::vector<std::pair<size_t, size_t>> ranges;
  uint64_t bytes = 0;
  for (size_t i = 0; i < plan_.size(); ++i) {
    const uint64_t n = plan_[i].nbytes();
    if (ranges.empty() || (i > ranges.back().first && bytes + n > options_.max_shard_bytes)) {
      ranges.emplace_back(i, i);
      bytes = 0;
    }
    ranges.back().second = i + 1;
    bytes += n;
    shard_of_.push_back(ranges.size() - 1);
  }
  shards_.resize(ranges.size());
  for (size_t k = 0; k < ranges.size(); ++k) {
    Shard& s = shards_[k];
    // One shard is <prefix>.safetensors with no index, as transformers' save_pretrained (which
    // ModelOpt's export calls) writes a checkpoint that fits one shard.
    s.final_name = ranges.size() == 1 ? options_.prefix + ".safetensors"
                                      : shard_name(options_.prefix, k + 1, ranges.size());
    s.partial_name = "." + s.final_name + ".partial";
    s.begin = ranges[k].first;
    s.end = ranges[k].second;
  }
  // The shards' layouts on several threads (a Kimi-K2 export plans 280k tensors).
  parallel_chunks(shards_.size(), startup_threads(), 1, [&](size_t begin, size_t end) {
    for (size_t k = begin; k < end; ++k) {
      Shard& s = shards_[k];
      s.layout =
          safetensors_layout(std::span<const TensorSpec>(plan_).subspan(s.begin, s.end - s.begin),
                             options_.metadata, path_of(s.final_name));
    }
  });
}

// The thread that asks the kernel to write back the dirty shards (start_writeback): one request
// at a time, a request made meanwhile run after it with the descriptors it named.
struct PlannedShardWriter::Flusher {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> fds;  // the pending request's descriptors
  bool requested = false, busy = false, stop = false;
  double seconds = 0;  // in sync_file_range (under mu once each request ends)
  std::thread thread;

  Flusher() : thread([this] { run(); }) {}
  ~Flusher() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    thread.join();
  }
  void request(std::vector<int> f) {
    {
      std::lock_guard<std::mutex> lock(mu);
      fds = std::move(f);
      requested = true;
    }
    cv.notify_all();
  }
  // Returns once no request is pending or running: the descriptors may be closed then.
  void drain() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [this] { return !requested && !busy; });
  }
  void run() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [this] { return requested || stop; });
      if (stop) return;  // a pending request is dropped: only sync() makes anything durable
      std::vector<int> mine = std::move(fds);
      requested = false;
      busy = true;
      lock.unlock();
      const auto t0 = std::chrono::steady_clock::now();
#ifdef __linux__
      for (int fd : mine)
        (void)::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
#endif
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      lock.lock();
      seconds += s;
      busy = false;
      cv.notify_all();
    }
  }
};

PlannedShardWriter::~PlannedShardWriter() {
  flusher_.reset();  // joined (after its request in flight) before the descriptors close
  for (Shard& s : shards_) {
    if (s.fd >= 0) ::close(s.fd);
  }
}

std::string PlannedShardWriter::path_of(const std::string& name) const {
  return (fs::path(out_dir_) / name).string();
}

void PlannedShardWriter::open_shard(Shard& s, bool create) {
  // A full disk names the shard by its final name, the file the user waits for.
  const std::string path = path_of(s.partial_name), shown = path_of(s.final_name);
  const int flags = create ? (shared_ ? O_CREAT : O_CREAT | O_TRUNC) : 0;
  s.fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | flags, 0644);
  if (s.fd < 0) fail_write(errno, shown, 0, path, ": cannot open for writing: ");
  if (!create) return;
  // Reserve the whole file now, so that a full disk stops the run here rather than mid-shard.
  const int rc = ::posix_fallocate(s.fd, 0, static_cast<off_t>(s.layout.file_size));
  if (is_disk_full(rc)) throw DiskFullError(shown, s.layout.file_size);
  if (rc != 0 && ::ftruncate(s.fd, static_cast<off_t>(s.layout.file_size)) != 0)
    fail_write(errno, shown, s.layout.file_size, path, ": cannot size the file: ");
  pwrite_all(s.fd, s.layout.head.data(), s.layout.head.size(), 0, path, shown);
  s.dirty = true;
}

std::vector<std::string> PlannedShardWriter::vouched_files() const {
  std::vector<std::string> files;
  for (const Shard& s : shards_) {
    if (s.end <= synced_) files.push_back(s.published ? s.final_name : s.partial_name);
    if (s.begin < synced_ && synced_ < s.end) files.push_back(s.partial_name);
  }
  return files;
}

uint64_t PlannedShardWriter::disk_bytes(uint64_t block) const {
  uint64_t n = 0, index = shards_.size() > 1 ? 256 : 0;
  for (const Shard& s : shards_) {
    n += round_up(s.layout.file_size, block);
    // One line per tensor: `    "NAME": "SHARD",` and a newline.
    for (size_t i = s.begin; i < s.end && shards_.size() > 1; ++i)
      index += plan_[i].name.size() + s.final_name.size() + 16;
  }
  return n + round_up(index, block);
}

void PlannedShardWriter::resume(size_t n) {
  STRATA_ASSERT(next_ == 0 && n <= plan_.size(), "resume(", n, ") after writing ", next_);
  for (Shard& s : shards_) {
    if (s.begin >= n) break;
    const std::string partial = path_of(s.partial_name), final_path = path_of(s.final_name);
    std::error_code ec;
    if (s.end <= n && fs::exists(final_path, ec)) {
      STRATA_CHECK(fs::file_size(final_path, ec) == s.layout.file_size, final_path,
                   " has the wrong size for the run being resumed; run again with --overwrite");
      s.published = true;
      continue;
    }
    STRATA_CHECK(fs::exists(partial, ec) && fs::file_size(partial, ec) == s.layout.file_size,
                 partial,
                 " is missing or has the wrong size, but the resume manifest says it "
                 "holds finished work; run again with --overwrite to start over");
    if (s.begin < n && n < s.end) open_shard(s, false);  // continue writing it
  }
  for (size_t i = 0; i < n; ++i)
    bytes_written_ += plan_[i].nbytes();
  next_ = synced_ = n;
  publish();  // shards complete before a kill that came ahead of their rename
}

void PlannedShardWriter::add(const std::string& name, const Tensor& tensor) {
  STRATA_ASSERT(next_ < plan_.size(), "tensor '", name, "' beyond the planned ", plan_.size());
  const TensorSpec& want = plan_[next_];
  STRATA_ASSERT(name == want.name && tensor.dtype() == want.dtype && tensor.shape() == want.shape,
                "tensor '", name, "' ", dtype_name(tensor.dtype()), " ", shape_str(tensor.shape()),
                " written where the plan has '", want.name, "' ", dtype_name(want.dtype), " ",
                shape_str(want.shape));
  STRATA_CHECK(tensor.device() == Device::kCPU, out_dir_, ": tensor '", name,
               "' is not in host memory; copy it to the CPU before writing");
  Shard& s = shards_[shard_of_[next_]];
  if (s.fd < 0) open_shard(s, shared_ || next_ == s.begin);
  const auto t0 = std::chrono::steady_clock::now();
  pwrite_all(s.fd, tensor.bytes(), tensor.nbytes(), s.layout.offsets[next_ - s.begin],
             path_of(s.partial_name), path_of(s.final_name));
  write_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  s.dirty = true;
  bytes_written_ += tensor.nbytes();
  ++next_;
}

void PlannedShardWriter::skip(const std::string& name) {
  STRATA_ASSERT(next_ < plan_.size() && plan_[next_].name == name, "skipped tensor '", name,
                "' is not the next planned one");
  bytes_written_ += plan_[next_].nbytes();
  ++next_;
}

void PlannedShardWriter::start_writeback() {
#ifdef __linux__
  std::vector<int> fds;
  for (const Shard& s : shards_) {
    if (s.dirty && s.fd >= 0) fds.push_back(s.fd);
  }
  if (fds.empty()) return;
  if (!flusher_) flusher_ = std::make_unique<Flusher>();
  flusher_->request(std::move(fds));
#endif
}

double PlannedShardWriter::writeback_seconds() const {
  if (!flusher_) return 0;
  std::lock_guard<std::mutex> lock(flusher_->mu);
  return flusher_->seconds;
}

void PlannedShardWriter::sync() {
  if (flusher_) flusher_->drain();  // it may hold descriptors closed below
  for (Shard& s : shards_) {
    if (!s.dirty) {
      if (s.fd >= 0 && s.end <= next_) {  // opened, every tensor written by others
        ::close(s.fd);
        s.fd = -1;
      }
      continue;
    }
    const std::string path = path_of(s.partial_name);
    if (::fsync(s.fd) != 0) fail_write(errno, path_of(s.final_name), 0, path, ": fsync failed: ");
    s.dirty = false;
    if (s.end <= next_) {
      const int rc = ::close(s.fd);
      s.fd = -1;
      if (rc != 0) fail_write(errno, path_of(s.final_name), 0, path, ": close failed: ");
    }
  }
  fsync_dir(out_dir_);
  synced_ = next_;
}

void PlannedShardWriter::publish() {
  bool renamed = false;
  for (Shard& s : shards_) {
    if (s.published || s.end > synced_) continue;
    if (!publisher_) {  // the publisher renames it
      s.published = true;
      continue;
    }
    const std::string partial = path_of(s.partial_name), final_path = path_of(s.final_name);
    if (::rename(partial.c_str(), final_path.c_str()) != 0)
      fail_write(errno, final_path, 0, final_path, ": cannot rename ", partial, " into place: ");
    s.published = renamed = true;
  }
  if (renamed) fsync_dir(out_dir_);
}

std::vector<std::string> PlannedShardWriter::finish() {
  STRATA_ASSERT(next_ == plan_.size(), "finish after ", next_, " of ", plan_.size(), " tensors");
  sync();
  publish();
  std::vector<std::string> finals;
  for (const Shard& s : shards_)
    finals.push_back(s.final_name);
  return finals;
}

std::pair<std::string, std::string> PlannedShardWriter::index_file() const {
  if (shards_.size() <= 1) return {};
  std::vector<std::string> finals;
  std::vector<std::vector<std::string>> names;
  uint64_t total = 0;
  for (const Shard& s : shards_) {
    finals.push_back(s.final_name);
    names.emplace_back();
    for (size_t i = s.begin; i < s.end; ++i) {
      names.back().push_back(plan_[i].name);
      total += plan_[i].nbytes();
    }
  }
  return {options_.prefix + ".safetensors.index.json", shard_index_text(finals, names, total)};
}

}  // namespace strata
