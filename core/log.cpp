#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>

namespace strata {
namespace {
std::atomic<LogLevel> g_level{LogLevel::kInfo};
std::mutex g_mutex;
std::string g_prefix;
LogLevel g_stderr_level = LogLevel::kDebug;
std::FILE* g_file = nullptr;

const char* level_tag(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "?";
}
}  // namespace

void log_set_level(LogLevel level) {
  g_level.store(level);
}
LogLevel log_level() {
  return g_level.load(std::memory_order_relaxed);
}

void log_write(LogLevel level, const std::string& message) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (level >= g_stderr_level)
    std::fprintf(stderr, "strata: %s%s: %s\n", g_prefix.c_str(), level_tag(level), message.c_str());
  if (g_file) {
    std::fprintf(g_file, "strata: %s%s: %s\n", g_prefix.c_str(), level_tag(level), message.c_str());
    std::fflush(g_file);
  }
}

void log_set_rank_output(const std::string& prefix, LogLevel stderr_level, std::FILE* file) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_prefix = prefix;
  g_stderr_level = stderr_level;
  g_file = file;
}

std::string format_double(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace strata
