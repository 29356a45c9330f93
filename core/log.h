// Logging to stderr. Levels are ordered; the threshold is set once by cli/ (--verbose, --quiet).
#pragma once

#include <cstdio>
#include <string>

#include "core/error.h"

namespace strata {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

void log_set_level(LogLevel level);
LogLevel log_level();
void log_write(LogLevel level, const std::string& message);

// `v` formatted by the printf conversion `f` (one double): format_double("%.3f", x).
std::string format_double(const char* f, double v);
// Ranks of a scaled-out run: `prefix` starts every message ("rank 1: "); messages below
// `stderr_level` skip stderr; when `file` is set every message that passes log_level() is also
// appended to it (cli: --log_dir).
void log_set_rank_output(const std::string& prefix, LogLevel stderr_level, std::FILE* file);

template <typename... Args>
void log_debug(Args&&... args) {
  if (log_level() <= LogLevel::kDebug)
    log_write(LogLevel::kDebug, str(std::forward<Args>(args)...));
}
template <typename... Args>
void log_info(Args&&... args) {
  if (log_level() <= LogLevel::kInfo) log_write(LogLevel::kInfo, str(std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(Args&&... args) {
  if (log_level() <= LogLevel::kWarn) log_write(LogLevel::kWarn, str(std::forward<Args>(args)...));
}

}  // namespace strata
