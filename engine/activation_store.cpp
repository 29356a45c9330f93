#include "engine/activation_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/crc32c.h"
#include "core/error.h"
#include "io/safetensors_writer.h"

namespace fs = std::filesystem;

namespace strata {
namespace {

size_t elem_bytes(DType d) {
  return d == DType::kBF16 ? 2 : 4;
}

void pwrite_all(int fd, const void* data, size_t n, uint64_t off, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      fail_write(w < 0 ? errno : EIO, path, n, path, ": cannot write the hidden states: ");
    p += w;
    n -= static_cast<size_t>(w);
    off += static_cast<uint64_t>(w);
  }
}

void pread_all(int fd, void* data, size_t n, uint64_t off, const std::string& path) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    STRATA_CHECK(r > 0, path, ": cannot read the hidden states (",
                 r == 0 ? "file too short" : std::strerror(errno),
                 "); run with --overwrite to start over");
    p += r;
    n -= static_cast<size_t>(r);
    off += static_cast<uint64_t>(r);
  }
}

std::string hex32(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

ActivationStore::ActivationStore(std::vector<int64_t> rows, int64_t hidden, DType dtype, bool spill,
                                 std::string spill_dir, std::vector<bool> owned)
    : rows_(std::move(rows)),
      hidden_(hidden),
      dtype_(dtype),
      spill_(spill),
      spill_dir_(std::move(spill_dir)),
      owned_(std::move(owned)) {
  STRATA_ASSERT(dtype_ == DType::kBF16 || dtype_ == DType::kF32, "activation store dtype");
  STRATA_ASSERT(owned_.empty() || owned_.size() == rows_.size(), "activation store owners");
  out_sums_.assign(rows_.size(), 0);
  in_sums_.assign(rows_.size(), 0);
  if (!spill_) {
    mem_.resize(rows_.size());
    for (size_t b = 0; b < rows_.size(); ++b)
      if (owns(b)) mem_[b].resize(static_cast<size_t>(rows_[b] * hidden_) * elem_bytes(dtype_));
  }
}

ActivationStore::~ActivationStore() {
  close_fd(in_fd_);
  close_fd(out_fd_);
}

uint64_t ActivationStore::bytes_for(const std::vector<int64_t>& rows, int64_t hidden, DType dtype) {
  uint64_t n = 0;
  for (int64_t r : rows)
    n += static_cast<uint64_t>(r * hidden) * elem_bytes(dtype);
  return n;
}

uint64_t ActivationStore::largest_batch_bytes(const std::vector<int64_t>& rows, int64_t hidden,
                                              DType dtype) {
  uint64_t n = 0;
  for (int64_t r : rows)
    n = std::max<uint64_t>(n, static_cast<uint64_t>(r * hidden) * elem_bytes(dtype));
  return n;
}

std::string ActivationStore::layout_head(const std::string& path,
                                         std::vector<uint64_t>* offsets) const {
  std::vector<TensorSpec> specs;
  for (size_t b = 0; b < rows_.size(); ++b)
    specs.push_back({"hidden." + std::to_string(b), dtype_, Shape{rows_[b], hidden_}});
  SafetensorsLayout layout = safetensors_layout(specs, {}, path);
  if (offsets) *offsets = layout.offsets;
  return layout.head;
}

// Shared by ranks: created if absent, sized to the whole layout (never truncated: another rank may
// have written its micro-batches already), the header written (the same bytes by every rank).
int ActivationStore::open_shared(const std::string& path, int access, const std::string& head,
                                 const std::vector<uint64_t>& offsets) const {
  const int fd = ::open(path.c_str(), access | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    fail_write(errno, path, 0, path,
               ": cannot create the hidden states (check --offload_folder): ");
  const uint64_t size =
      offsets.empty()
          ? head.size()
          : offsets.back() + static_cast<uint64_t>(rows_.back() * hidden_) * elem_bytes(dtype_);
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0)
    fail_write(errno, path, size, path, ": cannot size the hidden states: ");
  pwrite_all(fd, head.data(), head.size(), 0, path);
  return fd;
}

void ActivationStore::begin(int64_t next) {
  next_ = next;
  out_sums_.assign(rows_.size(), 0);
  if (!spill_) return;
  close_fd(out_fd_);
  out_path_ = (fs::path(spill_dir_) / ("hidden-" + std::to_string(next) + ".safetensors")).string();
  const std::string head = layout_head(out_path_, &offsets_);
  if (!owned_.empty()) {
    out_fd_ = open_shared(out_path_, O_RDWR, head, offsets_);
    return;
  }
  out_fd_ = ::open(out_path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out_fd_ < 0)
    fail_write(errno, out_path_, 0, out_path_,
               ": cannot create the spilled hidden states (check --offload_folder): ");
  pwrite_all(out_fd_, head.data(), head.size(), 0, out_path_);
}

void ActivationStore::read(size_t b, float* out) const {
  STRATA_ASSERT(owns(b), "micro-batch ", b, " is another rank's");
  const size_t n = static_cast<size_t>(rows_[b] * hidden_);
  if (dtype_ == DType::kF32) {
    if (spill_) {
      pread_all(in_fd_, out, n * 4, offsets_[b], in_path_);
    } else {
      std::memcpy(out, mem_[b].data(), n * 4);
    }
    return;
  }
  // bf16 -> fp32 in place: read the 2-byte values into the upper half of `out`, widen forwards.
  uint16_t* half = reinterpret_cast<uint16_t*>(out) + n;
  if (spill_) {
    pread_all(in_fd_, half, n * 2, offsets_[b], in_path_);
  } else {
    std::memcpy(half, mem_[b].data(), n * 2);
  }
  for (size_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(half[i]) << 16;
    std::memcpy(out + i, &bits, 4);
  }
}

void ActivationStore::write(size_t b, const float* in) {
  STRATA_ASSERT(owns(b), "micro-batch ", b, " is another rank's");
  const size_t n = static_cast<size_t>(rows_[b] * hidden_);
  const void* src = in;
  std::vector<uint16_t> half;
  if (dtype_ == DType::kBF16) {
    half.resize(n);
    uint32_t low = 0;
    for (size_t i = 0; i < n; ++i) {
      uint32_t bits;
      std::memcpy(&bits, in + i, 4);
      low |= bits & 0xffffu;
      half[i] = static_cast<uint16_t>(bits >> 16);
    }
    STRATA_ASSERT(low == 0, "hidden states of micro-batch ", b, " are not bf16-exact");
    src = half.data();
  }
  const size_t nbytes = n * elem_bytes(dtype_);
  out_sums_[b] = crc32c(src, nbytes);
  if (spill_) {
    pwrite_all(out_fd_, src, nbytes, offsets_[b], out_path_);
  } else {
    std::memcpy(mem_[b].data(), src, nbytes);
  }
}

uint64_t ActivationStore::batch_bytes(size_t b) const {
  return static_cast<uint64_t>(rows_[b] * hidden_) * elem_bytes(dtype_);
}

void ActivationStore::read_raw(size_t b, void* out) const {
  if (spill_) {
    pread_all(in_fd_, out, batch_bytes(b), offsets_[b], in_path_);
  } else {
    std::memcpy(out, mem_[b].data(), batch_bytes(b));
  }
}

void ActivationStore::write_raw(size_t b, const void* in) {
  out_sums_[b] = crc32c(in, batch_bytes(b));
  if (spill_) {
    pwrite_all(out_fd_, in, batch_bytes(b), offsets_[b], out_path_);
  } else {
    std::memcpy(mem_[b].data(), in, batch_bytes(b));
  }
}

std::string ActivationStore::commit(const std::string& resume_dir, bool durable) {
  in_sums_ = out_sums_;
  if (spill_) {
    if (durable && ::fsync(out_fd_) != 0)
      fail_write(errno, out_path_, 0, out_path_, ": fsync failed: ");
    close_fd(in_fd_);
    in_fd_ = out_fd_;
    out_fd_ = -1;
    in_path_ = out_path_;
    return durable ? in_path_ : "";
  }
  if (!durable) return "";
  const std::string path =
      (fs::path(resume_dir) / ("hidden-" + std::to_string(next_) + ".safetensors")).string();
  std::vector<uint64_t> offsets;
  const std::string head = layout_head(path, &offsets);
  int fd = -1;
  if (!owned_.empty()) {
    fd = open_shared(path, O_WRONLY, head, offsets);
  } else {
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) fail_write(errno, path, 0, path, ": cannot create: ");
  }
  try {
    if (owned_.empty()) pwrite_all(fd, head.data(), head.size(), 0, path);
    for (size_t b = 0; b < mem_.size(); ++b)
      if (owns(b)) pwrite_all(fd, mem_[b].data(), mem_[b].size(), offsets[b], path);
  } catch (const Error&) {
    ::close(fd);  // the file stays unnamed by any manifest: a resumed run deletes it
    throw;
  }
  const int synced = ::fsync(fd) == 0 ? 0 : errno;
  ::close(fd);
  if (synced != 0) fail_write(synced, path, 0, path, ": fsync failed: ");
  return path;
}

void ActivationStore::load(const std::string& path) {
  std::error_code ec;
  STRATA_CHECK(fs::exists(path, ec), path,
               ": missing, but the resume manifest needs it; run with --overwrite to start over");
  std::vector<uint64_t> offsets;
  const std::string head = layout_head(path, &offsets);
  const uint64_t size = fs::file_size(path, ec);
  const uint64_t want =
      offsets.empty()
          ? head.size()
          : offsets.back() + static_cast<uint64_t>(rows_.back() * hidden_) * elem_bytes(dtype_);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  STRATA_CHECK(fd >= 0, path, ": cannot open: ", std::strerror(errno));
  std::string have(head.size(), '\0');
  if (size >= head.size()) pread_all(fd, have.data(), have.size(), 0, path);
  if (size != want || have != head) {
    ::close(fd);
    fail(path,
         ": not the hidden states this run expects (micro-batch shapes or dtype differ); run "
         "with --overwrite to start over");
  }
  if (spill_) {
    close_fd(in_fd_);
    in_fd_ = fd;
    in_path_ = path;
    offsets_ = offsets;
    return;
  }
  for (size_t b = 0; b < mem_.size(); ++b)
    if (owns(b)) pread_all(fd, mem_[b].data(), mem_[b].size(), offsets[b], path);
  ::close(fd);
}

std::string ActivationStore::check(const std::string& path,
                                   const std::vector<uint32_t>& sums) const {
  std::error_code ec;
  if (!fs::exists(path, ec)) return "is missing";
  std::vector<uint64_t> offsets;
  const std::string head = layout_head(path, &offsets);
  const uint64_t want =
      offsets.empty() ? head.size() : offsets.back() + batch_bytes(rows_.size() - 1);
  const uint64_t size = fs::file_size(path, ec);
  if (ec) return str("cannot be read: ", ec.message());
  if (size != want) return str("is ", size, " bytes, ", want, " expected (truncated or extended)");
  if (sums.size() != rows_.size())
    return str("has ", sums.size(), " recorded checksums for ", rows_.size(), " micro-batches");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return str("cannot be opened: ", std::strerror(errno));
  std::string problem;
  try {
    std::string have(head.size(), '\0');
    pread_all(fd, have.data(), have.size(), 0, path);
    if (have != head) problem = "has another header than this run's hidden states";
    std::vector<uint8_t> chunk(std::min<uint64_t>(want, uint64_t{16} << 20));
    for (size_t b = 0; problem.empty() && b < rows_.size(); ++b) {
      uint32_t crc = 0;
      for (uint64_t at = 0, n = batch_bytes(b); at < n;) {
        const size_t len = static_cast<size_t>(std::min<uint64_t>(n - at, chunk.size()));
        pread_all(fd, chunk.data(), len, offsets[b] + at, path);
        crc = crc32c(chunk.data(), len, crc);
        at += len;
      }
      if (crc != sums[b])
        problem = str("fails its checksum in micro-batch ", b, " (CRC-32C ", hex32(crc),
                      ", the manifest records ", hex32(sums[b]), ")");
    }
  } catch (const Error& e) {
    problem = str("cannot be read: ", e.what());
  }
  ::close(fd);
  return problem;
}

}  // namespace strata
