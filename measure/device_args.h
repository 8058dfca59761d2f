// Filling a KimiDeviceArgs (kernels/kimi/cuda/abi.h) from host memory: the
// weights' tensors and a KimiState's buffers. Host variants and the CPU
// emulator of CUDA variants take these pointers directly; the CUDA backend
// passes `place`, which maps each host tensor to its device copy.
#pragma once
#include <functional>
#include <string>

#include "kernels/kimi/cuda/abi.h"
#include "kernels/kimi/state.h"
#include "kernels/kimi/weights.h"

namespace ktune::measure {

// Where a host tensor's bytes are for the kernel (the identity when empty).
using PlaceTensor = std::function<const void*(const void*)>;

// Weights into `a` (state pointers untouched), each pointer through `place`.
// False if the config has more layers than the ABI allows.
bool bind_weights(const kimi::KimiWeights& w, KimiDeviceArgs* a, std::string* err, const PlaceTensor& place = {});
// State buffers of `st` into `a` (S, conv windows, caches; context).
void bind_state(const kimi::KimiConfig& cfg, kimi::KimiState* st, KimiDeviceArgs* a);
// The arguments of a prepare launch (abi.h): `a`'s weights and `scratch`;
// the step's inputs, outputs, state and trace null, context 0, so a
// prepare kernel can compute nothing but a function of the weights.
KimiDeviceArgs prepare_args(const KimiDeviceArgs& a, uint8_t* scratch);

}  // namespace ktune::measure
