#include "core/parallel.h"

#include <algorithm>
#include <exception>
#include <thread>
#include <vector>

namespace strata {

void parallel_chunks(size_t n, size_t threads, size_t min_chunk,
                     const std::function<void(size_t, size_t)>& fn) {
  const size_t chunks =
      std::clamp<size_t>(n / std::max<size_t>(min_chunk, 1), 1, std::max<size_t>(threads, 1));
  if (chunks == 1) {
    if (n > 0) fn(0, n);
    return;
  }
  std::vector<std::exception_ptr> errors(chunks);
  auto run = [&](size_t c) {
    try {
      fn(n * c / chunks, n * (c + 1) / chunks);
    } catch (...) {
      errors[c] = std::current_exception();
    }
  };
  std::vector<std::thread> workers;
  workers.reserve(chunks - 1);
  for (size_t c = 1; c < chunks; ++c)
    workers.emplace_back(run, c);
  run(0);
  for (std::thread& t : workers)
    t.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

size_t startup_threads() {
  return std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 16);
}

}  // namespace strata
