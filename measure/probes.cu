// Probe kernels the runner loads (built beside it as ktune_probes.cubin):
// an empty kernel (launch cost), one with the megakernel's parameters and
// nothing to do (what a step's launch itself costs), a cooperative kernel
// crossing N grid barriers (barrier cost, with the same barrier the
// megakernel uses), and a streaming read of 16-byte loads (the rate weight
// streaming can reach).
#include <stdint.h>
#include "kernels/kimi/cuda/abi.h"
#include "kernels/kimi/cuda/common.cuh"

extern "C" __global__ void ktune_probe_empty() {}

// The step kernels' parameters (KimiDeviceArgs by value, then the launch
// table's arguments), one word of them read: launched with the step's grid,
// block and shared memory, it costs what a step's launch costs and no more.
extern "C" __global__ void ktune_probe_step_launch(const __grid_constant__ KimiDeviceArgs a, const KtLaunchArgs,
                                                   unsigned* sink) {
  if (a.context == -12345 && threadIdx.x == 0) sink[0] = 1u;  // never: keeps the parameter
}

extern "C" __global__ void ktune_probe_barrier(KtGridBarrier* bar, int iterations) {
  for (int i = 0; i < iterations; ++i) kt_grid_sync<0>(bar);
}

extern "C" __global__ void ktune_probe_stream(const uint4* src, unsigned long long words, unsigned* sink) {
  unsigned acc = 0;
  for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += gridDim.x * blockDim.x) {
    uint4 v = kt_ld_weights<1>(src + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;  // keeps the loads; practically never true
}

// The megakernel's weight access, alone: every block streams 128-column
// tiles of int4 matrices (2304 rows = 1152 byte rows x 4096 columns, as
// q,k,v,g), each warp an equal share of a tile's 16-row chunks, lane
// (g, t) loading 16 bytes at byte rows t and t + 4 of each chunk, 4 chunks
// of loads in flight per warp. `contiguous` 1 lays each tile out as one
// contiguous block (a repacked layout); 0 reads the row-major [rows, N]
// matrix, 128 bytes per row. Bandwidth here against ktune_probe_stream
// tells how much of the gap is the access pattern and the loads in flight.
extern "C" __global__ void ktune_probe_tiles(const uint8_t* w, int matrices, int contiguous, unsigned* sink) {
  constexpr int kRowPairs = 1152, kN = 4096, kTiles = kN / 128, kChunks = kRowPairs / 8, kU = 4;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  unsigned acc = 0;
  for (int unit = blockIdx.x; unit < matrices * kTiles; unit += gridDim.x) {
    const uint8_t* m = w + size_t(unit / kTiles) * kRowPairs * kN;
    const int tile = unit % kTiles;
    const int c0 = kChunks * warp / warps, c1 = kChunks * (warp + 1) / warps;
    for (int c = c0; c < c1; c += kU) {
      uint4 v[2 * kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int row = (c + u < c1 ? c + u : c1 - 1) * 8 + t;
        const uint8_t* p = contiguous ? m + size_t(tile) * kRowPairs * 128 + size_t(row) * 128 + 16 * g
                                      : m + size_t(row) * kN + tile * 128 + 16 * g;
        v[2 * u] = kt_ld_weights<1>(p);
        v[2 * u + 1] = kt_ld_weights<1>(p + 4 * (contiguous ? 128 : kN));
      }
#pragma unroll
      for (int u = 0; u < 2 * kU; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}
