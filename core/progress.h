// Progress of long work. On a terminal (stderr is a TTY): one bar redrawn in place with the
// rate and an ETA. Otherwise: a plain log line per step, so logs of batch jobs stay readable.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace strata {

class Progress {
 public:
  // `total` steps of `unit` ("layers"); `enabled` false prints nothing.
  Progress(std::string what, int64_t total, std::string unit, bool enabled = true);
  ~Progress();
  // One step done; `detail` is shown beside the bar ("layer 3: 2 experts without tokens").
  void step(const std::string& detail = "");
  void finish();

 private:
  std::string what_, unit_;
  int64_t total_, done_ = 0;
  bool enabled_, tty_, finished_ = false;
  std::chrono::steady_clock::time_point start_;
};

// "1h02m", "3m05s", "12s".
std::string format_duration(double seconds);

}  // namespace strata
