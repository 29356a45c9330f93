// read_bench CKPT [--write_gb N] [--out DIR] [--settings ...] [--rounds N]: the GPU layer loop's
// read pattern, alone, under several reader settings, from a cold page cache (root: it drops the
// cache before each run). See bench/README.md.
//
// The checkpoint's tensors are grouped into blobs as the loop reads them (everything outside the
// decoder layers first, then layer by layer: io/layer_reader.h LayerReader::plan). Each run reads
// every blob in order into one host buffer with LayerReader (4 threads, as the loop), while a
// PageWarmer (io/layer_reader.h) reads ahead of it into the page cache, at most 8 GiB ahead (the
// loop's kWarmBytes). With --write_gb N, a writer thread writes N GB into DIR (default: the
// checkpoint's parent folder) in 64 MiB pwrites with a writeback request after each and an fsync
// at the end, for the whole run: the export's writes that share the disk in a real run.
// --settings "W:q:R[:PIECE_MiB[:READ_KiB]][:wait],..." runs those settings instead of the default
// list: W warmer threads (0: none); q the warmer's hint (n none, y sequential, w WILLNEED per
// piece), or d (no warmer, the reader's files opened with O_DIRECT), or c (no reader: W threads
// each read whole shard files front to back in READ_KiB reads, default 128, PIECE_MiB unused, as
// the `cat`s of bench/gpu_bench.sh's floor); R reader threads; the warmer's piece and read sizes
// (io/layer_reader.h ReadPattern; a size left out: the default's); wait: the reader reads each
// blob only once the warmer has (PageWarmer::wait_read). --rounds N runs the list N
// times in turn, so that each setting's runs are spread over the disk's drift. It prints each
// run's seconds and GB/s (10^9 bytes per second) of checkpoint bytes read, then each setting's
// median.
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
  std::string text;  // as given
  ReadPattern warm;  // threads 0: no warmer
  int reader_threads = 4;
  bool direct = false;  // the reader's files opened with O_DIRECT (no warmer then)
  bool cats = false;    // whole shards by warm.threads threads, no reader
  uint64_t cat_bytes = 128ull << 10;
};

// W threads each reading the next whole shard front to back in `bytes` reads (cat's pattern).
void read_shards(const std::vector<std::string>& paths, int threads, uint64_t bytes) {
  std::atomic<size_t> next{0};
  auto work = [&]() {
    std::vector<uint8_t> buf(bytes);
    for (size_t i = next++; i < paths.size(); i = next++) {
      const int fd = ::open(paths[i].c_str(), O_RDONLY);
      STRATA_CHECK(fd >= 0, paths[i], ": cannot open");
      while (::read(fd, buf.data(), buf.size()) > 0) {
      }
      ::close(fd);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back(work);
  for (std::thread& t : pool)
    t.join();
}

// "W:q:R[:PIECE_MiB[:READ_KiB]][:wait]": W, q and R here, the rest as the warmer's pattern in
// `strata quantize --test_gpu_read`'s form (io/layer_reader.h parse_read_pattern).
Setting parse_setting(const std::string& text) {
  Setting s;
  s.text = text;
  int w = 0, r = 0, used = 0;
  char q = 0;
  const bool ok = std::sscanf(text.c_str(), "%d:%c:%d%n", &w, &q, &r, &used) == 3 && w >= 0 &&
                  std::string("nywdc").find(q) != std::string::npos &&
                  (text[used] == '\0' || text[used] == ':');
  STRATA_CHECK(ok,
               "--settings: W:n|y|w|d|c:R[:PIECE_MiB[:READ_KiB]][:wait] items, comma-separated; ",
               "got '", text, "'");
  const std::string rest = text.substr(used);  // "" or ":..."
  const bool waits = rest.size() >= 5 && rest.compare(rest.size() - 5, 5, ":wait") == 0;
  const char* hint = q == 'y' ? "sequential" : q == 'w' ? "willneed" : "none";
  s.warm = parse_read_pattern("--settings item",
                              str(std::max(w, 1), ":", hint, rest, waits ? "" : ":nowait"));
  s.warm.threads = q == 'd' || w == 0 ? 0 : w;
  s.direct = q == 'd';
  s.cats = q == 'c';
  s.reader_threads = std::max(r, 1);
  // c: the read size named (the piece size is not used), else cat's 128 KiB.
  if (s.cats && std::count(rest.begin(), rest.end(), ':') - (waits ? 1 : 0) >= 2)
    s.cat_bytes = s.warm.read_bytes;
  return s;
}

constexpr const char* kUsage =
    "usage: read_bench CKPT [--write_gb N] [--out DIR] [--rounds N]\n"
    "                  [--settings W:n|y|w|d|c:R[:PIECE_MiB[:READ_KiB]][:wait],...]\n";

}  // namespace

int main(int argc, char** argv) try {
  std::string ckpt_dir, out_dir, only;
  double write_gb = 0;
  int rounds = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--write_gb" && i + 1 < argc) {
      write_gb = std::atof(argv[++i]);
    } else if (a == "--settings" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--rounds" && i + 1 < argc) {
      rounds = std::max(std::atoi(argv[++i]), 1);
    } else if (a == "--out" && i + 1 < argc) {
      out_dir = argv[++i];
    } else if (a[0] != '-' && ckpt_dir.empty()) {
      ckpt_dir = a;
    } else {
      std::fprintf(stderr, kUsage);
      return 2;
    }
  }
  if (ckpt_dir.empty()) {
    std::fprintf(stderr, kUsage);
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
  std::vector<Setting> settings;
  // The floor's cats, the warmer before 2026-12-05's seventh session, its default since, that
  // with the reader waiting for it, 16 O_DIRECT reader threads.
  for (const char* t :
       {"8:c:4", "8:n:4:16:16384", "8:y:4:256:1024", "8:y:4:256:1024:wait", "0:d:16"})
    settings.push_back(parse_setting(t));
  if (!only.empty()) {
    settings.clear();
    for (size_t at = 0; at < only.size();) {
      size_t end = only.find(',', at);
      if (end == std::string::npos) end = only.size();
      settings.push_back(parse_setting(only.substr(at, end - at)));
      at = end + 1;
    }
  }
  std::vector<std::string> shards;
  for (const LayerBlob& b : blobs)
    for (const LayerBlob::Range& r : b.ranges)
      if (std::find(shards.begin(), shards.end(), r.path) == shards.end()) shards.push_back(r.path);
  std::printf("%-22s %-5s %-40s %9s %8s %s\n", "setting", "round", "pattern", "seconds", "GB/s",
              "cache");
  std::vector<std::vector<double>> rates(settings.size());
  for (int round = 1; round <= rounds; ++round) {
    for (size_t si = 0; si < settings.size(); ++si) {
      const Setting& s = settings[si];
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
      std::string pattern;
      if (s.cats) {
        pattern =
            str(s.warm.threads, " threads of whole shards in ", s.cat_bytes >> 10, " KiB reads");
        read_shards(shards, std::max(s.warm.threads, 1), s.cat_bytes);
      } else {
        std::unique_ptr<PageWarmer> warm;
        if (s.warm.threads > 0) warm = std::make_unique<PageWarmer>(blobs, 8ull << 30, s.warm);
        pattern = s.warm.threads > 0 ? describe(s.warm) : std::string("no warmer");
        pattern += str("; reader ", s.reader_threads, s.direct ? " direct" : "");
        const LayerReader reader(ckpt, s.reader_threads, s.direct);
        const std::vector<LayerBlob>& order = s.direct ? direct_blobs : blobs;
        for (size_t i = 0; i < order.size(); ++i) {
          if (warm && s.warm.consumer_waits) warm->wait_read(i);
          reader.read(order[i], buf.get());
          if (warm) warm->advance();
        }
      }
      const double sec = since(t0);
      stop = true;
      if (writer.joinable()) writer.join();
      const double rate = static_cast<double>(total) / 1e9 / sec;
      rates[si].push_back(rate);
      std::printf("%-22s %-5d %-40s %9.2f %8.2f %s\n", s.text.c_str(), round, pattern.c_str(), sec,
                  rate, cold ? "dropped" : "NOT dropped (not root?)");
      std::fflush(stdout);
    }
  }
  std::printf("median GB/s over %d round(s):\n", rounds);
  for (size_t si = 0; si < settings.size(); ++si) {
    std::vector<double> r = rates[si];
    std::sort(r.begin(), r.end());
    const double med = r.size() % 2 ? r[r.size() / 2] : (r[r.size() / 2 - 1] + r[r.size() / 2]) / 2;
    std::printf("  %-22s %6.2f\n", settings[si].text.c_str(), med);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "read_bench: %s\n", e.what());
  return 1;
}
