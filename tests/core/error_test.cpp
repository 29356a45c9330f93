// fail_write: a write refused for want of space (ENOSPC, EDQUOT) is a DiskFullError carrying the
// file and the bytes the write needed (the quantize engine rewords it); any other errno is a
// plain Error ending in the system's description of it.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "core/error.h"

namespace strata {
namespace {

TEST(FailWrite, NoSpaceIsDiskFull) {
  for (int err : {ENOSPC, EDQUOT}) {
    try {
      fail_write(err, "/out/model-00002-of-00003.safetensors", 4096, "/out/.x.partial: write: ");
      FAIL() << "no exception";
    } catch (const DiskFullError& e) {
      EXPECT_EQ(e.path(), "/out/model-00002-of-00003.safetensors");
      EXPECT_EQ(e.bytes(), 4096u);
      EXPECT_STREQ(e.what(),
                   "no space left on device writing /out/model-00002-of-00003.safetensors (the "
                   "write needed 4096 bytes; free space and run the same command again)");
    }
  }
}

TEST(FailWrite, OtherErrorsNameTheirCause) {
  try {
    fail_write(EIO, "/out/a.json", 10, "/out/a.json: write failed: ");
    FAIL() << "no exception";
  } catch (const DiskFullError&) {
    FAIL() << "EIO is not a full disk";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              std::string("/out/a.json: write failed: ") + std::strerror(EIO));
  }
  EXPECT_FALSE(is_disk_full(EFBIG));
  EXPECT_TRUE(is_disk_full(ENOSPC));
}

}  // namespace
}  // namespace strata
