// Contiguous chunks of an index range run on a few threads, for start-up work over every tensor
// of a checkpoint (export/plan.cpp). Not a pool: threads live for one call.
#pragma once

#include <cstddef>
#include <functional>

namespace strata {

// Runs fn(begin, end) over [0, n) cut into contiguous chunks of at least `min_chunk` indices, on
// at most `threads` threads (the caller's among them), and returns when all are done. fn must
// stop at its first failure: the exception of the lowest failing chunk is rethrown, which is the
// one a sequential loop over [0, n) would have thrown.
void parallel_chunks(size_t n, size_t threads, size_t min_chunk,
                     const std::function<void(size_t, size_t)>& fn);

// The threads such start-up work uses: the hardware's, at most 16.
size_t startup_threads();

}  // namespace strata
