#include "cli/device_flag.h"

#include "core/device.h"
#include "core/error.h"

namespace strata::cli {

std::optional<bool> device_flag(const Args& args, bool visible) {
  const std::optional<std::string> dev = args.get_optional("--device");
  if (!dev) return std::nullopt;
  if (args.choice("--device", "cpu|cuda") == 0) return false;
  STRATA_CHECK(cuda_compiled(),
               "--device cuda: this strata was built without CUDA; use --device cpu");
  STRATA_CHECK(!visible || cuda_device_count() > 0, "--device cuda: ", kNoCudaDevice);
  return true;
}

bool cuda_usable() {
  return cuda_compiled() && cuda_device_count() > 0;
}

}  // namespace strata::cli
