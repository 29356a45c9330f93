#include "core/device.h"

namespace strata {

bool cuda_compiled() { return false; }
int cuda_device_count() { return 0; }
std::string cuda_device_description(int) { return {}; }

}  // namespace strata
