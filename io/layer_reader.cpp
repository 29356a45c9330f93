#include "io/layer_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "core/error.h"

namespace strata {
namespace {

constexpr uint64_t kPageAlign = 4096;

uint64_t align_down(uint64_t x) {
  return x / kPageAlign * kPageAlign;
}
uint64_t align_up(uint64_t x) {
  return (x + kPageAlign - 1) / kPageAlign * kPageAlign;
}

}  // namespace

void read_files(const std::vector<FileRead>& reads, uint8_t* dst, int threads, bool direct,
                bool whole_pages) {
  std::vector<int> fds(reads.size(), -1);
  std::map<std::string, int> opened;
  auto close_all = [&]() {
    for (auto& [p, fd] : opened)
      ::close(fd);
  };
  for (size_t r = 0; r < reads.size(); ++r) {
    const std::string& p = reads[r].path;
    auto it = opened.find(p);
    if (it == opened.end()) {
      int fd = direct ? ::open(p.c_str(), O_RDONLY | O_DIRECT) : -1;
      if (fd < 0) fd = ::open(p.c_str(), O_RDONLY);
      if (fd < 0) {
        const int err = errno;
        close_all();
        fail(p, ": cannot open for reading: ", std::strerror(err));
      }
      it = opened.emplace(p, fd).first;
    }
    fds[r] = it->second;
  }
  struct Chunk {
    size_t read;
    uint64_t file_offset, length, buffer_offset;
  };
  // Chunks in file order, so that each thread reads forward.
  std::vector<Chunk> chunks;
  for (size_t r = 0; r < reads.size(); ++r) {
    const FileRead& g = reads[r];
    for (uint64_t o = 0; o < g.length; o += LayerReader::kReadChunkBytes) {
      chunks.push_back({r, g.file_offset + o, std::min(LayerReader::kReadChunkBytes, g.length - o),
                        g.buffer_offset + o});
    }
  }
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::string error;
  auto work = [&]() {
    for (size_t c = next++; c < chunks.size(); c = next++) {
      const Chunk& k = chunks[c];
      uint64_t done = 0;
      const uint64_t want = whole_pages ? align_up(k.length) : k.length;
      while (done < k.length) {
        const ssize_t n = ::pread(fds[k.read], dst + k.buffer_offset + done, want - done,
                                  static_cast<off_t>(k.file_offset + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          std::lock_guard<std::mutex> lock(mu);
          if (error.empty())
            error =
                str(reads[k.read].path, ": read of ", k.length, " bytes at offset ", k.file_offset,
                    " failed: ", n < 0 ? std::strerror(errno) : "the file ends early");
          return;
        }
        done += static_cast<uint64_t>(n);
      }
    }
  };
  const int n_threads =
      static_cast<int>(std::min<size_t>(static_cast<size_t>(std::max(threads, 1)), chunks.size()));
  std::vector<std::thread> pool;
  for (int t = 1; t < n_threads; ++t)
    pool.emplace_back(work);
  work();
  for (std::thread& t : pool)
    t.join();
  close_all();
  STRATA_CHECK(error.empty(), error);
}

LayerReader::LayerReader(const Checkpoint& ckpt, int threads, bool direct)
    : ckpt_(ckpt), threads_(std::max(threads, 1)), direct_(direct) {}

LayerBlob LayerReader::plan(const std::vector<std::string>& names) const {
  // (shard path, absolute begin, absolute end, name), sorted by shard then offset.
  struct Span {
    std::string path;
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Span> spans;
  spans.reserve(names.size());
  for (const std::string& n : names) {
    const SafetensorsFile& f = ckpt_.shard_of(n);
    const TensorEntry& e = ckpt_.entry(n);
    const uint64_t base = f.header().data_offset;
    spans.push_back({f.path(), base + e.begin, base + e.end, &n});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.path != b.path ? a.path < b.path : a.begin < b.begin;
  });
  LayerBlob blob;
  uint64_t at = 0;
  for (size_t i = 0; i < spans.size();) {
    // One range: spans i..j-1 of one shard whose gaps are small.
    // Buffered reads start at the first tensor, so that it lands 4096-aligned in the buffer and
    // its neighbours keep the file's relative alignment (16 bytes for most tensors: what the
    // GEMMs want); O_DIRECT needs the file offset aligned instead.
    const uint64_t start = direct_ ? align_down(spans[i].begin) : spans[i].begin;
    uint64_t end = spans[i].end;
    size_t j = i + 1;
    while (j < spans.size() && spans[j].path == spans[i].path &&
           spans[j].begin <= end + kMergeGapBytes) {
      end = std::max(end, spans[j].end);
      ++j;
    }
    blob.ranges.push_back({spans[i].path, start, end - start, at});
    for (size_t k = i; k < j; ++k) {
      const TensorEntry& e = ckpt_.entry(*spans[k].name);
      blob.items[*spans[k].name] = {e.dtype, e.shape, at + (spans[k].begin - start),
                                    spans[k].end - spans[k].begin};
    }
    at += align_up(end - start);
    i = j;
  }
  blob.bytes = at;
  return blob;
}

void LayerReader::read(const LayerBlob& blob, uint8_t* dst) const {
  std::vector<FileRead> reads;
  reads.reserve(blob.ranges.size());
  for (const LayerBlob::Range& g : blob.ranges)
    reads.push_back({g.path, g.file_offset, g.buffer_offset, g.length});
  // Whole pages: O_DIRECT needs aligned lengths, and the buffer has room up to each range's
  // aligned end.
  read_files(reads, dst, threads_, direct_, true);
}

ReadPattern parse_read_pattern(const std::string& flag, const std::string& value) {
  const auto bad = [&]() {
    return str(
        flag, " takes THREADS[:none|sequential|willneed[:PIECE_MiB[:READ_KiB]]][:wait|nowait] (1 ",
        "to 64 threads, pieces of 1 to 4096 MiB, reads of 4 KiB to the piece), got '", value, "'");
  };
  std::vector<std::string> parts;
  for (size_t at = 0;;) {
    const size_t colon = value.find(':', at);
    parts.push_back(value.substr(at, colon == std::string::npos ? std::string::npos : colon - at));
    if (colon == std::string::npos) break;
    at = colon + 1;
  }
  const auto number = [&](const std::string& s, long lo, long hi) {
    char* end = nullptr;
    const long n = std::strtol(s.c_str(), &end, 10);
    STRATA_CHECK(!s.empty() && *end == '\0' && n >= lo && n <= hi, bad());
    return n;
  };
  ReadPattern p;
  if (parts.size() > 1 && (parts.back() == "wait" || parts.back() == "nowait")) {
    p.consumer_waits = parts.back() == "wait";
    parts.pop_back();
  }
  STRATA_CHECK(parts.size() <= 4, bad());
  p.threads = static_cast<int>(number(parts[0], 1, 64));
  if (parts.size() > 1) {
    const std::string& hint = parts[1];
    STRATA_CHECK(hint == "none" || hint == "sequential" || hint == "willneed", bad());
    p.sequential = hint == "sequential";
    p.will_need = hint == "willneed";
  }
  if (parts.size() > 2) {
    p.piece_bytes = static_cast<uint64_t>(number(parts[2], 1, 4096)) << 20;
    p.read_bytes = std::min(p.read_bytes, p.piece_bytes);
  }
  if (parts.size() > 3) {
    p.read_bytes = static_cast<uint64_t>(number(parts[3], 4, 4 << 20)) << 10;
    STRATA_CHECK(p.read_bytes <= p.piece_bytes, bad());
  }
  return p;
}

std::string describe(const ReadPattern& p) {
  return str(p.threads, " threads, ", p.piece_bytes >> 20, " MiB pieces in ", p.read_bytes >> 10,
             " KiB reads", p.sequential ? ", sequential hint" : "",
             p.will_need ? ", WILLNEED per piece" : "",
             p.consumer_waits ? ", the reader waits for it" : ", the reader beside it");
}

struct PageWarmer::Impl {
  struct Piece {
    std::string path;
    uint64_t offset, length;
    uint64_t start;  // bytes of the blobs before it
    size_t blob;
  };
  std::vector<Piece> pieces;
  std::vector<uint64_t> blob_end;  // bytes of blobs [0, b]
  uint64_t window = 0;
  ReadPattern pattern;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t consumed = 0;        // bytes of the blobs the consumer has read (under mu)
  uint64_t wanted_end = 0;      // the end of the last blob wait_read asked for (under mu)
  size_t advanced = 0;          // blobs the consumer has read (under mu)
  bool stop = false;            // (under mu)
  bool failed = false;          // a read failed: the warming ended (under mu)
  size_t next = 0;              // the next piece to read (under mu)
  std::vector<size_t> pending;  // per blob, its pieces not yet read (under mu)
  size_t ready = 0;             // blobs [0, ready) read whole (under mu)
  std::atomic<uint64_t> done{0};
  std::vector<std::thread> pool;

  // Past every leading blob with no piece left to read (under mu).
  void move_ready() {
    while (ready < pending.size() && pending[ready] == 0)
      ++ready;
  }

  void piece_done(size_t blob, bool ok) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!ok) {
        failed = true;
      } else {
        --pending[blob];
        move_ready();
      }
    }
    cv.notify_all();
  }

  void work() {
    // Not zero-filled: only the bytes a pread writes become resident.
    const uint64_t read_bytes = pattern.read_bytes;
    std::unique_ptr<uint8_t[]> buf(new uint8_t[read_bytes]);
    std::map<std::string, int> fds;
    for (;;) {
      size_t i;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] {
          return stop || failed || next >= pieces.size() ||
                 pieces[next].start < std::max(consumed + window, wanted_end);
        });
        if (stop || failed || next >= pieces.size()) break;
        i = next++;
      }
      const Piece& p = pieces[i];
      auto it = fds.find(p.path);
      if (it == fds.end()) {
        it = fds.emplace(p.path, ::open(p.path.c_str(), O_RDONLY)).first;
        if (it->second >= 0 && pattern.sequential)
          (void)::posix_fadvise(it->second, 0, 0, POSIX_FADV_SEQUENTIAL);
      }
      if (it->second < 0) {
        piece_done(p.blob, false);
        break;
      }
      // The whole piece asked for at once (the kernel queues its reads together), then read.
      if (pattern.will_need)
        (void)::posix_fadvise(it->second, static_cast<off_t>(p.offset),
                              static_cast<off_t>(p.length), POSIX_FADV_WILLNEED);
      uint64_t got = 0;
      while (got < p.length) {
        const ssize_t n = ::pread(it->second, buf.get(), std::min(read_bytes, p.length - got),
                                  static_cast<off_t>(p.offset + got));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += static_cast<uint64_t>(n);
        done += static_cast<uint64_t>(n);
      }
      piece_done(p.blob, got == p.length);
      if (got < p.length) break;
    }
    for (auto& [path, fd] : fds)
      if (fd >= 0) ::close(fd);
  }
};

PageWarmer::PageWarmer(std::vector<LayerBlob> blobs, uint64_t window, const ReadPattern& pattern)
    : impl_(std::make_unique<Impl>()) {
  impl_->window = window;
  impl_->pattern = pattern;
  ReadPattern& p = impl_->pattern;
  p.piece_bytes = std::max<uint64_t>(p.piece_bytes, kPageAlign);
  p.read_bytes = std::clamp<uint64_t>(p.read_bytes, kPageAlign, p.piece_bytes);
  uint64_t total = 0;
  for (const LayerBlob& b : blobs) {
    for (const LayerBlob::Range& r : b.ranges) {
      for (uint64_t o = 0; o < r.length; o += p.piece_bytes) {
        const uint64_t n = std::min(p.piece_bytes, r.length - o);
        impl_->pieces.push_back({r.path, r.file_offset + o, n, total, impl_->blob_end.size()});
        total += n;
      }
    }
    impl_->blob_end.push_back(total);
  }
  impl_->pending.assign(impl_->blob_end.size(), 0);
  for (const Impl::Piece& piece : impl_->pieces)
    ++impl_->pending[piece.blob];
  impl_->move_ready();  // blobs without pieces
  for (int t = 0; t < std::max(p.threads, 1); ++t)
    impl_->pool.emplace_back([this]() { impl_->work(); });
}

PageWarmer::~PageWarmer() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  for (std::thread& t : impl_->pool)
    t.join();
}

void PageWarmer::advance(size_t blobs) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->advanced = std::min(impl_->advanced + blobs, impl_->blob_end.size());
    impl_->consumed = impl_->advanced == 0 ? 0 : impl_->blob_end[impl_->advanced - 1];
  }
  impl_->cv.notify_all();
}

void PageWarmer::wait_read(size_t blob) {
  std::unique_lock<std::mutex> lock(impl_->mu);
  if (blob >= impl_->blob_end.size()) return;
  if (impl_->blob_end[blob] > impl_->wanted_end) {
    impl_->wanted_end = impl_->blob_end[blob];
    impl_->cv.notify_all();
  }
  impl_->cv.wait(lock, [&] { return impl_->stop || impl_->failed || impl_->ready > blob; });
}

uint64_t PageWarmer::bytes_read() const {
  return impl_->done.load();
}

}  // namespace strata
