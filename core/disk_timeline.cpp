#include "core/disk_timeline.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"

namespace strata {

bool process_io_bytes(uint64_t* read, uint64_t* written) {
  std::FILE* f = std::fopen("/proc/self/io", "r");
  if (!f) return false;
  char line[128];
  int found = 0;
  while (std::fgets(line, sizeof line, f)) {
    unsigned long long v = 0;
    // "read_bytes:" and "write_bytes:" (rchar and wchar count page-cache hits too).
    if (std::sscanf(line, "read_bytes: %llu", &v) == 1) {
      *read = v;
      ++found;
    } else if (std::sscanf(line, "write_bytes: %llu", &v) == 1) {
      *written = v;
      ++found;
    }
  }
  std::fclose(f);
  return found == 2;
}

using Clock = std::chrono::steady_clock;

struct DiskTimeline::Impl {
  struct Sample {
    double t;  // seconds since the timeline began
    uint64_t read, written;
  };
  double step;
  Clock::time_point t0 = Clock::now();
  std::mutex m;
  std::condition_variable cv;
  bool stop = false, readable = true;
  std::vector<Sample> samples;
  std::vector<std::pair<std::string, Sample>> marks;
  std::thread sampler;

  Sample now() {
    Sample s{std::chrono::duration<double>(Clock::now() - t0).count(), 0, 0};
    if (!process_io_bytes(&s.read, &s.written)) readable = false;
    return s;
  }
};

DiskTimeline::DiskTimeline(double step_seconds) : impl_(std::make_unique<Impl>()) {
  STRATA_ASSERT(step_seconds > 0, "a disk timeline's step must be positive");
  impl_->step = step_seconds;
  Impl& i = *impl_;
  i.samples.push_back(i.now());
  i.sampler = std::thread([&i] {
    std::unique_lock lock(i.m);
    for (size_t k = 1;; ++k) {
      const auto at = i.t0 + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(i.step * static_cast<double>(k)));
      if (i.cv.wait_until(lock, at, [&i] { return i.stop; })) return;
      i.samples.push_back(i.now());
    }
  });
}

DiskTimeline::~DiskTimeline() {
  {
    std::lock_guard lock(impl_->m);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->sampler.joinable()) impl_->sampler.join();
}

void DiskTimeline::mark(const std::string& name) {
  std::lock_guard lock(impl_->m);
  impl_->marks.emplace_back(name, impl_->now());
}

std::string DiskTimeline::finish() {
  Impl& i = *impl_;
  {
    std::lock_guard lock(i.m);
    if (i.stop) return {};
    i.stop = true;
    i.marks.emplace_back("", i.now());  // the end of the last phase
  }
  i.cv.notify_all();
  i.sampler.join();
  if (!i.readable || i.marks.size() < 2) return {};
  auto gbs = [](uint64_t bytes, double seconds) {
    return seconds > 0 ? static_cast<double>(bytes) / 1e9 / seconds : 0.0;
  };
  std::string out;
  char buf[256];
  for (size_t k = 0; k + 1 < i.marks.size(); ++k) {
    const Impl::Sample& a = i.marks[k].second;
    const Impl::Sample& b = i.marks[k + 1].second;
    std::snprintf(buf, sizeof buf,
                  "disk, %s (%.2f-%.2f s): %.2f GB read (%.2f GB/s), %.2f GB written (%.2f GB/s)\n",
                  i.marks[k].first.c_str(), a.t, b.t, static_cast<double>(b.read - a.read) / 1e9,
                  gbs(b.read - a.read, b.t - a.t), static_cast<double>(b.written - a.written) / 1e9,
                  gbs(b.written - a.written, b.t - a.t));
    out += buf;
  }
  std::string reads, writes;
  for (size_t k = 1; k < i.samples.size(); ++k) {
    const Impl::Sample& a = i.samples[k - 1];
    const Impl::Sample& b = i.samples[k];
    std::snprintf(buf, sizeof buf, " %.2f", gbs(b.read - a.read, b.t - a.t));
    reads += buf;
    std::snprintf(buf, sizeof buf, " %.2f", gbs(b.written - a.written, b.t - a.t));
    writes += buf;
  }
  std::snprintf(buf, sizeof buf, "disk GB/s each %.2g s from the start, read:", i.step);
  out += buf + reads + "\n";
  std::snprintf(buf, sizeof buf, "disk GB/s each %.2g s from the start, written:", i.step);
  out += buf + writes + "\n";
  return out;
}

}  // namespace strata
