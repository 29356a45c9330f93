#include <cuda_runtime.h>

#include <cstdio>

#include "core/device.h"

namespace strata {

bool cuda_compiled() { return true; }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" / "no device" error
    return 0;
  }
  return n;
}

std::string cuda_device_description(int i) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%s (sm_%d%d, %.1f GiB)", prop.name, prop.major, prop.minor,
                static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

}  // namespace strata
