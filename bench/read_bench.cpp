// read_bench CKPT [--write_gb N] [--out DIR]: the GPU layer loop's read pattern, alone, under
// several reader settings, from a cold page cache (root: it drops the cache before each run).
// See bench/README.md.
//
// The checkpoint's tensors are grouped into blobs as the loop reads them (everything outside the
// decoder layers first, then layer by layer: io/layer_reader.h LayerReader::plan). Each run reads
// every blob in order into one host buffer with LayerReader (4 threads, as the loop), while a
// PageWarmer (io/layer_reader.h) reads ahead of it into the page cache, at most 8 GiB ahead (the
// loop's kWarmBytes). Settings: the warmer's threads (0: none) and its sequential-access hint. With
// --write_gb N, a writer thread writes N GB into DIR (default: the checkpoint's parent folder) in
// 64 MiB pwrites with a writeback request after each and an fsync at the end, for the whole run:
// the export's writes that share the disk in a real run. --settings "W:y|n:R,..." runs those
// settings instead (warmer threads; y: sequential hint, n: none, w: each piece asked for with
// WILLNEED, d: no warmer and the reader's files opened with O_DIRECT; reader threads). It prints
// each run's seconds and GB/s (10^9 bytes per second) of checkpoint bytes read.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/layer_reader.h"

namespace {

using namespace strata;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

bool drop_caches() {
  ::sync();
  std::FILE* f = std::fopen("/proc/sys/vm/drop_caches", "w");
  if (!f) return false;
  const bool ok = std::fputs("3\n", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

// Blobs in the loop's order: tensors outside "model.layers.N." first, then each layer's.
std::vector<LayerBlob> loop_blobs(const Checkpoint& ckpt, bool direct) {
  std::map<long, std::vector<std::string>> by_layer;  // -1: outside the layers
  const std::string prefix = "model.layers.";
  for (const std::string& n : ckpt.tensor_names()) {
    long layer = -1;
    if (n.rfind(prefix, 0) == 0) layer = std::strtol(n.c_str() + prefix.size(), nullptr, 10);
    by_layer[layer].push_back(n);
  }
  const LayerReader reader(ckpt, 4, direct);
  std::vector<LayerBlob> blobs;
  for (const auto& [layer, names] : by_layer)
    blobs.push_back(reader.plan(names));
  return blobs;
}

struct Setting {
  int warm_threads;
  bool sequential;
  int reader_threads;
  bool direct = false;     // the reader's files opened with O_DIRECT (no warmer then)
  bool will_need = false;  // the warmer asks for each piece with POSIX_FADV_WILLNEED first
};

}  // namespace

int main(int argc, char** argv) try {
  std::string ckpt_dir, out_dir, only;
  double write_gb = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--write_gb" && i + 1 < argc) {
      write_gb = std::atof(argv[++i]);
    } else if (a == "--settings" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--out" && i + 1 < argc) {
      out_dir = argv[++i];
    } else if (a[0] != '-' && ckpt_dir.empty()) {
      ckpt_dir = a;
    } else {
      std::fprintf(
          stderr,
          "usage: read_bench CKPT [--write_gb N] [--out DIR] [--settings W:y|n|w|d:R,...]\n");
      return 2;
    }
  }
  if (ckpt_dir.empty()) {
    std::fprintf(
        stderr, "usage: read_bench CKPT [--write_gb N] [--out DIR] [--settings W:y|n|w|d:R,...]\n");
    return 2;
  }
  if (out_dir.empty()) out_dir = std::filesystem::path(ckpt_dir).parent_path().string();
  const Checkpoint ckpt = Checkpoint::open(ckpt_dir);
  const std::vector<LayerBlob> blobs = loop_blobs(ckpt, false);
  const std::vector<LayerBlob> direct_blobs = loop_blobs(ckpt, true);
  uint64_t total = 0, largest = 0;
  for (size_t i = 0; i < blobs.size(); ++i) {
    total += blobs[i].bytes;
    largest = std::max({largest, blobs[i].bytes, direct_blobs[i].bytes});
  }
  std::printf("checkpoint %s: %zu blobs, %.2f GB (largest %.2f GB)%s\n", ckpt_dir.c_str(),
              blobs.size(), static_cast<double>(total) / 1e9, static_cast<double>(largest) / 1e9,
              write_gb > 0 ? str(", with ", write_gb, " GB written meanwhile").c_str() : "");
  std::unique_ptr<uint8_t, decltype(&std::free)> buf(
      static_cast<uint8_t*>(std::aligned_alloc(4096, (largest + 4095) / 4096 * 4096)), &std::free);
  STRATA_CHECK(buf != nullptr, "cannot allocate ", largest, " bytes");
  std::memset(buf.get(), 0, largest);  // resident before the first run
  std::vector<Setting> settings = {{4, false, 4}, {8, false, 4}, {16, false, 4}, {8, true, 4},
                                   {16, true, 4}, {32, true, 4}, {0, false, 16}, {0, true, 16}};
  if (!only.empty()) {  // "W:S:R,...": warmer threads, y|n|d, reader threads
    settings.clear();
    for (size_t at = 0; at < only.size();) {
      size_t end = only.find(',', at);
      if (end == std::string::npos) end = only.size();
      int w = 0, r = 0;
      char q = 'n';
      STRATA_CHECK(std::sscanf(only.substr(at, end - at).c_str(), "%d:%c:%d", &w, &q, &r) == 3,
                   "--settings: W:y|n|w|d:R items, comma-separated");
      settings.push_back({q == 'd' ? 0 : w, q == 'y', std::max(r, 1), q == 'd', q == 'w'});
      at = end + 1;
    }
  }
  std::printf("%-10s %-11s %-8s %9s %8s %s\n", "warmer", "sequential", "reader", "seconds", "GB/s",
              "cache");
  for (const Setting& s : settings) {
    const bool cold = drop_caches();
    std::atomic<bool> stop{false};
    std::thread writer;
    if (write_gb > 0) {
      const std::string path = out_dir + "/read_bench_write.tmp";
      writer = std::thread([&stop, path, write_gb]() {
        const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
        if (fd < 0) return;
        std::vector<uint8_t> block(64u << 20, 0x5a);
        uint64_t at = 0;
        const uint64_t want = static_cast<uint64_t>(write_gb * 1e9);
        while (!stop && at < want) {
          if (::pwrite(fd, block.data(), block.size(), static_cast<off_t>(at)) <= 0) break;
          (void)::sync_file_range(fd, static_cast<off_t>(at), static_cast<off_t>(block.size()),
                                  SYNC_FILE_RANGE_WRITE);
          at += block.size();
        }
        ::fsync(fd);
        ::close(fd);
        ::unlink(path.c_str());
      });
    }
    const auto t0 = Clock::now();
    {
      std::unique_ptr<PageWarmer> warm;
      if (s.warm_threads > 0)
        warm =
            std::make_unique<PageWarmer>(blobs, 8ull << 30, s.warm_threads,
                                         LayerReader::kReadChunkBytes, s.sequential, s.will_need);
      const LayerReader reader(ckpt, s.reader_threads, s.direct);
      for (const LayerBlob& b : s.direct ? direct_blobs : blobs) {
        reader.read(b, buf.get());
        if (warm) warm->advance();
      }
    }
    const double sec = since(t0);
    stop = true;
    if (writer.joinable()) writer.join();
    std::printf("%-10d %-11s %-8s %9.2f %8.2f %s\n", s.warm_threads,
                s.sequential  ? "yes"
                : s.will_need ? "willneed"
                              : "no",
                str(s.reader_threads, s.direct ? " direct" : "").c_str(), sec,
                static_cast<double>(total) / 1e9 / sec,
                cold ? "dropped" : "NOT dropped (not root?)");
    std::fflush(stdout);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "read_bench: %s\n", e.what());
  return 1;
}
