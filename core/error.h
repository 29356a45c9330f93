// Two error channels (docs/DESIGN.md "Errors").
//
// 1. Bad input -- a malformed checkpoint, an unknown key, a shape a format cannot take, a full
//    disk -- throws strata::Error through STRATA_CHECK / strata::fail. The message names the
//    file, tensor or key and says what would fix it. cli/ catches it once and exits non-zero.
// 2. A broken internal invariant is a bug in strata: STRATA_ASSERT throws strata::InternalError
//    with file and line and asks for a report. STRATA_DEBUG_ASSERT is the same, compiled out of
//    release builds, for hot loops.
//
// Both are exceptions so that destructors run and nothing is left half-written.
#pragma once

#include <cstdint>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace strata {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A write refused for want of space (ENOSPC, or EDQUOT: a quota) while writing `path`; `bytes`
// is what the refused write needed (0 when unknown). One line on its own (what()); the quantize
// engine replaces it with what the whole run still needs (docs/QUANTIZE.md "Full disk").
class DiskFullError : public Error {
 public:
  DiskFullError(std::string path, uint64_t bytes);
  const std::string& path() const { return path_; }
  uint64_t bytes() const { return bytes_; }

 private:
  std::string path_;
  uint64_t bytes_ = 0;
};

class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& what) : std::logic_error(what) {}
};

// Concatenates the arguments with operator<<: str("tensor ", name, " has ", n, " dims").
template <typename... Args>
std::string str(Args&&... args) {
  std::ostringstream os;
  if constexpr (sizeof...(Args) > 0) (os << ... << std::forward<Args>(args));
  return os.str();
}

template <typename... Args>
[[noreturn]] void fail(Args&&... args) {
  throw Error(str(std::forward<Args>(args)...));
}

// ENOSPC or EDQUOT: no room for the write.
bool is_disk_full(int err);

// For an errno `err` from writing `path`: DiskFullError when is_disk_full(err) (`bytes` what the
// write needed, 0 when unknown), otherwise Error(str(args..., strerror(err))).
template <typename... Args>
[[noreturn]] void fail_write(int err, const std::string& path, uint64_t bytes, Args&&... args) {
  if (is_disk_full(err)) throw DiskFullError(path, bytes);
  fail(std::forward<Args>(args)..., std::strerror(err));
}

namespace detail {
[[noreturn]] void assert_failed(const char* expr, const char* file, int line,
                                const std::string& msg);
}  // namespace detail

}  // namespace strata

// User-facing check: STRATA_CHECK(n > 0, "config.json: hidden_size must be positive, got ", n);
#define STRATA_CHECK(cond, ...)    \
  do {                             \
    if (!(cond)) [[unlikely]]      \
      ::strata::fail(__VA_ARGS__); \
  } while (0)

// Internal invariant: STRATA_ASSERT(offset <= size) or STRATA_ASSERT(ok, "extra ", context).
#define STRATA_ASSERT(cond, ...)                                                              \
  do {                                                                                        \
    if (!(cond)) [[unlikely]]                                                                 \
      ::strata::detail::assert_failed(#cond, __FILE__, __LINE__, ::strata::str(__VA_ARGS__)); \
  } while (0)

#ifdef NDEBUG
#define STRATA_DEBUG_ASSERT(cond, ...) \
  do {                                 \
  } while (0)
#else
#define STRATA_DEBUG_ASSERT(cond, ...) STRATA_ASSERT(cond, __VA_ARGS__)
#endif
