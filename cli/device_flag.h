// --device cpu|cuda, as the commands that run the forward (quantize, compare) take it.
#pragma once

#include <optional>

#include "cli/args.h"

namespace strata::cli {

// nullopt when --device is not given (the command's default applies); false for cpu; true for
// cuda once checked usable (strata built with CUDA, and unless visible is false a device
// visible: the caller then checks that itself, core/device.h kNoCudaDevice), each refusal one
// line naming what to do.
std::optional<bool> device_flag(const Args& args, bool visible = true);

// The default device when --device is not given: cuda when strata was built with CUDA and a GPU
// is visible.
bool cuda_usable();

}  // namespace strata::cli
