// A CUDA variant with a prepare table (abi.h). Its prepare launches write
// functions of the weights into scratch; its one step launch copies scratch
// into x_out, so a test reads what prepare computed, in which order, how
// often, and what it saw. KT_TEST_PREPARE picks the prepare table:
//   0: none exported               1: two launches, k1 then k2 (the default)
//   2: a count of -1               3: KT_MAX_PREPARE + 1 entries
//   4: k1 never finishes           5: k1 writes through x_out (null then)
//   6: the second launch has a block no device runs (2048 threads)
//   7: a count of 1 and no table
// Scratch words, and the x_out elements the step copies them to:
//   [0] the sum of the first 64 bytes of layer 0's router (k1)
//   [1] how many times k1 ran since scratch was last zeroed
//   [2] how many steps ran since then (the step counts itself first)
//   [3] 2 * [0] + 1, written by k2, so it shows that k1 ran first
//   [4] 1 when k1 saw none of the step's inputs, outputs or state, else 2
#ifndef KT_TEST_PREPARE
#define KT_TEST_PREPARE 1
#endif
// KT_TEST_ABI: the ABI version it claims (an old recording's 1 or 2, a future 4).
#ifndef KT_TEST_ABI
#define KT_TEST_ABI KT_ABI_VERSION
#endif
#include "kernels/kimi/cuda/abi.h"
#include "kernels/kimi/cuda/common.cuh"

extern "C" {
__device__ int ktune_abi_version = KT_TEST_ABI;
__device__ int ktune_config[KT_CONFIG_FIELDS] = {KT_D, KT_KH, KT_KD, KT_MH, KT_R, KT_NOPE, KT_ROPE, KT_VH,
                                                 KT_E, KT_TOPK, KT_NSH, KT_I, KT_G, KT_LAYERS, KT_PATTERN_M};
__device__ long long ktune_scratch_bytes = 64;
__device__ int ktune_num_launches = 1;
__device__ KtLaunch ktune_launches[1] = {{0, 1, 32, 0, 0, {{0, 0, 0, 0}}}};
#if KT_TEST_PREPARE == 2
__device__ int ktune_num_prepare = -1;
__device__ KtLaunch ktune_prepare[1] = {{1, 1, 32, 0, 0, {{0, 0, 0, 0}}}};
#elif KT_TEST_PREPARE == 3
__device__ int ktune_num_prepare = KT_MAX_PREPARE + 1;
__device__ KtLaunch ktune_prepare[KT_MAX_PREPARE + 1] = {};
#elif KT_TEST_PREPARE == 7
__device__ int ktune_num_prepare = 1;
#elif KT_TEST_PREPARE != 0
__device__ int ktune_num_prepare = 2;
__device__ KtLaunch ktune_prepare[2] = {{1, 1, 32, 0, 0, {{0, 0, 0, 0}}},
                                        {2, -1, KT_TEST_PREPARE == 6 ? 2048 : 32, 0, 0, {{0, 0, 0, 0}}}};
#endif
}

extern "C" __global__ void ktune_k0(const __grid_constant__ KimiDeviceArgs a, const KtLaunchArgs) {
  unsigned* w = reinterpret_cast<unsigned*>(a.scratch);
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  w[2] += 1;
  for (int i = 0; i < 5; ++i) a.x_out[i] = uint16_t(w[i]);
}

extern "C" __global__ void ktune_k1(const __grid_constant__ KimiDeviceArgs a, const KtLaunchArgs) {
  unsigned* w = reinterpret_cast<unsigned*>(a.scratch);
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
#if KT_TEST_PREPARE == 4
  volatile unsigned* flag = w + 5;
  while (*flag == 0) __nanosleep(1000);  // scratch is zeroed and nothing sets it
#elif KT_TEST_PREPARE == 5
  uint16_t* volatile out = a.x_out;
  out[(1ll << 40) + threadIdx.x] = 1;  // a terabyte past nothing
#endif
  const uint8_t* router = reinterpret_cast<const uint8_t*>(a.layers[0].moe.router);
  unsigned sum = 0;
  for (int i = 0; i < 64; ++i) sum += router[i];
  w[0] = sum;
  w[1] += 1;
  bool blind = !a.x_in && !a.x_out && !a.topk_out && !a.attn_out && !a.logits_out && !a.trace && a.context == 0;
  for (int i = 0; i < KT_LAYERS; ++i)
    blind = blind && !a.layers[i].kda.S && !a.layers[i].kda.win[0] && !a.layers[i].kda.win[1] &&
            !a.layers[i].kda.win[2] && !a.layers[i].mla.c_kv && !a.layers[i].mla.k_rope;
  w[4] = blind ? 1 : 2;
}

extern "C" __global__ void ktune_k2(const __grid_constant__ KimiDeviceArgs a, const KtLaunchArgs) {
  unsigned* w = reinterpret_cast<unsigned*>(a.scratch);
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  w[3] = 2 * w[0] + 1;
}

KT_KERNEL_TABLE_BEGIN
KT_KERNEL(ktune_k0) KT_KERNEL(ktune_k1) KT_KERNEL(ktune_k2)
KT_KERNEL_TABLE_END
