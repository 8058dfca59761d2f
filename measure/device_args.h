// Filling a KimiDeviceArgs (kernels/kimi/cuda/abi.h) from host memory: the
// weights' tensors and a KimiState's buffers. Host variants and the CPU
// emulator of CUDA variants take these pointers directly; the CUDA backend
// uses the same layout walk to place its device copies.
#pragma once
#include <string>

#include "kernels/kimi/cuda/abi.h"
#include "kernels/kimi/state.h"
#include "kernels/kimi/weights.h"

namespace ktune::measure {

// Weights into `a` (state pointers untouched). False if the config has more
// layers than the ABI allows.
bool bind_weights(const kimi::KimiWeights& w, KimiDeviceArgs* a, std::string* err);
// State buffers of `st` into `a` (S, conv windows, caches; context).
void bind_state(const kimi::KimiConfig& cfg, kimi::KimiState* st, KimiDeviceArgs* a);

}  // namespace ktune::measure
