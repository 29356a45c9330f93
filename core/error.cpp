#include "core/error.h"

#include <cerrno>

namespace strata {

DiskFullError::DiskFullError(std::string path, uint64_t bytes)
    : Error(str("no space left on device writing ", path,
                bytes ? str(" (the write needed ", bytes, " bytes; ") : std::string(" ("),
                "free space and run the same command again)")),
      path_(std::move(path)),
      bytes_(bytes) {}

bool is_disk_full(int err) {
  return err == ENOSPC || err == EDQUOT;
}

}  // namespace strata

namespace strata::detail {

void assert_failed(const char* expr, const char* file, int line, const std::string& msg) {
  std::string text = str("internal error at ", file, ":", line, ": assertion `", expr, "` failed");
  if (!msg.empty()) text += str(" (", msg, ")");
  text += "; this is a bug in strata, please report it with the command that triggered it";
  throw InternalError(text);
}

}  // namespace strata::detail
