#include "core/error.h"

namespace strata::detail {

void assert_failed(const char* expr, const char* file, int line, const std::string& msg) {
  std::string text = str("internal error at ", file, ":", line, ": assertion `", expr, "` failed");
  if (!msg.empty()) text += str(" (", msg, ")");
  text += "; this is a bug in strata, please report it with the command that triggered it";
  throw InternalError(text);
}

}  // namespace strata::detail
