// How long the process has existed, for --gpu_profile's account of the time outside a run's own
// clock (process start before it; the exit after the summary: bench/gpu_bench.sh reads both).
#pragma once

namespace strata {

// Seconds since the process started (/proc/self/stat's start time, in clock ticks since boot,
// against CLOCK_BOOTTIME; a tick is 10 ms on Linux); a negative value where unreadable.
double process_age_seconds();
// CLOCK_REALTIME in seconds (what a shell's $EPOCHREALTIME reads).
double epoch_seconds();

}  // namespace strata
