// What the dev studies built on the megakernel's own pieces share (the
// loader ring, mk::consume_stages, mk::repack_stage, compiled with the
// full-size defines): the ring's names and mbarriers, the loader and
// consumer roles, the consumer warps' block barriers, a counter grid
// barrier among them, random W4A16 weights in the spec's layout with the
// spec's dequantised values for a CPU reference, host-to-device copies,
// and the host side's launch and check (the version selection, asked_for,
// is in cuda_check.h).
// Include after kernels/kimi/cuda/megakernel.cu.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "base/bf16.h"
#include "kernels/kimi/cuda/dev/cuda_check.h"

namespace study {
using mk::FEED_GROUPS;
using mk::FEED_WPG;
using mk::Smem;
using mk::Stage;
using mk::STAGES;
using mk::THREADS;
using mk::TILE;

// Thread 0 makes the ring's mbarriers (full: the loader's copy lands;
// empty: a warp group's FEED_WPG warps released the slot). The caller's
// __syncthreads then makes them visible to the block.
__device__ void init_ring(Smem* sm) {
  if (threadIdx.x != 0) return;
  for (int i = 0; i < STAGES; ++i) {
    kt_mbar_init(&sm->full[i], 1);
    kt_mbar_init(&sm->empty[i], FEED_WPG);
  }
  kt_mbar_fence_init();
}

// After the block's start: the loader warpgroup gives its registers to the
// consumers and its first thread runs `load`. True for a consumer thread.
template <class Load>
__device__ bool consumer_role(Load load) {
  if (threadIdx.x >= THREADS) {
    kt_setmaxnreg_dec<mk::kLoaderRegs>();
    if (threadIdx.x == THREADS) load();
    return false;
  }
  kt_setmaxnreg_inc<mk::kConsumerRegs>();
  return true;
}

// The consumer warps (the first mk::THREADS threads) alone; a warp group
// (mk::FEED_WPG warps, which share a stage) alone.
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(THREADS) : "memory"); }
__device__ __forceinline__ void group_sync(int group) {
  asm volatile("bar.sync %0, %1;" ::"r"(2 + group), "n"(FEED_WPG * 32) : "memory");
}

// The consumers' grid barrier, the megakernel's counter kind: round r waits
// for r arrivals from every block at *bar (zeroed before the launch).
__device__ void grid_barrier(unsigned* bar, unsigned round) {
  consumers_sync();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(bar, 1u);
    while (kt_ld_acquire(bar) < round * gridDim.x) {
    }
  }
  consumers_sync();
}

// A stack of `count` W4A16 matrices [K, N] in the spec's layout, random.
struct Stack {
  std::vector<uint8_t> q;
  std::vector<uint16_t> s, z;
  Stack(int count, int K, int N, std::mt19937& rng)
      : q(size_t(count) * K / 2 * N), s(size_t(count) * K / mk::G * N), z(s.size()) {
    std::uniform_int_distribution<int> byte(0, 255), zero(0, 15);
    std::uniform_real_distribution<float> scale(0.001f, 0.004f);
    for (auto& v : q) v = uint8_t(byte(rng));
    for (auto& v : s) v = ktune::float_to_bf16(scale(rng));
    for (auto& v : z) v = ktune::float_to_bf16(float(zero(rng)));
  }
  // Matrix c's dequantised weight [k, n], rounded as the spec says.
  double w(int c, int K, int N, int k, int n) const {
    const uint8_t b = q[(size_t(c) * K / 2 + k / 2) * N + n];
    const size_t gi = (size_t(c) * K / mk::G + k / mk::G) * N + n;
    const int qv = k % 2 ? b >> 4 : b & 15;
    return ktune::round_bf16(ktune::round_bf16(qv - ktune::bf16_to_float(z[gi])) * ktune::bf16_to_float(s[gi]));
  }
};

template <class T>
T* to_device(const std::vector<T>& v) {
  T* p;
  CHECK(cudaMalloc(&p, v.size() * sizeof(T)));
  CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

// One cooperative launch of `kernel` (a block an SM, the loader warpgroup
// included), waited for.
template <class Args>
void launch_study(void (*kernel)(Args), Args& a, int blocks, size_t smem) {
  void* params[] = {&a};
  CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(kernel), dim3(blocks), dim3(KT_BLOCK_THREADS), params, smem,
                                    nullptr));
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
}

// The CPU reference of a study's output y: each value's sum of terms, and
// of their magnitudes (what an error is counted as a share of).
struct Reference {
  std::vector<double> want, scale_of;
  explicit Reference(int n) : want(size_t(n), 0.0), scale_of(size_t(n), 0.0) {}
  void add(int n, double term) {
    want[size_t(n)] += term;
    scale_of[size_t(n)] += std::fabs(term);
  }
  // The worst error of the device's y (a non-finite value counts as 1e30).
  double worst_error(const float* y_dev) const {
    std::vector<float> y(want.size());
    CHECK(cudaMemcpy(y.data(), y_dev, y.size() * sizeof(float), cudaMemcpyDeviceToHost));
    double worst = 0;
    for (size_t n = 0; n < y.size(); ++n) {
      const double d = std::fabs(double(y[n]) - want[n]) / (scale_of[n] + 1e-30);
      worst = std::isfinite(d) ? std::max(worst, d) : 1e30;
    }
    return worst;
  }
};

// This GPU's SM count; a study that needs `need` of them (one block an SM)
// says why and exits with 2 where there are fewer.
inline int sms_at_least(int need, const char* study, const char* why) {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  if (sms < need) {
    std::fprintf(stderr, "%s: needs %d SMs (%s), this GPU has %d\n", study, need, why, sms);
    std::exit(2);
  }
  return sms;
}

}  // namespace study
