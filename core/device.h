// What accelerators this process can use. The CUDA build asks the runtime; a build without CUDA
// always reports none. Narrow on purpose: the CUDA backend issue grows this into streams and
// device memory behind host-only declarations.
#pragma once

#include <string>

namespace strata {

// True when strata was built with the CUDA backend.
bool cuda_compiled();
// Number of usable CUDA devices (0 without CUDA, without a driver, or without a GPU).
int cuda_device_count();
// "NVIDIA H200 (sm_90, 139.8 GiB)" for device i, or an empty string.
std::string cuda_device_description(int i);

}  // namespace strata
