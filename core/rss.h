// The process's resident set (Linux /proc/self), for the memory bound of a run
// (engine/quantize.h MemoryEstimate, docs/QUANTIZE.md "Memory and progress").
#pragma once

#include <cstdint>

namespace strata {

// Resident bytes now: /proc/self/statm's resident pages times the page size; 0 where unreadable.
uint64_t rss_bytes();
// The peak resident bytes so far: /proc/self/status VmHWM; 0 where unreadable. Unlike getrusage's
// ru_maxrss, which Linux carries across exec (a process started by a large one reports its
// parent's peak), VmHWM is this program's own.
uint64_t peak_rss_bytes();

}  // namespace strata
