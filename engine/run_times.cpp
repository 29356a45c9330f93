#include "engine/run_times.h"

#include <cstdio>
#include <utility>
#include <vector>

namespace strata {
namespace {

std::string secs(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", s);
  return b;
}

// "T s = name a + name b + ... + other c": the parts that took time, then what they leave.
std::string sum_line(double total, const std::vector<std::pair<std::string, double>>& parts) {
  std::string out = secs(total) + " s =";
  double known = 0;
  const char* sep = " ";
  for (const auto& [name, s] : parts) {
    if (s < 0.005) continue;
    out += sep + name + " " + secs(s);
    known += s;
    sep = " + ";
  }
  if (total - known >= 0.005) out += sep + std::string("other ") + secs(total - known);
  return out;
}

}  // namespace

std::string RunTimes::describe() const {
  std::string out = "time " +
                    sum_line(total, {{"startup", startup},
                                     {"calibration data", calib_data},
                                     {"export head", head},
                                     {"embedding", embedding},
                                     {"GPU setup", device_setup},
                                     {"layers", layers},
                                     {"finish", finish}}) +
                    "\n";
  if (layers > 0) {
    out +=
        "layers " +
        sum_line(layers, {{"waiting for weights", read_wait},
                          {"computing", compute},
                          {"quantizing weights on the GPU", quantize},
                          {"waiting for the writer", writer_wait},
                          {"hidden states for resume (" + std::to_string(hidden_write_count) + "x)",
                           hidden_writes},
                          {"commits (fsync, manifest)", commit}});
    if (writer_busy > 0) {
      out += "; writer thread busy " + secs(writer_busy) + " s";
      if (writer_write > 0 || writer_sync > 0)
        out += " (writing " + secs(writer_write) + ", fsync " + secs(writer_sync) + ")";
      if (writeback > 0)
        out += "; writeback requests on their own thread " + secs(writeback) + " s";
    }
    out += "\n";
  }
  if (head_done_at > 0)
    out += "export head on its own thread: written " + secs(head_write) +
           " s, synced and recorded " + secs(head_commit) + " s, done " + secs(head_done_at) +
           " s after the run's start; the loop waited " + secs(head_wait) + " s for it\n";
  return out;
}

}  // namespace strata
