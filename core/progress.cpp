#include "core/progress.h"

#include <unistd.h>

#include <cstdio>

#include "core/log.h"

namespace strata {

std::string format_duration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60));
  } else if (s >= 60) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(s));
  }
  return buf;
}

Progress::Progress(std::string what, int64_t total, std::string unit, bool enabled)
    : what_(std::move(what)),
      unit_(std::move(unit)),
      total_(total),
      enabled_(enabled && log_level() <= LogLevel::kInfo),
      tty_(isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()) {}

Progress::~Progress() {
  finish();
}

void Progress::step(const std::string& detail) {
  ++done_;
  if (!enabled_) return;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double eta =
      done_ > 0 ? elapsed / static_cast<double>(done_) * static_cast<double>(total_ - done_) : 0.0;
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = total_ > 0 ? static_cast<int>(kWidth * done_ / total_) : kWidth;
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r%s [%s] %lld/%lld %s  %s elapsed, ETA %s  %s\x1b[K", what_.c_str(),
                 bar.c_str(), static_cast<long long>(done_), static_cast<long long>(total_),
                 unit_.c_str(), format_duration(elapsed).c_str(), format_duration(eta).c_str(),
                 detail.c_str());
    std::fflush(stderr);
  } else {
    log_info(what_, ": ", done_, "/", total_, " ", unit_, " (", format_duration(elapsed),
             " elapsed, ETA ", format_duration(eta), ")", detail.empty() ? "" : " " + detail);
  }
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (enabled_ && tty_ && done_ > 0) std::fputc('\n', stderr);
}

}  // namespace strata
