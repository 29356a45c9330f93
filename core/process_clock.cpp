#include "core/process_clock.h"

#include <time.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

namespace strata {

double process_age_seconds() {
  std::ifstream f("/proc/self/stat");
  std::string line;
  if (!std::getline(f, line)) return -1;
  // Field 2 (the command name) may hold spaces and parentheses: the fields after it follow the
  // last ')'. starttime is field 22, the 20th after it.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(line.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i) {
    if (!(rest >> field)) return -1;
  }
  const long ticks = sysconf(_SC_CLK_TCK);
  timespec now{};
  if (ticks <= 0 || clock_gettime(CLOCK_BOOTTIME, &now) != 0) return -1;
  const double started = std::stod(field) / static_cast<double>(ticks);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec) - started;
}

double epoch_seconds() {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

}  // namespace strata
