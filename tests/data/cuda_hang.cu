// A CUDA variant that never finishes: the runner must be killed at the
// deadline, the attempt classified as a timeout, and the session go on.
#include "kernels/kimi/cuda/abi.h"
#include "kernels/kimi/cuda/common.cuh"

extern "C" {
__device__ int ktune_abi_version = KT_ABI_VERSION;
__device__ int ktune_config[KT_CONFIG_FIELDS] = {KT_D, KT_KH, KT_KD, KT_MH, KT_R, KT_NOPE, KT_ROPE, KT_VH,
                                                 KT_E, KT_TOPK, KT_NSH, KT_I, KT_G, KT_LAYERS, KT_PATTERN_M};
__device__ long long ktune_scratch_bytes = 64;
__device__ int ktune_num_launches = 1;
__device__ KtLaunch ktune_launches[1] = {{0, 1, 32, 0, 0, {{0, 0, 0, 0}}}};
}

extern "C" __global__ void ktune_k0(const __grid_constant__ KimiDeviceArgs a, const KtLaunchArgs) {
  volatile int* flag = reinterpret_cast<volatile int*>(a.scratch);
  while (*flag == 0) __nanosleep(1000);  // scratch is zeroed and nothing sets it
}

KT_KERNEL_TABLE_BEGIN
KT_KERNEL(ktune_k0)
KT_KERNEL_TABLE_END
