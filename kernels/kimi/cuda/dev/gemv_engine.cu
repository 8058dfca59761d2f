// The megakernel's W4A16 GEMV engine, alone: numbered versions of how a
// warp streams its share of a weight tile, each checked against a CPU
// reference and timed the same way. It answers one question outside the
// megakernel's register budget and barriers: how many bytes per second can
// each way of keeping loads in flight reach, for one phase (a single
// q,k,v,g-sized GEMV, as in a K layer) and in the steady state (many).
//
//   v0  plain stream of the same bytes (the bandwidth reference)
//   v1  the megakernel's register path: KT_UNROLL chunks of loads per batch,
//       a batch's loads issued after the previous batch is computed, a
//       group's scales fetched when the warp enters the group
//   v2  a per-lane ring in shared memory: each lane cp.asyncs its own 32
//       bytes per chunk RING chunks ahead, and its group's scales one group
//       ahead, and reads back only what it copied itself, so no barrier
//       (each lane's wait_group is enough) and few registers; MODE bits
//       try it without compute, as if repacked, without scales, and with
//       the warps' chunks interleaved
//   v3  bulk copies (cp.async.bulk, completion on an mbarrier) into a
//       block-wide ring of quantization groups, one 8-KB copy per stage
//       from a repacked layout or one 128-byte copy per row as stored
//   v4  v1 with the item's rows prefetched into L2 (all at the item's start,
//       or D chunks ahead; prefetch.global.L2 or bulk prefetches)
//   v5  v1 software-pipelined: two register buffers, the next batch's loads
//       issued before the current batch is computed; NOLOAD times the
//       compute alone
//   v6  v5 with each group's scales fetched one group ahead
//   v7  v6 with fewer instructions per chunk (one LOP3 per nibble pair,
//       scales and zeros kept two columns per word)
//   v8  v6's compute fed by each warp's own ring of bulk copies from a
//       repacked, swizzled tile-contiguous layout (127 registers)
//   v9  v7 from a fragment-native repacked layout: each lane's 32 bytes of
//       a chunk contiguous, nibbles placed so that a pair is one shift and
//       one LOP3 (no PRMT)
//   v10 a sequence of phases (one K layer's q,k,v,g, o_proj, MoE gate/up and
//       down, 4 layers) in one launch with grid barriers: a loader warp
//       streams every phase's stages (a tile's group, 8.5 KB, repacked)
//       into a shared-memory ring by bulk copies, running ahead across the
//       barriers; consumer warps compute the stages already there
//   v11 v10 with a lean consumer: Q chunks of a stage per warp, no division
//       in the loop, warp-private tile sums (no shared float atomics);
//       MODE 6 times the consumers alone (no copies, waits or grid
//       barriers), DEQ 1-8 probe which part of a chunk's arithmetic bounds
//       them (wgmma instead of mma.sync among them; not checked)
//
// What it showed on the H200 (RESULTS.md, 2026-11-30, runs 17-21, 27 and
// 31-37): for one q,k,v,g-sized phase (20 MB) v1 takes ~18 us against 10
// us for the plain stream with as few warps; loads alone are not the limit:
// - the compute alone (v5 without loads) takes 12 us: the chunk loop runs
//   at ~0.4 instructions per cycle per scheduler with 2 warps each (ncu),
//   and waits one DRAM round trip per quantization group for its scales;
// - fetching scales a group ahead (v6) takes the phase to 14.3 us and the
//   steady state from 1.43 to 1.9 TB/s; v7's leaner dequant takes the
//   compute alone from 10.3 to 9.2 us but not the phase (its loads are
//   scheduled later);
// - the per-lane cp.async ring stops at ~2.2 TB/s whatever its depth or
//   layout, even without compute; bulk copies of a repacked layout deliver
//   3.6 TB/s without compute (v3 is slow only for its consumer: every warp
//   expands a group's scales for one chunk); L2 prefetches do not help;
// - v8 (run 43): correct, but the phase takes 15.9 us at its best ring
//   shape (3 x 8 KB) against v6's 14.5; only the steady state gains (2.24
//   against 1.87 TB/s), so the per-warp ring pays for itself only on long
//   items. The megakernel took v7's dequant instead (runs 44-46).
// - v11 (runs 104-109): the 16-phase sequence (235.6 MB, barriers
//   included) in 118.4 us at Q 2, against ~216 us for the megakernel's GEMV
//   phases; after the first phase every phase finds its weights already in
//   shared memory, and the consumers are bound by issue (16 warps no
//   faster than 8). v10 was 2.4x slower: shared-memory float atomics
//   compile to contended compare-and-swap loops.
// - v11 MODE 6 (runs 129-132, 2026-12-01): the consumers alone take 80 us
//   for the 16 phases at 8, 12 or 16 warps; ncu puts the ALU pipe (shift,
//   LOP3) and the FMA-heavy pipe (bf16 subtract, multiply) at 43-51% of
//   their half-rate peaks each, issue at 54-61%. Without any dequant
//   arithmetic: 66 us; wgmma instead of mma.sync: 90 us (slower).
//
// Build and run (sm_90a; on the device machine): CMake builds it as
// build/gemv_engine where it finds the CUDA toolkit, or by hand
//   nvcc -gencode arch=compute_90a,code=sm_90a -O3 -std=c++17 -I. -o /tmp/gemv_engine kernels/kimi/cuda/dev/gemv_engine.cu
// then run it with no arguments for every version, or with name prefixes
// ("v9" "v7 U2"; "v11 Q2" for the sequences) for those only
// (scripts/device_pack.sh carries it).
// Weights use the spec's layout ([K/2, N] bytes, scales and zeros
// [K/128, N] bf16); x is bf16, y is fp32 (one partial per k-split).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "base/bf16.h"
#include "kernels/kimi/cuda/common.cuh"
#include "kernels/kimi/cuda/dev/cuda_check.h"

constexpr int TILE = 128, CHUNK = 16, GROUP_CHUNKS = 8;

struct Problem {
  const uint8_t* wq;    // M matrices, each [K/2, N]
  const uint16_t* sc;   // M x [K/128, N]
  const uint16_t* ze;
  const uint16_t* x;    // [K]
  float* y;             // [M][S][N] partials
  int M, K, N, S;
  unsigned long long* span;  // per block: first start, last end (globaltimer)
  const uint8_t* wrep = nullptr;  // v8: the same weights repacked (repack_for_v8)
  const uint8_t* wfrag = nullptr; // v9: the same weights repacked (repack_for_v9)
};

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Packed scale and zero pairs of a lane's 16 columns from their raw bf16.
__device__ __forceinline__ void expand(const uint4 (&s)[2], const uint4 (&z)[2], uint32_t (&ss)[16],
                                       uint32_t (&zz)[16]) {
#pragma unroll
  for (int b = 0; b < 16; ++b) {
    const uint32_t sw = word_of(s[b / 8], (b % 8) / 2), zw = word_of(z[b / 8], (b % 8) / 2);
    const uint32_t sb = (b & 1) ? (sw >> 16) : (sw & 0xffffu);
    const uint32_t zb = kt_f2bf(128.0f + kt_bf2f(uint16_t((b & 1) ? (zw >> 16) : (zw & 0xffffu))));
    ss[b] = sb | (sb << 16);
    zz[b] = zb | (zb << 16);
  }
}

// The raw scales and zeros of the lane group's 16 columns at group grp
// (soff: the matrix's scale offset of the lane group's first column).
__device__ __forceinline__ void load_group_scales(const Problem& p, size_t soff, int grp, uint4 (&s)[2],
                                                  uint4 (&z)[2]) {
  const uint16_t* sp = p.sc + soff + size_t(grp) * p.N;
  const uint16_t* zp = p.ze + soff + size_t(grp) * p.N;
  s[0] = kt_ld_weights<1>(sp);
  s[1] = kt_ld_weights<1>(sp + 8);
  z[0] = kt_ld_weights<1>(zp);
  z[1] = kt_ld_weights<1>(zp + 8);
}

// One chunk (16 rows x the lane's 16 columns at k-pairs t, t+4) into the mma
// accumulators; B column 0 holds x (bf16), the others zero. dequant(word,
// shifted, byte, column) gives the bf16 pair of that byte of a 4-byte word
// (shifted = word >> 4) for the lane's column 0..15: the versions differ
// only there.
template <class Dequant>
__device__ __forceinline__ void chunk_mma_with(const uint4& wa, const uint4& wb, const uint32_t* xs, int lc,
                                               float (&acc)[8][4], Dequant dequant) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  uint32_t b[2] = {g == 0 ? xs[lc * 8 + t] : 0u, g == 0 ? xs[lc * 8 + t + 4] : 0u};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int wi = j >> 1, b0 = (j & 1) * 2;
    const uint32_t A = word_of(wa, wi), B = word_of(wb, wi), As = A >> 4, Bs = B >> 4;
    uint32_t a[4] = {dequant(A, As, b0, 2 * j), dequant(A, As, b0 + 1, 2 * j + 1), dequant(B, Bs, b0, 2 * j),
                     dequant(B, Bs, b0 + 1, 2 * j + 1)};
    kt_mma_bf16(acc[j], a, b);
  }
}
__device__ __forceinline__ void chunk_mma(const uint4& wa, const uint4& wb, const uint32_t (&ss)[16],
                                          const uint32_t (&zz)[16], const uint32_t* xs, int lc,
                                          float (&acc)[8][4]) {
  chunk_mma_with(wa, wb, xs, lc, acc, [&](uint32_t w, uint32_t ws, int byte, int col) {
    return kt_dequant_pair(kt_nibble_pair(w, ws, byte), zz[col], ss[col]);
  });
}

// The warp's sums for its 16 columns, written as this split's partial
// (lanes t == 0 hold them after the mma: d[0] + d[1] is column 2j, etc.).
__device__ __forceinline__ void store_partial(const Problem& p, int m, int tile, int split,
                                              float (&acc)[8][4], float* red) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  if (t == 0)
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      red[warp * TILE + 16 * g + 2 * j] = acc[j][0] + acc[j][1];
      red[warp * TILE + 16 * g + 2 * j + 1] = acc[j][2] + acc[j][3];
    }
  __syncthreads();
  if (threadIdx.x < TILE) {
    float y = 0;
    for (int w = 0; w < warps; ++w) y += red[w * TILE + threadIdx.x];
    p.y[(size_t(m) * p.S + split) * p.N + tile * TILE + threadIdx.x] = y;
  }
  __syncthreads();
}

__device__ __forceinline__ void stamp_span(const Problem& p, bool start) {
  if (threadIdx.x == 0) p.span[2 * blockIdx.x + (start ? 0 : 1)] = kt_globaltimer();
}

// Stages x as packed bf16 pairs in shared memory.
__device__ __forceinline__ void stage_x(const Problem& p, uint32_t* xs) {
  for (int i = threadIdx.x; i < p.K / 2; i += blockDim.x) xs[i] = reinterpret_cast<const uint32_t*>(p.x)[i];
  __syncthreads();
}

// ---- v0: the same bytes, plainly streamed ----------------------------------------
// L loads in flight per thread (4; 8 and 16 ask whether the plain stream at
// 8 warps reaches the bandwidth once each thread keeps more bytes in flight).
template <int L = 4>
__global__ void v0_stream(Problem p) {
  stamp_span(p, true);
  const size_t words = size_t(p.M) * p.K / 2 * p.N / 16;
  const uint4* src = reinterpret_cast<const uint4*>(p.wq);
  unsigned acc = 0;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  for (; i + (L - 1) * stride < words; i += L * stride) {
    uint4 v[L];
#pragma unroll
    for (int u = 0; u < L; ++u) v[u] = kt_ld_weights<1>(src + i + u * stride);
#pragma unroll
    for (int u = 0; u < L; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < words; i += stride) {
    const uint4 v = kt_ld_weights<1>(src + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) p.y[0] = float(acc);
  stamp_span(p, false);
}

// ---- v1: the register path (PF 0); v4: with the item's rows prefetched into L2 --
// v4 is v1 plus prefetches that put many more bytes in flight than the registers
// hold: the loads then find their lines in L2 (or on their way there).
// PF 1: at the item's start each warp prefetches all its rows (and its
// groups' scales), prefetch.global.L2 at both 64-byte halves of each
// 128-byte row; PF 2: the same with one 128-byte bulk prefetch per row;
// PF 3: bulk prefetches D chunks ahead of the loads (the first D at the
// start); PF 4: as 3 with prefetch.global.L2.
template <int PF>
__device__ __forceinline__ void prefetch_row(const uint8_t* row) {
  if (PF == 1 || PF == 4) {
    kt_prefetch_l2(row);
    kt_prefetch_l2(row + 64);
  } else {
    kt_prefetch_l2_bulk(row, 128);
  }
}
template <int U, int PF = 0, int D = 8>
__global__ void v1_registers(Problem p) {
  extern __shared__ __align__(16) unsigned char smem[];
  uint32_t* xs = reinterpret_cast<uint32_t*>(smem);
  float* red = reinterpret_cast<float*>(smem + p.K * 2);
  stamp_span(p, true);
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int tiles = p.N / TILE, nch = p.K / CHUNK;
  bool staged = false;
  for (int it = blockIdx.x; it < p.M * tiles * p.S; it += gridDim.x) {
    const int m = it / (tiles * p.S), tile = it / p.S % tiles, split = it % p.S;
    const int kc0 = split * nch / p.S, kc1 = (split + 1) * nch / p.S;
    const int c0 = kc0 + (kc1 - kc0) * warp / warps, c1 = kc0 + (kc1 - kc0) * (warp + 1) / warps;
    const uint8_t* tw = p.wq + size_t(m) * (p.K / 2) * p.N + tile * TILE;  // the tile's row 0
    const size_t tso = size_t(m) * (p.K / 128) * p.N + tile * TILE;
    if (PF) {  // prefetches first, before x is staged, so they overlap it
      const int r1 = (PF <= 2 ? c1 : min(c1, c0 + D)) * 8;
      for (int r = c0 * 8 + lane; r < r1; r += 32) prefetch_row<PF>(tw + size_t(r) * p.N);
      if (c0 < c1)
        for (int q = c0 / GROUP_CHUNKS + lane / 4; q <= (c1 - 1) / GROUP_CHUNKS; q += 8) {
          const uint16_t* base = (lane & 2 ? p.ze : p.sc) + tso + size_t(q) * p.N + (lane & 1) * 64;
          kt_prefetch_l2_bulk(base, 128);
        }
    }
    if (!staged) {
      stage_x(p, xs);
      staged = true;
    }
    const uint8_t* w = tw + 16 * g;
    const size_t soff = tso + 16 * g;
    float acc[8][4] = {};
    uint32_t ss[16], zz[16];
    int cur = -1;
    uint4 wa[U], wb[U];
    auto load = [&](int l) {
      if (PF >= 3 && lane < 8 * U) {  // v4, rolling: D chunks ahead
        const int r = (l + D) * 8 + lane;
        if (r < c1 * 8) prefetch_row<PF>(tw + size_t(r) * p.N);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int lc = l + u < c1 ? l + u : c1 - 1;
        wa[u] = kt_ld_weights<1>(w + size_t(lc * 8 + t) * p.N);
        wb[u] = kt_ld_weights<1>(w + size_t(lc * 8 + t + 4) * p.N);
      }
    };
    if (c0 < c1) load(c0);
    for (int l = c0; l < c1; l += U) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int lc = l + u;
        if (lc >= c1) break;
        if (lc / GROUP_CHUNKS != cur) {
          cur = lc / GROUP_CHUNKS;
          uint4 sv[2], zv[2];
          load_group_scales(p, soff, cur, sv, zv);
          expand(sv, zv, ss, zz);
        }
        chunk_mma(wa[u], wb[u], ss, zz, xs, lc, acc);
      }
      if (l + U < c1) load(l + U);
    }
    store_partial(p, m, tile, split, acc, red);
  }
  stamp_span(p, false);
}

// ---- v5: the register path, software-pipelined ---------------------------------
// v1 with two register buffers: batch i + 1's loads are issued before batch
// i is computed, so a warp's compute overlaps its next loads instead of
// following them. NOLOAD 1 replaces the loads with values made from the
// chunk index (results unchecked): the compute's own time. The kernel is
// v6_scales_ahead's with AHEAD false (below); v5_load is its batch of loads.
template <int U, bool NOLOAD, bool FRAG = false>
__device__ __forceinline__ void v5_load(const uint8_t* w, int N, int l, int c1, int t, uint4 (&wa)[U],
                                        uint4 (&wb)[U]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int lc = l + u < c1 ? l + u : c1 - 1;
    if (NOLOAD) {
      const uint32_t h = uint32_t(lc) * 2654435761u ^ uint32_t(t);
      wa[u] = make_uint4(h, h * 3u, h * 5u, h * 7u);
      wb[u] = make_uint4(h * 11u, h * 13u, h * 17u, h * 19u);
    } else if (FRAG) {  // w: the lane's 32 bytes of the tile's chunk 0 (v9)
      wa[u] = kt_ld_weights<1>(w + size_t(lc) * 1024);
      wb[u] = kt_ld_weights<1>(w + size_t(lc) * 1024 + 16);
    } else {
      wa[u] = kt_ld_weights<1>(w + size_t(lc * 8 + t) * N);
      wb[u] = kt_ld_weights<1>(w + size_t(lc * 8 + t + 4) * N);
    }
  }
}
// ---- v6: v5 with each group's scales fetched one group ahead ---------------------
// In v1 and v5 a warp entering a quantization group loads its scales and
// zeros and waits for them: one dependent round trip to DRAM per group, in
// the middle of the chunk loop (v5 without weight loads still took 12 us
// for the q,k,v,g phase for that reason). Here the raw scales of group q + 1
// are loaded when group q is entered (16 more registers), so only the
// item's first group waits. NOLOAD 2: no weight loads and no scale loads
// (the dequant and mma alone). The kernel, v6_scales_ahead, follows v7's
// helpers: with LEAN it is v7.
// ---- v7: v6 with fewer instructions per chunk --------------------------------------
// Two savings on the dequant, same results bit for bit:
// - the nibble pair's mask-and-bias, (t & 0x000f000f) | 0x43004300, is one
//   LOP3 only when the bias is in a register (a LOP3 takes one immediate);
//   ptxas folds a literal into two LOP3s, so the bias is read from a global
//   it cannot see through (one register for the whole kernel);
// - scales and zeros stay as loaded, two columns per word: the bf16 ops
//   take either half of a word broadcast (.H0_H0 / .H1_H1), so a group
//   needs 8 HADD2s for its zeros + 128 instead of expanding 32 registers.
__device__ uint32_t g_bias_pair = 0x43004300u;  // bf16 (128, 128); written nowhere else

// The exact dequant of a nibble pair with the zero and scale of column half
// `odd` of the words zz2, ss2 (odd is known at compile time once unrolled).
__device__ __forceinline__ uint32_t dequant_half(uint32_t pair, uint32_t zz2, uint32_t ss2, bool odd) {
  return odd ? kt_dequant_half<1>(pair, zz2, ss2) : kt_dequant_half<0>(pair, zz2, ss2);
}

// zr[j] = (128 + z) of the lane's columns 2j, 2j+1; sr[j] their scales.
__device__ __forceinline__ void chunk_mma_lean(const uint4& wa, const uint4& wb, const uint32_t (&sr)[8],
                                               const uint32_t (&zr)[8], uint32_t bias, const uint32_t* xs, int lc,
                                               float (&acc)[8][4]) {
  chunk_mma_with(wa, wb, xs, lc, acc, [&](uint32_t w, uint32_t ws, int byte, int col) {
    const uint32_t pair = kt_nibble_pair(w, ws, byte, bias), z = zr[col / 2], sc = sr[col / 2];
    return dequant_half(pair, z, sc, col & 1);
  });
}
// ---- v9: v7 from a fragment-native layout ------------------------------------------
// v7 spends 2.25 integer-pipe instructions per nibble pair (a PRMT brings a
// byte's two nibbles to the two halves, a LOP3 masks and biases, and a
// shift per word), and the integer pipe issues a warp instruction every
// other cycle. The spec allows a repack at load: here a lane's 32 bytes of
// a chunk are contiguous ([M][tile][chunk][lane][32 bytes], repack_for_v9)
// and word j holds mma j's four A registers, a[r] as nibbles r and r + 4,
// so a[r] = ((word >> 4r) & 0x000f000f) | bias: 7 integer instructions per
// word instead of 9. UMULHI: the shifts as __umulhi by a power of two (an
// IMAD.HI, issued by the FMA pipe), to unload the integer pipe further.
// DEQ (timing probes of v11 MODE 6, not checked: which part of the
// arithmetic bounds the compute alone): 0 the exact dequant (HADD2 + HMUL2,
// bf16); 1 the multiply alone; 2 one HFMA2 in place of both; 3 no
// arithmetic (the nibble pairs straight into the mma); 4 the same two
// operations in fp16; 7 the exact dequant without the mma (the registers
// folded by XOR instead); 8 neither.
template <bool UMULHI, int DEQ = 0>
__device__ __forceinline__ void chunk_mma_frag(const uint4& wa, const uint4& wb, const uint32_t (&sr)[8],
                                               const uint32_t (&zr)[8], uint32_t bias, const uint32_t* xs, int lc,
                                               float (&acc)[8][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  uint32_t b[2] = {g == 0 ? xs[lc * 8 + t] : 0u, g == 0 ? xs[lc * 8 + t + 4] : 0u};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const uint32_t w = word_of(j < 4 ? wa : wb, j & 3);
    uint32_t a[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const uint32_t sh = r == 0 ? w : UMULHI ? __umulhi(w, 1u << (32 - 4 * r)) : w >> (4 * r);
      const uint32_t pair = (sh & 0x000f000fu) | bias;
      if (DEQ == 0 || DEQ == 7) {
        a[r] = dequant_half(pair, zr[j], sr[j], r & 1);
      } else if (DEQ == 1) {
        a[r] = kt_hmul2(pair, sr[j]);
      } else if (DEQ == 2) {
        __nv_bfloat162 r2 = __hfma2(*reinterpret_cast<const __nv_bfloat162*>(&pair),
                                    *reinterpret_cast<const __nv_bfloat162*>(&sr[j]),
                                    *reinterpret_cast<const __nv_bfloat162*>(&zr[j]));
        a[r] = *reinterpret_cast<uint32_t*>(&r2);
      } else if (DEQ == 4) {
        __half2 r2 = __hmul2(__hsub2(*reinterpret_cast<const __half2*>(&pair), *reinterpret_cast<const __half2*>(&zr[j])),
                             *reinterpret_cast<const __half2*>(&sr[j]));
        a[r] = *reinterpret_cast<uint32_t*>(&r2);
      } else {  // 3, 8
        a[r] = pair;
      }
    }
    if (DEQ == 7 || DEQ == 8)
      acc[j][0] = __uint_as_float(__float_as_uint(acc[j][0]) ^ a[0] ^ a[1] ^ a[2] ^ a[3] ^ b[j & 1]);
    else
      kt_mma_bf16(acc[j], a, b);
  }
}

// DEQ 5 and 6 (v11 MODE 6 only, timing probes): a warpgroup's stage by
// wgmma instead of mma.sync. The 4 warps of a group each give 16 rows
// (output columns) of a m64n8k16 A from registers; B (x, k-major, 8-k core
// matrices 32 bytes apart so that rows 2-7 overlap the next block: only
// columns 0-1 are read back) comes from shared memory by descriptor. A lane
// dequantizes 16 words a stage (4 registers each, one wgmma each), as many
// as mma.sync's Q 2. DEQ 5: no arithmetic (the nibble pairs as they are);
// 6: the exact dequant.
__device__ __forceinline__ uint64_t wgmma_desc_x(uint32_t saddr) {
  return uint64_t((saddr & 0x3ffff) >> 4) | (uint64_t(32 >> 4) << 16) | (uint64_t(256 >> 4) << 32);
}
__device__ __forceinline__ void wgmma_m64n8k16(float (&d)[4], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, 1, 1, 1, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
template <int DEQ>
__device__ __forceinline__ void stage_wgmma_probe(const unsigned char* st, int wi, uint32_t bias, uint32_t xs_s, int lc0,
                                                  float (&d)[2][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2;
  uint4 w4[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) w4[q] = *reinterpret_cast<const uint4*>(st + wi * 2048 + q * 512 + lane * 16);
  const uint2 sv = *reinterpret_cast<const uint2*>(st + 8192 + 16 * g);
  const uint2 zv = *reinterpret_cast<const uint2*>(st + 8192 + 256 + 16 * g);
  const uint32_t sr[2] = {sv.x, sv.y}, zr[2] = {zv.x, zv.y};
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    uint32_t a[2][4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t w = word_of(w4[(2 * c + h) / 4], (2 * c + h) % 4);
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const uint32_t pair = ((r == 0 ? w : w >> (4 * r)) & 0x000f000fu) | bias;
        a[h][r] = DEQ == 5 ? pair : dequant_half(pair, zr[h], sr[h], r & 1);
      }
    }
    wgmma_fence();
    const uint64_t desc = wgmma_desc_x(xs_s + uint32_t(lc0 + c) * 64);
    wgmma_m64n8k16(d[0], a[0], desc);
    wgmma_m64n8k16(d[1], a[1], desc);
    wgmma_commit();
    wgmma_wait<1>();
  }
}

// LEAN: v7 (above) instead of v6's expanded scales and literal bias.
// AHEAD false: v5 (each group's scales loaded when the group is entered).
// FRAG (with LEAN): v9, from p.wfrag; 2 with the shifts as __umulhi.
template <int U, int NOLOAD = 0, bool LEAN = false, bool AHEAD = true, int FRAG = 0>
__global__ void v6_scales_ahead(Problem p) {
  extern __shared__ __align__(16) unsigned char smem[];
  uint32_t* xs = reinterpret_cast<uint32_t*>(smem);
  float* red = reinterpret_cast<float*>(smem + p.K * 2);
  stamp_span(p, true);
  stage_x(p, xs);
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int tiles = p.N / TILE, nch = p.K / CHUNK;
  for (int it = blockIdx.x; it < p.M * tiles * p.S; it += gridDim.x) {
    const int m = it / (tiles * p.S), tile = it / p.S % tiles, split = it % p.S;
    const int kc0 = split * nch / p.S, kc1 = (split + 1) * nch / p.S;
    const int c0 = kc0 + (kc1 - kc0) * warp / warps, c1 = kc0 + (kc1 - kc0) * (warp + 1) / warps;
    const uint8_t* w = FRAG ? p.wfrag + (size_t(m) * tiles + tile) * nch * 1024 + lane * 32
                            : p.wq + size_t(m) * (p.K / 2) * p.N + tile * TILE + 16 * g;
    const size_t soff = size_t(m) * (p.K / 128) * p.N + tile * TILE + 16 * g;
    const int last_group = (c1 - 1) / GROUP_CHUNKS;
    uint4 next_s[2], next_z[2];
    auto load_scales = [&](int grp) {
      if (NOLOAD == 2) {
        next_s[0] = next_s[1] = make_uint4(0x3c003c00u ^ grp, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u);
        next_z[0] = next_z[1] = make_uint4(0x41004100u, 0x41004100u, 0x41004100u, 0x41004100u ^ grp);
        return;
      }
      load_group_scales(p, soff, min(grp, last_group), next_s, next_z);
    };
    float acc[8][4] = {};
    uint32_t ss[16], zz[16];  // v6: per column, expanded
    uint32_t sr[8], zr[8];    // v7: two columns per word
    const uint32_t bias = LEAN ? g_bias_pair : 0u;
    int cur = -1;
    auto compute = [&](int l, const uint4(&wa)[U], const uint4(&wb)[U]) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int lc = l + u;
        if (lc >= c1) break;
        if (lc / GROUP_CHUNKS != cur) {
          cur = lc / GROUP_CHUNKS;
          if (!AHEAD) load_scales(cur);  // v5: waited for right here
          if (LEAN) {
#pragma unroll
            for (int i = 0; i < 8; ++i) {
              sr[i] = word_of(next_s[i / 4], i % 4);
              const uint32_t zw = word_of(next_z[i / 4], i % 4);
              const __nv_bfloat162 z2 = __hadd2(*reinterpret_cast<const __nv_bfloat162*>(&zw),
                                                *reinterpret_cast<const __nv_bfloat162*>(&bias));
              zr[i] = *reinterpret_cast<const uint32_t*>(&z2);
            }
          } else {
            expand(next_s, next_z, ss, zz);
          }
          if (AHEAD) load_scales(cur + 1);
        }
        if (FRAG)
          chunk_mma_frag<FRAG == 2>(wa[u], wb[u], sr, zr, bias, xs, lc, acc);
        else if (LEAN)
          chunk_mma_lean(wa[u], wb[u], sr, zr, bias, xs, lc, acc);
        else
          chunk_mma(wa[u], wb[u], ss, zz, xs, lc, acc);
      }
    };
    uint4 wa0[U], wb0[U], wa1[U], wb1[U];
    if (c0 < c1) {
      if (AHEAD) load_scales(c0 / GROUP_CHUNKS);
      v5_load<U, NOLOAD != 0, FRAG != 0>(w, p.N, c0, c1, t, wa0, wb0);
    }
    for (int l = c0; l < c1; l += 2 * U) {
      if (l + U < c1) v5_load<U, NOLOAD != 0, FRAG != 0>(w, p.N, l + U, c1, t, wa1, wb1);
      compute(l, wa0, wb0);
      if (l + U >= c1) break;
      if (l + 2 * U < c1) v5_load<U, NOLOAD != 0, FRAG != 0>(w, p.N, l + 2 * U, c1, t, wa0, wb0);
      compute(l + U, wa1, wb1);
    }
    store_partial(p, m, tile, split, acc, red);
  }
  stamp_span(p, false);
}

// ---- v2: a per-lane ring in shared memory ----------------------------------------
// Slot layout: ring[slot][thread] holds the lane's two 16-byte pieces of a
// chunk; scales[gslot][thread] its 16 columns' raw scales and zeros (64
// bytes) for a group. A chunk's copies are one commit group; the scales of
// the group a chunk opens ride in that chunk's commit group.
// MODE (experiments; results then are not checked unless said): bit 0
// skips the compute (the chunk is only read back), bit 1 reads the weights
// as if repacked tile-contiguous ([tile][K/2][128 bytes]), bit 2 copies no
// scales, bit 3 interleaves the warps' chunks (warp w takes chunks w, w +
// warps, ... of the item, so a block reads consecutive rows together and
// all blocks the same rows; checked).
__host__ __device__ constexpr int ring_group_slots(int ring, int mode) { return mode & 8 ? ring + 1 : ring / GROUP_CHUNKS + 2; }
template <int RING, int MODE = 0>
__global__ void v2_ring(Problem p) {
  constexpr int GSLOTS = ring_group_slots(RING, MODE);
  constexpr bool interleaved = MODE & 8, contiguous = MODE & 2;
  extern __shared__ __align__(16) unsigned char smem[];
  uint32_t* xs = reinterpret_cast<uint32_t*>(smem);
  float* red = reinterpret_cast<float*>(smem + p.K * 2);
  uint4* ring = reinterpret_cast<uint4*>(smem + p.K * 2 + (blockDim.x / 32) * TILE * 4);
  uint4* gsc = ring + RING * 2 * blockDim.x;
  stamp_span(p, true);
  stage_x(p, xs);
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int tiles = p.N / TILE, nch = p.K / CHUNK;
  uint4* mine = ring + threadIdx.x;       // slot s, piece h at mine[(2 s + h) * blockDim.x]
  uint4* my_sc = gsc + threadIdx.x;       // group slot q, piece h (s0 s1 z0 z1) at my_sc[(4 q + h) * blockDim.x]
  for (int it = blockIdx.x; it < p.M * tiles * p.S; it += gridDim.x) {
    const int m = it / (tiles * p.S), tile = it / p.S % tiles, split = it % p.S;
    const int kc0 = split * nch / p.S, kc1 = (split + 1) * nch / p.S;
    // The warp's chunks: chunk(i) for i in [0, n).
    const int c0 = interleaved ? kc0 + warp : kc0 + (kc1 - kc0) * warp / warps;
    const int n = interleaved ? (kc1 - kc0 - warp + warps - 1) / warps : kc0 + (kc1 - kc0) * (warp + 1) / warps - c0;
    const int step = interleaved ? warps : 1;
    const uint8_t* w = p.wq + size_t(m) * (p.K / 2) * p.N + (contiguous ? size_t(tile) * (p.K / 2) * TILE : tile * TILE) + 16 * g;
    const size_t rs = contiguous ? TILE : p.N;  // bytes from one packed row to the next
    const size_t soff = size_t(m) * (p.K / 128) * p.N + tile * TILE + 16 * g;
    auto issue = [&](int i) {  // chunk i's copies (and its group's scales when it opens one)
      if (i < n) {
        const int lc = c0 + i * step, s = i % RING;
        kt_cp_async16(&mine[(2 * s) * blockDim.x], w + size_t(lc * 8 + t) * rs, true);
        kt_cp_async16(&mine[(2 * s + 1) * blockDim.x], w + size_t(lc * 8 + t + 4) * rs, true);
        if (!(MODE & 4) && (i == 0 || lc / GROUP_CHUNKS != (lc - step) / GROUP_CHUNKS)) {
          const int grp = lc / GROUP_CHUNKS, q = (interleaved ? i : grp) % GSLOTS;
          const uint16_t* s0 = p.sc + soff + size_t(grp) * p.N;
          const uint16_t* z0 = p.ze + soff + size_t(grp) * p.N;
          kt_cp_async16(&my_sc[(4 * q + 0) * blockDim.x], s0, true);
          kt_cp_async16(&my_sc[(4 * q + 1) * blockDim.x], s0 + 8, true);
          kt_cp_async16(&my_sc[(4 * q + 2) * blockDim.x], z0, true);
          kt_cp_async16(&my_sc[(4 * q + 3) * blockDim.x], z0 + 8, true);
        }
      }
      kt_cp_async_commit();
    };
    float acc[8][4] = {};
    uint32_t ss[16], zz[16];
    int cur = -1;
#pragma unroll
    for (int r = 0; r < RING - 1; ++r) issue(r);
    for (int i = 0; i < n; ++i) {
      issue(i + RING - 1);
      kt_cp_async_wait<RING - 1>();
      const int lc = c0 + i * step, s = i % RING;
      const uint4 wa = mine[(2 * s) * blockDim.x], wb = mine[(2 * s + 1) * blockDim.x];
      if (lc / GROUP_CHUNKS != cur) {
        cur = lc / GROUP_CHUNKS;
        const int q = (interleaved ? i : cur) % GSLOTS;
        uint4 sv[2] = {my_sc[(4 * q) * blockDim.x], my_sc[(4 * q + 1) * blockDim.x]};
        uint4 zv[2] = {my_sc[(4 * q + 2) * blockDim.x], my_sc[(4 * q + 3) * blockDim.x]};
        expand(sv, zv, ss, zz);
      }
      if (MODE & 1)
        acc[0][0] += __uint_as_float((wa.x ^ wa.y ^ wa.z ^ wa.w ^ wb.x ^ wb.y ^ wb.z ^ wb.w) & 0x3fffffffu);
      else
        chunk_mma(wa, wb, ss, zz, xs, lc, acc);
    }
    kt_cp_async_wait<0>();
    store_partial(p, m, tile, split, acc, red);
  }
  stamp_span(p, false);
}

// ---- v3: bulk copies (the copy engine) into a block-wide ring of groups ----------
// One stage is one quantization group of the tile (64 packed rows x 128
// bytes, plus its 128 scales and zeros). Thread 0 fills stage i + NST - 1
// with bulk copies completing on full[slot] (an mbarrier with a byte count)
// once every warp has released that slot (empty[slot]); warp w computes
// chunk w of each stage. CONTIG 1: weights repacked tile-contiguous, one
// 8-KB copy per stage (rows unpadded); CONTIG 0: the spec's layout, one
// 128-byte copy per row into rows padded to 160 bytes (no bank conflicts).
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbar_init(uint64_t* b, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(b)), "r"(count));
}
__device__ __forceinline__ void mbar_expect(uint64_t* b, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, unsigned parity) {
  asm volatile(
      "{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}" ::"r"(
          smem_addr(b)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

template <int NST, int CONTIG, bool NOCOMP = false>
__global__ void v3_bulk(Problem p) {
  constexpr int ROW = CONTIG ? TILE : 160, WBYTES = 64 * ROW, STAGE = WBYTES + 512;
  extern __shared__ __align__(16) unsigned char smem[];
  uint32_t* xs = reinterpret_cast<uint32_t*>(smem);
  float* red = reinterpret_cast<float*>(smem + p.K * 2);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + p.K * 2 + (blockDim.x / 32) * TILE * 4);
  uint64_t* empty = full + NST;
  unsigned char* ring = reinterpret_cast<unsigned char*>(empty + NST);
  ring += (128 - (smem_addr(ring) & 127)) & 127;
  stamp_span(p, true);
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (threadIdx.x == 0) {
    for (int i = 0; i < NST; ++i) {
      mbar_init(&full[i], 1);
      mbar_init(&empty[i], warps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  stage_x(p, xs);  // its __syncthreads also publishes the barriers
  const int tiles = p.N / TILE, ngr = p.K / 128;
  unsigned fills = 0, uses = 0;  // stages filled and consumed so far by this block (ring position)
  for (int it = blockIdx.x; it < p.M * tiles * p.S; it += gridDim.x) {
    const int m = it / (tiles * p.S), tile = it / p.S % tiles, split = it % p.S;
    const int g0 = split * ngr / p.S, g1 = (split + 1) * ngr / p.S, n = g1 - g0;
    const uint8_t* wbase = p.wq + size_t(m) * (p.K / 2) * p.N;
    const size_t sbase = size_t(m) * (p.K / 128) * p.N + tile * TILE;
    auto fill = [&](int i) {  // thread 0: group g0 + i into the next ring slot
      const unsigned slot = fills % NST, round = fills / NST;
      if (round > 0) mbar_wait(&empty[slot], (round - 1) & 1);
      unsigned char* st = ring + slot * STAGE;
      const int grp = g0 + i;
      mbar_expect(&full[slot], WBYTES / ROW * 128 + 512);
      if (CONTIG) {
        bulk_copy(st, wbase + size_t(tile) * (p.K / 2) * TILE + size_t(grp) * 64 * TILE, 64 * TILE, &full[slot]);
      } else {
        for (int r = 0; r < 64; ++r)
          bulk_copy(st + r * ROW, wbase + size_t(grp * 64 + r) * p.N + tile * TILE, 128, &full[slot]);
      }
      bulk_copy(st + WBYTES, p.sc + sbase + size_t(grp) * p.N, 256, &full[slot]);
      bulk_copy(st + WBYTES + 256, p.ze + sbase + size_t(grp) * p.N, 256, &full[slot]);
      ++fills;
    };
    if (threadIdx.x == 0)
      for (int i = 0; i < NST - 1 && i < n; ++i) fill(i);
    float acc[8][4] = {};
    for (int i = 0; i < n; ++i) {
      if (threadIdx.x == 0 && i + NST - 1 < n) fill(i + NST - 1);
      const unsigned slot = uses % NST, round = uses / NST;
      mbar_wait(&full[slot], round & 1);
      const unsigned char* st = ring + slot * STAGE;
      if (NOCOMP) {  // the copies' delivery rate alone
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[slot]);
        ++uses;
        continue;
      }
      const uint16_t* sc = reinterpret_cast<const uint16_t*>(st + WBYTES);
      uint4 sv[2] = {reinterpret_cast<const uint4*>(sc + 16 * g)[0], reinterpret_cast<const uint4*>(sc + 16 * g)[1]};
      uint4 zv[2] = {reinterpret_cast<const uint4*>(sc + 128 + 16 * g)[0],
                     reinterpret_cast<const uint4*>(sc + 128 + 16 * g)[1]};
      uint32_t ss[16], zz[16];
      expand(sv, zv, ss, zz);
      for (int j = warp; j < 8; j += warps) {
        const uint4 wa = *reinterpret_cast<const uint4*>(st + (j * 8 + t) * ROW + 16 * g);
        const uint4 wb = *reinterpret_cast<const uint4*>(st + (j * 8 + t + 4) * ROW + 16 * g);
        chunk_mma(wa, wb, ss, zz, xs, (g0 + i) * 8 + j, acc);
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[slot]);
      ++uses;
    }
    // Thread 0 stays in step: its fill count already matches (it filled n stages).
    store_partial(p, m, tile, split, acc, red);
  }
  stamp_span(p, false);
}

// ---- v8: each warp its own ring of bulk copies, from a repacked layout ------------
// v6's compute (scales a group ahead in registers) fed from shared memory:
// each warp streams its chunk range with bulk copies (cp.async.bulk, one
// per stage of SC chunks = SC KB, completion on the stage's mbarrier) NST
// stages ahead. No registers hold loads in flight and no other warp is
// waited for: the warp that reads a stage refills it. Bulk copies need
// each stage contiguous, so the weights are repacked (once, as an upload
// would): tile-contiguous, [M][tile][K/2 rows][128 bytes], and within each
// 128-byte row the 16-byte piece of lane group g stored at g ^ (2 (r & 3)),
// so that the 8 lanes of a shared-memory phase (g in {2i, 2i+1}, t 0..3)
// read 8 different bank groups.
__host__ __device__ constexpr int v8_piece(int g, int row) { return g ^ ((row & 3) << 1); }

template <int NST, int SC>
__global__ void v8_warp_ring(Problem p) {
  extern __shared__ __align__(16) unsigned char smem[];
  uint32_t* xs = reinterpret_cast<uint32_t*>(smem);
  float* red = reinterpret_cast<float*>(smem + p.K * 2);
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + p.K * 2 + warps * TILE * 4) + warp * NST;
  unsigned char* ring = smem + p.K * 2 + warps * TILE * 4 + warps * NST * 8;
  ring += (128 - (smem_addr(ring) & 127)) & 127;
  ring += size_t(warp) * NST * SC * 1024;
  stamp_span(p, true);
  if (lane == 0) {
    for (int i = 0; i < NST; ++i) mbar_init(&full[i], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  stage_x(p, xs);  // its __syncthreads also publishes the barriers
  const int tiles = p.N / TILE, nch = p.K / CHUNK;
  unsigned fills = 0, uses = 0;  // this warp's stages issued and consumed so far
  for (int it = blockIdx.x; it < p.M * tiles * p.S; it += gridDim.x) {
    const int m = it / (tiles * p.S), tile = it / p.S % tiles, split = it % p.S;
    const int kc0 = split * nch / p.S, kc1 = (split + 1) * nch / p.S;
    const int c0 = kc0 + (kc1 - kc0) * warp / warps, c1 = kc0 + (kc1 - kc0) * (warp + 1) / warps;
    const uint8_t* tw = p.wrep + (size_t(m) * tiles + tile) * (p.K / 2) * TILE;  // the tile's row 0
    const size_t soff = size_t(m) * (p.K / 128) * p.N + tile * TILE + 16 * g;
    const int nst = (c1 - c0 + SC - 1) / SC;
    auto issue = [&](int s) {  // lane 0: stage s of this warp's range into the next slot
      const int cs = c0 + s * SC, n = min(SC, c1 - cs);
      const unsigned slot = fills++ % NST;
      mbar_expect(&full[slot], n * 1024);
      bulk_copy(ring + slot * SC * 1024, tw + size_t(cs) * 1024, n * 1024, &full[slot]);
    };
    if (lane == 0)
      for (int s = 0; s < NST && s < nst; ++s) issue(s);
    const int last_group = (c1 - 1) / GROUP_CHUNKS;
    uint4 next_s[2], next_z[2];
    auto load_scales = [&](int grp) {
      load_group_scales(p, soff, min(grp, last_group), next_s, next_z);
    };
    if (c0 < c1) load_scales(c0 / GROUP_CHUNKS);
    float acc[8][4] = {};
    uint32_t ss[16], zz[16];
    int cur = -1;
    const int piece = v8_piece(g, t) * 16;  // rows t and t + 4 share it
    for (int s = 0; s < nst; ++s) {
      const unsigned k = uses++, slot = k % NST;
      mbar_wait(&full[slot], (k / NST) & 1);
      const unsigned char* st = ring + slot * SC * 1024;
      const int cs = c0 + s * SC, n = min(SC, c1 - cs);
      for (int i = 0; i < n; ++i) {
        const int lc = cs + i;
        if (lc / GROUP_CHUNKS != cur) {
          cur = lc / GROUP_CHUNKS;
          expand(next_s, next_z, ss, zz);
          load_scales(cur + 1);
        }
        const uint4 wa = *reinterpret_cast<const uint4*>(st + i * 1024 + t * TILE + piece);
        const uint4 wb = *reinterpret_cast<const uint4*>(st + i * 1024 + (t + 4) * TILE + piece);
        chunk_mma(wa, wb, ss, zz, xs, lc, acc);
      }
      __syncwarp();  // every lane has read the stage
      if (lane == 0 && s + NST < nst) {
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // reads before the copy's writes
        issue(s + NST);
      }
    }
    store_partial(p, m, tile, split, acc, red);
  }
  stamp_span(p, false);
}

// The host side of v8's layout, for matrices [M][K/2][N].
static void repack_for_v8(const uint8_t* src, uint8_t* dst, int M, int K, int N) {
  const int tiles = N / TILE;
  for (int m = 0; m < M; ++m)
    for (int tile = 0; tile < tiles; ++tile)
      for (int r = 0; r < K / 2; ++r) {
        const uint8_t* row = src + (size_t(m) * (K / 2) + r) * N + tile * TILE;
        uint8_t* out = dst + ((size_t(m) * tiles + tile) * (K / 2) + r) * TILE;
        for (int gg = 0; gg < 8; ++gg) std::memcpy(out + v8_piece(gg, r) * 16, row + gg * 16, 16);
      }
}

// The host side of v9's layout, for matrices [M][K/2][N]: lane (g, t)'s
// word j of chunk c holds, as nibbles r and r + 4, the two k of a[r] of
// mma j: column 16 g + 2 j + (r & 1), k = 16 c + 2 t + 8 (r >> 1) + {0, 1}.
static void repack_for_v9(const uint8_t* src, uint8_t* dst, int M, int K, int N) {
  const int tiles = N / TILE, nch = K / CHUNK;
  for (int m = 0; m < M; ++m)
    for (int tile = 0; tile < tiles; ++tile)
      for (int c = 0; c < nch; ++c)
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane >> 2, t = lane & 3;
          uint32_t* out = reinterpret_cast<uint32_t*>(dst + (((size_t(m) * tiles + tile) * nch + c) * 32 + lane) * 32);
          for (int j = 0; j < 8; ++j) {
            uint32_t w = 0;
            for (int r = 0; r < 4; ++r) {
              const int n = tile * TILE + 16 * g + 2 * j + (r & 1), kp = 8 * c + t + 4 * (r >> 1);  // k pair
              const uint8_t byte = src[(size_t(m) * (K / 2) + kp) * N + n];
              w |= uint32_t(byte & 15) << (4 * r) | uint32_t(byte >> 4) << (4 * r + 16);
            }
            out[j] = w;
          }
        }
}

// ---- v10: a step's GEMV phases in one launch, a loader warp streaming across them --
// v1-v9 time one phase from an empty pipe: every phase pays its first DRAM
// round trip, its ramp and its tail, and inside the megakernel ~22 phases
// per step pay them in series, each after a grid barrier. Weights do not
// depend on the activations, so nothing forces that: here one loader warp
// per block streams the block's stages of every phase of the sequence
// (bulk copies, one 8.5-KB copy per stage, completion on the slot's
// mbarrier) into a ring of NS slots, and runs ahead across the grid
// barriers as far as the ring allows; CW consumer warps stage each phase's
// x after the barrier, then compute the stages already in shared memory.
// A stage is one quantization group of one 128-column tile, repacked once
// (repack_for_v10): 8 chunks of v9's fragment-native layout, each chunk's
// 16-byte halves stored half-major so a warp's two LDS.128 hit 32 distinct
// banks, then the group's 128 scales and 128 (128 + zero)s as bf16. A
// phase's stages (tile-major) are cut into 132 contiguous ranges, one per
// block; warp w of warp group v (w % 8, w / 8) computes chunk w % 8 of the
// range's stages v, v + CW / 8, ...; sums go to a tile accumulator in
// shared memory (shared atomics) and, at the phase's end, to y (global
// atomics: a tile can span two blocks' ranges). NOCOMP: consumers only wait
// for and release the stages (the stream's own rate across the barriers).
struct SeqPhase {
  const uint8_t* stages;  // [tiles][K / 128][V10_STAGE]
  const uint16_t* x;      // [K] bf16
  float* y;               // [N], zeroed before the launch
  int K, N;
};
constexpr int V10_MAX_PHASES = 20, V10_STAGE = 8 * 1024 + 512, V10_TILES_PER_RANGE = 4;
struct Sequence {
  SeqPhase ph[V10_MAX_PHASES];
  int nph;
  unsigned* bar;              // grid barrier arrivals (zeroed before the launch)
  unsigned long long* span;   // per block: start, end; then block 0's time after each phase's barrier
};

__device__ __forceinline__ void named_sync(int threads) { asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory"); }

// The end of phase p for the CT consumer threads: a grid barrier (an
// arrival counter; y complete everywhere before the next phase, whose x in
// a real step would be this y), then block 0 stamps the time. GRID false:
// the stamp only (what the barriers cost).
template <int CT, bool GRID = true>
__device__ __forceinline__ void sequence_phase_end(const Sequence& q, int p) {
  named_sync(CT);
  if (threadIdx.x == 0) {
    if (GRID) {
      __threadfence();
      atomicAdd(q.bar, 1u);
      const unsigned target = unsigned(p + 1) * gridDim.x;
      while (kt_ld_acquire(q.bar) < target) {
      }
    }
    if (blockIdx.x == 0) q.span[2 * gridDim.x + p] = kt_globaltimer();
  }
  named_sync(CT);
}

// A phase's stages for this block: [s0, s1) of the phase's tiles x groups
// stages (tile-major), cut into gridDim.x contiguous ranges.
struct PhaseRange {
  int groups, s0, s1, tile0;
};
__device__ __forceinline__ PhaseRange phase_range(const SeqPhase& ph) {
  PhaseRange r;
  r.groups = ph.K / 128;
  const int total = ph.N / TILE * r.groups;
  r.s0 = blockIdx.x * total / gridDim.x;
  r.s1 = (blockIdx.x + 1) * total / gridDim.x;
  r.tile0 = r.s0 / r.groups;
  return r;
}

// The start of a phase for the CT consumer threads: x staged as packed bf16
// pairs.
template <int CT>
__device__ __forceinline__ PhaseRange sequence_phase_begin(const SeqPhase& ph, uint32_t* xs) {
  for (int i = threadIdx.x; i < ph.K / 2; i += CT) xs[i] = reinterpret_cast<const uint32_t*>(ph.x)[i];
  named_sync(CT);
  return phase_range(ph);
}

// The shared memory of v10 and v11, set up by every block before its warps
// split into the loader and the consumers: x (9216 / 2 words at most), the
// tile sums ([rows][V10_TILES_PER_RANGE][TILE], zeroed), the ring's full
// and empty mbarriers (NS each; a full completes when the loader's copy
// lands, an empty after empty_count consumer warps release the slot), and
// the ring, 128-byte aligned. Thread 0 also stamps the block's start.
struct SequenceSmem {
  uint32_t* xs;
  float* tacc;
  uint64_t* full;
  uint64_t* empty;
  unsigned char* ring;
};
template <int NS>
__device__ __forceinline__ SequenceSmem sequence_smem(unsigned char* smem, int tacc_rows, unsigned empty_count,
                                                      const Sequence& q) {
  SequenceSmem m;
  m.xs = reinterpret_cast<uint32_t*>(smem);
  m.tacc = reinterpret_cast<float*>(smem + 9216 * 2);
  m.full = reinterpret_cast<uint64_t*>(m.tacc + tacc_rows * V10_TILES_PER_RANGE * TILE);
  m.empty = m.full + NS;
  m.ring = reinterpret_cast<unsigned char*>(m.empty + NS);
  m.ring += (128 - (smem_addr(m.ring) & 127)) & 127;
  if (threadIdx.x == 0) {
    q.span[2 * blockIdx.x] = kt_globaltimer();
    for (int i = 0; i < NS; ++i) {
      mbar_init(&m.full[i], 1);
      mbar_init(&m.empty[i], empty_count);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  for (int i = threadIdx.x; i < tacc_rows * V10_TILES_PER_RANGE * TILE; i += blockDim.x) m.tacc[i] = 0;
  __syncthreads();
  return m;
}

template <int NS, int CW, bool NOCOMP = false>
__global__ void __launch_bounds__(CW * 32 + 32, 1) v10_sequence(const __grid_constant__ Sequence q) {
  static_assert(CW % 8 == 0, "consumer warps come in groups of 8, one per chunk of a stage");
  constexpr int NG = CW / 8, CT = CW * 32;
  extern __shared__ __align__(16) unsigned char smem[];
  const SequenceSmem m = sequence_smem<NS>(smem, 1, 8, q);
  uint32_t* xs = m.xs;
  float* tacc = m.tacc;
  uint64_t *full = m.full, *empty = m.empty;
  unsigned char* ring = m.ring;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5;
  if (warp == CW) {  // the loader
    if (lane == 0) {
      unsigned n = 0;
      for (int p = 0; p < q.nph; ++p) {
        const SeqPhase& ph = q.ph[p];
        const PhaseRange r = phase_range(ph);
        for (int s = r.s0; s < r.s1; ++s, ++n) {
          const unsigned slot = n % NS;
          if (n >= NS) mbar_wait(&empty[slot], (n / NS - 1) & 1);
          mbar_expect(&full[slot], V10_STAGE);
          bulk_copy(ring + slot * V10_STAGE, ph.stages + size_t(s) * V10_STAGE, V10_STAGE, &full[slot]);
        }
      }
    }
    return;
  }
  const int cw = warp % 8, grp_of_warps = warp / 8;
  const uint32_t bias = g_bias_pair;
  unsigned n = 0;  // the block's stage count so far (the loader's n)
  for (int p = 0; p < q.nph; ++p) {
    const SeqPhase& ph = q.ph[p];
    const PhaseRange r = sequence_phase_begin<CT>(ph, xs);
    const int groups = r.groups, s0 = r.s0, s1 = r.s1, tile0 = r.tile0;
    float acc[8][4] = {};
    int cur_tile = -1;
    auto flush = [&]() {
      if (cur_tile < 0 || NOCOMP) return;
      if (t == 0) {
        float* row = tacc + (cur_tile - tile0) * TILE + 16 * g;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          atomicAdd(row + 2 * j, acc[j][0] + acc[j][1]);
          atomicAdd(row + 2 * j + 1, acc[j][2] + acc[j][3]);
        }
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0;
    };
    for (int s = s0; s < s1; ++s, ++n) {
      if ((s - s0) % NG != grp_of_warps) continue;
      const int tile = s / groups, grp = s % groups;
      if (tile != cur_tile) {
        flush();
        cur_tile = tile;
      }
      const unsigned slot = n % NS;
      mbar_wait(&full[slot], (n / NS) & 1);
      if (!NOCOMP) {
        const unsigned char* st = ring + slot * V10_STAGE;
        const uint4 wa = *reinterpret_cast<const uint4*>(st + cw * 1024 + lane * 16);
        const uint4 wb = *reinterpret_cast<const uint4*>(st + cw * 1024 + 512 + lane * 16);
        const uint4* sv = reinterpret_cast<const uint4*>(st + 8192 + 32 * g);
        const uint4* zv = reinterpret_cast<const uint4*>(st + 8192 + 256 + 32 * g);
        const uint4 s_lo = sv[0], s_hi = sv[1], z_lo = zv[0], z_hi = zv[1];
        const uint32_t sr[8] = {s_lo.x, s_lo.y, s_lo.z, s_lo.w, s_hi.x, s_hi.y, s_hi.z, s_hi.w};
        const uint32_t zr[8] = {z_lo.x, z_lo.y, z_lo.z, z_lo.w, z_hi.x, z_hi.y, z_hi.z, z_hi.w};
        chunk_mma_frag<false>(wa, wb, sr, zr, bias, xs, grp * GROUP_CHUNKS + cw, acc);
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[slot]);
    }
    flush();
    named_sync(CT);  // every warp's sums are in tacc, every thread is done with xs
    const int ntiles = s1 > s0 ? (s1 - 1) / groups - tile0 + 1 : 0;
    for (int i = threadIdx.x; i < ntiles * TILE; i += CT) {
      if (!NOCOMP) atomicAdd(ph.y + size_t(tile0) * TILE + i, tacc[i]);
      tacc[i] = 0;
    }
    sequence_phase_end<CT>(q, p);
  }
  if (threadIdx.x == 0) q.span[2 * blockIdx.x + 1] = kt_globaltimer();
}

// ---- v11: v10 with a lean consumer, Q chunks of a stage per warp --------------------
// v10's consumer ran ~320 instructions per chunk (ncu, run 105): a division
// per stage to find its tile, 88 register moves around the accumulators
// (the per-stage tile check merged two paths into the mma's), the shared
// addresses of the mbarriers rebuilt at every wait, and one chunk per wait
// (nothing for the scheduler to overlap). Here a warp walks its stages tile
// by tile (no division in the loop), keeps the ring position as a slot and
// a parity, reads the barriers by 32-bit shared addresses, and computes Q
// chunks of each stage it takes (8 / Q warps share a stage; the CW / (8 /
// Q) warp groups take the range's stages in turn), so Q chunks' chains
// interleave and the group's scales are read once per Q chunks.
__device__ __forceinline__ void mbar_wait_s(uint32_t bar, unsigned parity) {
  asm volatile(
      "{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void mbar_arrive_s(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

template <int NS, int CW, int Q, int MODE = 0, int DEQ = 0>
__global__ void __launch_bounds__(CW * 32 + 32, 1) v11_sequence(const __grid_constant__ Sequence q) {
  static_assert(8 % Q == 0 && CW % (8 / Q) == 0, "Q divides a stage's 8 chunks; whole warp groups");
  constexpr int WPS = 8 / Q, NG = CW / WPS, CT = CW * 32;
  // NOCOMP: the stream alone; NOLOAD: no copies, no waits (the compute
  // alone); NOGRID: no grid barriers (each block runs its phases back to
  // back, x staged as before: what the barriers cost). MODE 4: the stream
  // alone without grid barriers (the copies' own rate); MODE 5: the same
  // with each stage copied in PIECES bulk copies (whether a copy's fixed
  // cost bounds the rate). MODE 6: the compute alone without grid barriers
  // (the consumers' own rate, for comparing warp counts and Q).
  constexpr bool NOCOMP = MODE == 1 || MODE == 4 || MODE == 5, NOLOAD = MODE == 2 || MODE == 6,
                 NOGRID = MODE == 3 || MODE >= 4;
  constexpr int PIECES = MODE == 5 ? 4 : 1;
  static_assert(NG < NS, "ring");
  extern __shared__ __align__(16) unsigned char smem[];
  const SequenceSmem m = sequence_smem<NS>(smem, CW, WPS, q);  // a row of tile sums per consumer warp
  uint32_t* xs = m.xs;
  float* tacc = m.tacc;
  uint64_t* full = m.full;
  unsigned char* ring = m.ring;
  const uint32_t full_s = smem_addr(m.full), empty_s = smem_addr(m.empty);
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5;
  if (warp == CW) {  // the loader, as v10's
    if (lane == 0 && !NOLOAD) {
      unsigned slot = 0, parity = 0, n = 0;
      for (int p = 0; p < q.nph; ++p) {
        const SeqPhase& ph = q.ph[p];
        const PhaseRange r = phase_range(ph);
        for (int s = r.s0; s < r.s1; ++s, ++n) {
          if (n >= NS) mbar_wait_s(empty_s + 8 * slot, parity ^ 1);
          mbar_expect(&full[slot], V10_STAGE);
          for (int k = 0; k < PIECES; ++k)
            bulk_copy(ring + slot * V10_STAGE + k * (V10_STAGE / PIECES),
                      ph.stages + size_t(s) * V10_STAGE + k * (V10_STAGE / PIECES), V10_STAGE / PIECES, &full[slot]);
          if (++slot == NS) {
            slot = 0;
            parity ^= 1;
          }
        }
      }
    }
    return;
  }
  const int wg = warp / WPS, wi = warp % WPS;
  const uint32_t bias = g_bias_pair;
  unsigned slot = wg, parity = 0;  // the ring position of this warp's next stage
  for (int p = 0; p < q.nph; ++p) {
    const SeqPhase& ph = q.ph[p];
    const PhaseRange r = sequence_phase_begin<CT>(ph, xs);
    const int groups = r.groups, s0 = r.s0, s1 = r.s1, tile0 = r.tile0;
    int s = s0 + wg;
    while (s < s1) {
      const int tile = s / groups, tile_end = min(s1, (tile + 1) * groups);
      float acc[8][4] = {};
      float wacc[2][4] = {};
      for (; s < tile_end; s += NG) {
        if (!NOLOAD) mbar_wait_s(full_s + 8 * slot, parity);
        if (!NOCOMP) {
          const unsigned char* st = ring + slot * V10_STAGE;
          const uint4* sv = reinterpret_cast<const uint4*>(st + 8192 + 32 * g);
          const uint4* zv = reinterpret_cast<const uint4*>(st + 8192 + 256 + 32 * g);
          const uint4 s_lo = sv[0], s_hi = sv[1], z_lo = zv[0], z_hi = zv[1];
          const uint32_t sr[8] = {s_lo.x, s_lo.y, s_lo.z, s_lo.w, s_hi.x, s_hi.y, s_hi.z, s_hi.w};
          const uint32_t zr[8] = {z_lo.x, z_lo.y, z_lo.z, z_lo.w, z_hi.x, z_hi.y, z_hi.z, z_hi.w};
          const int lc0 = (s - tile * groups) * GROUP_CHUNKS + wi * Q;
          uint4 wa[Q], wb[Q];
#pragma unroll
          for (int c = 0; c < Q; ++c) {
            wa[c] = *reinterpret_cast<const uint4*>(st + (wi * Q + c) * 1024 + lane * 16);
            wb[c] = *reinterpret_cast<const uint4*>(st + (wi * Q + c) * 1024 + 512 + lane * 16);
          }
          if constexpr (DEQ == 5 || DEQ == 6) {
            stage_wgmma_probe<DEQ>(st, wi, bias, smem_addr(xs), s - tile * groups, wacc);
          } else {
#pragma unroll
            for (int c = 0; c < Q; ++c) chunk_mma_frag<false, DEQ>(wa[c], wb[c], sr, zr, bias, xs, lc0 + c, acc);
          }
        }
        __syncwarp();
        if (lane == 0 && !NOLOAD) mbar_arrive_s(empty_s + 8 * slot);
        slot += NG;
        if (slot >= NS) {
          slot -= NS;
          parity ^= 1;
        }
      }
      if constexpr (DEQ == 5 || DEQ == 6) {
        wgmma_wait<0>();
        acc[0][0] += wacc[0][0] + wacc[0][1] + wacc[0][2] + wacc[0][3];
        acc[1][0] += wacc[1][0] + wacc[1][1] + wacc[1][2] + wacc[1][3];
      }
      if (!NOCOMP && t == 0) {
        // The warp's own row: no atomics (v10's shared-memory float atomics
        // are compare-and-swap loops, contended by every warp of the tile).
        float* row = tacc + (warp * V10_TILES_PER_RANGE + tile - tile0) * TILE + 16 * g;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          row[2 * j] += acc[j][0] + acc[j][1];
          row[2 * j + 1] += acc[j][2] + acc[j][3];
        }
      }
    }
    {
      // slot points at the block position of stage s, where the walk stopped
      // (s >= s1); the next phase's first stage for this group is wg
      // positions after this phase's last, i.e. wg - (s - s1) from here.
      const int delta = wg - (s - s1);
      int ns = int(slot) + delta;
      unsigned np = parity;
      while (ns < 0) {
        ns += NS;
        np ^= 1;
      }
      while (ns >= NS) {
        ns -= NS;
        np ^= 1;
      }
      slot = unsigned(ns);
      parity = np;
    }
    named_sync(CT);
    const int ntiles = s1 > s0 ? (s1 - 1) / groups - tile0 + 1 : 0;
    for (int i = threadIdx.x; i < ntiles * TILE; i += CT) {
      float sum = 0;
#pragma unroll 4
      for (int w = 0; w < CW; ++w) {
        sum += tacc[w * V10_TILES_PER_RANGE * TILE + i];
        tacc[w * V10_TILES_PER_RANGE * TILE + i] = 0;
      }
      if (!NOCOMP) atomicAdd(ph.y + size_t(tile0) * TILE + i, sum);
    }
    sequence_phase_end<CT, !NOGRID>(q, p);
  }
  if (threadIdx.x == 0) q.span[2 * blockIdx.x + 1] = kt_globaltimer();
}

// The host side of v10's stages for one matrix [K/2][N] with its scales and
// zeros [K/128][N]: dst holds [N/128 tiles][K/128 groups][V10_STAGE].
static void repack_for_v10(const uint8_t* w, const uint16_t* sc, const uint16_t* ze, int K, int N, uint8_t* dst) {
  const int tiles = N / TILE, groups = K / 128;
  for (int tile = 0; tile < tiles; ++tile)
    for (int grp = 0; grp < groups; ++grp) {
      uint8_t* st = dst + (size_t(tile) * groups + grp) * V10_STAGE;
      for (int c = 0; c < GROUP_CHUNKS; ++c) {
        const int chunk = grp * GROUP_CHUNKS + c;
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane >> 2, t = lane & 3;
          for (int j = 0; j < 8; ++j) {  // as repack_for_v9
            uint32_t word = 0;
            for (int r = 0; r < 4; ++r) {
              const int col = tile * TILE + 16 * g + 2 * j + (r & 1), kp = 8 * chunk + t + 4 * (r >> 1);
              const uint8_t byte = w[size_t(kp) * N + col];
              word |= uint32_t(byte & 15) << (4 * r) | uint32_t(byte >> 4) << (4 * r + 16);
            }
            std::memcpy(st + c * 1024 + (j / 4) * 512 + lane * 16 + (j % 4) * 4, &word, 4);
          }
        }
      }
      for (int i = 0; i < TILE; ++i) {
        const size_t so = size_t(grp) * N + tile * TILE + i;
        const uint16_t zb = ktune::float_to_bf16(128.0f + ktune::bf16_to_float(ze[so]));
        std::memcpy(st + 8192 + 2 * i, &sc[so], 2);
        std::memcpy(st + 8192 + 256 + 2 * i, &zb, 2);
      }
    }
}

// ---- host ------------------------------------------------------------------------
using ktune::bf16_to_float;
using ktune::float_to_bf16;

struct Case {
  const char* name;
  int M, K, N, S;
};

int main(int argc, char** argv) {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const Case cases[] = {{"one qkvg phase (2304 x 16384)", 1, 2304, 16384, 1},
                        {"one o_proj phase (4096 x 2304), S 7", 1, 4096, 2304, 7},
                        {"one gate/up phase (9 x 2304 x 2048), S 1", 9, 2304, 2048, 1},
                        {"steady: 48 x (2304 x 16384)", 48, 2304, 16384, 1}};
  const int maxM = 48, K = 2304, N = 16384;
  const size_t wbytes = size_t(maxM) * K / 2 * N, sbytes = size_t(maxM) * K / 128 * N * 2;
  std::printf("allocating %.0f MB of int4 weights\n", wbytes / 1e6);
  std::vector<uint8_t> hw(wbytes);
  std::vector<uint16_t> hs(sbytes / 2), hz(sbytes / 2), hx(4096);
  std::mt19937 rng(7);
  for (size_t i = 0; i < wbytes; i += 4) {
    const uint32_t r = rng();
    std::memcpy(&hw[i], &r, 4);
  }
  std::uniform_real_distribution<float> us(0.001f, 0.01f), ux(-1.0f, 1.0f);
  for (size_t i = 0; i < hs.size(); ++i) {
    hs[i] = float_to_bf16(us(rng));
    hz[i] = float_to_bf16(float(rng() % 16));
  }
  for (auto& v : hx) v = float_to_bf16(ux(rng));
  uint8_t* dw;
  uint16_t *ds, *dz, *dx;
  float* dy;
  unsigned long long* dspan;
  CHECK(cudaMalloc(&dw, wbytes));
  CHECK(cudaMalloc(&ds, sbytes));
  CHECK(cudaMalloc(&dz, sbytes));
  CHECK(cudaMalloc(&dx, 4096 * 2));
  CHECK(cudaMalloc(&dy, size_t(maxM) * 8 * N * 4));
  CHECK(cudaMalloc(&dspan, 2 * 1024 * sizeof(unsigned long long)));
  CHECK(cudaMemcpy(dw, hw.data(), wbytes, cudaMemcpyHostToDevice));
  uint8_t* dwrep;  // v8's repacked copy, rewritten for each case's shape
  CHECK(cudaMalloc(&dwrep, wbytes));
  uint8_t* dwfrag;  // v9's, likewise
  CHECK(cudaMalloc(&dwfrag, wbytes));
  std::vector<uint8_t> hrep(wbytes);
  CHECK(cudaMemcpy(ds, hs.data(), sbytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dz, hz.data(), sbytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dx, hx.data(), 4096 * 2, cudaMemcpyHostToDevice));
  // A buffer the size of L2 and more, written between launches, so no
  // launch finds the weights in L2.
  const size_t flush_bytes = 256u << 20;
  void* flush;
  CHECK(cudaMalloc(&flush, flush_bytes));

  // Warm-up: about a second of streaming, so the clocks have ramped up
  // before anything is timed.
  {
    Problem p{dw, ds, dz, dx, dy, maxM, K, N, 1, dspan};
    for (int i = 0; i < 3000; ++i) v0_stream<4><<<sms, 256>>>(p);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
  }
  struct Version {
    const char* name;
    void (*kernel)(Problem);
    int threads, ring, mode = 0;
    bool checked = true;
    int ring_bytes = 0;  // v3: its stages (plus barriers and alignment below)
  };
  const Version versions[] = {
      {"v9 U2 frag", v6_scales_ahead<2, 0, true, true, 1>, 256, 0},
      {"v9 U4 frag", v6_scales_ahead<4, 0, true, true, 1>, 256, 0},
      {"v9 U2 frag umulhi", v6_scales_ahead<2, 0, true, true, 2>, 256, 0},
      {"v9 U2 frag, no loads at all", v6_scales_ahead<2, 2, true, true, 1>, 256, 0, 0, false},
      {"v9 U2 frag umulhi, no loads", v6_scales_ahead<2, 2, true, true, 2>, 256, 0, 0, false},
      {"v9 U2 frag, 16 warps", v6_scales_ahead<2, 0, true, true, 1>, 512, 0},
      {"v8 warp ring 4 x 4 KB", v8_warp_ring<4, 4>, 256, 0, 0, true, 8 * 4 * 4 * 1024 + 8 * 4 * 8},
      {"v8 warp ring 6 x 4 KB", v8_warp_ring<6, 4>, 256, 0, 0, true, 8 * 6 * 4 * 1024 + 8 * 6 * 8},
      {"v8 warp ring 3 x 8 KB", v8_warp_ring<3, 8>, 256, 0, 0, true, 8 * 3 * 8 * 1024 + 8 * 3 * 8},
      {"v8 warp ring 8 x 2 KB", v8_warp_ring<8, 2>, 256, 0, 0, true, 8 * 8 * 2 * 1024 + 8 * 8 * 8},
      {"v7 U2 lean", v6_scales_ahead<2, 0, true>, 256, 0},
      {"v7 U4 lean", v6_scales_ahead<4, 0, true>, 256, 0},
      {"v7 U2 lean, no loads at all", v6_scales_ahead<2, 2, true>, 256, 0, 0, false},
      {"v6 U2 scales ahead", v6_scales_ahead<2>, 256, 0},
      {"v6 U4 scales ahead", v6_scales_ahead<4>, 256, 0},
      {"v6 U2, no weight loads", v6_scales_ahead<2, 1>, 256, 0, 0, false},
      {"v6 U2, no loads at all", v6_scales_ahead<2, 2>, 256, 0, 0, false},
      {"v6 U4, no loads at all", v6_scales_ahead<4, 2>, 256, 0, 0, false},
      {"v5 U2 pipelined", v6_scales_ahead<2, 0, false, false>, 256, 0},
      {"v5 U4 pipelined", v6_scales_ahead<4, 0, false, false>, 256, 0},
      {"v5 U4 pipelined, no loads", v6_scales_ahead<4, 1, false, false>, 256, 0, 0, false},
      {"v5 U2 pipelined, no loads", v6_scales_ahead<2, 1, false, false>, 256, 0, 0, false},
      {"v5 U2 pipelined, 16 warps", v6_scales_ahead<2, 0, false, false>, 512, 0},
      {"v3 bulk 16 contig, no comp", v3_bulk<16, 1, true>, 256, 0, 0, false, 16 * (64 * 128 + 512)},
      {"v0 stream", v0_stream<4>, 256, 0},
      {"v0 stream, 8 loads", v0_stream<8>, 256, 0},
      {"v0 stream, 16 loads", v0_stream<16>, 256, 0},
      {"v4 U2, item prefetch.L2", v1_registers<2, 1>, 256, 0},
      {"v4 U2, item bulk prefetch", v1_registers<2, 2>, 256, 0},
      {"v4 U2, bulk 8 ahead", v1_registers<2, 3, 8>, 256, 0},
      {"v4 U2, bulk 16 ahead", v1_registers<2, 3, 16>, 256, 0},
      {"v4 U2, prefetch.L2 8 ahead", v1_registers<2, 4, 8>, 256, 0},
      {"v4 U4, bulk 16 ahead", v1_registers<4, 3, 16>, 256, 0},
      {"v4 U2, item bulk, 16 warps", v1_registers<2, 2>, 512, 0},           {"v1 registers U2, 8 warps", v1_registers<2>, 256, 0},
      {"v1 registers U4, 8 warps", v1_registers<4>, 256, 0}, {"v1 registers U2, 16 warps", v1_registers<2>, 512, 0},
      {"v2 ring 4, 8 warps", v2_ring<4>, 256, 4},    {"v2 ring 8, 8 warps", v2_ring<8>, 256, 8},
      {"v2 ring 16, 8 warps", v2_ring<16>, 256, 16}, {"v2 ring 4, 16 warps", v2_ring<4>, 512, 4},
      {"v2 ring 4, no compute", v2_ring<4, 1>, 256, 4, 1, false},
      {"v2 ring 4, contiguous", v2_ring<4, 2>, 256, 4, 2, false},
      {"v2 ring 2, 16 warps", v2_ring<2>, 512, 2},
      {"v2 ring 4, interleaved", v2_ring<4, 8>, 256, 4, 8},
      {"v2 ring 8, no compute", v2_ring<8, 1>, 256, 8, 1, false},
      {"v2 ring 16, no compute", v2_ring<16, 1>, 256, 16, 1, false},
      {"v2 ring 8, no comp, contig", v2_ring<8, 3>, 256, 8, 3, false},
      {"v2 ring 16, no comp, contig", v2_ring<16, 3>, 256, 16, 3, false},
      {"v2 ring 8, contiguous", v2_ring<8, 2>, 256, 8, 2, false},
      {"v2 ring 16, contiguous", v2_ring<16, 2>, 256, 16, 2, false},
      {"v2 ring 4, no comp, 16 warps", v2_ring<4, 1>, 512, 4, 1, false},
      {"v2 ring 4, no comp, contig, 16w", v2_ring<4, 3>, 512, 4, 3, false},
      {"v3 bulk 4 stages, rows", v3_bulk<4, 0>, 256, 0, 0, true, 4 * (64 * 160 + 512)},
      {"v3 bulk 8 stages, rows", v3_bulk<8, 0>, 256, 0, 0, true, 8 * (64 * 160 + 512)},
      {"v3 bulk 12 stages, rows", v3_bulk<12, 0>, 256, 0, 0, true, 12 * (64 * 160 + 512)},
      {"v3 bulk 8 stages, contig", v3_bulk<8, 1>, 256, 0, 0, false, 8 * (64 * 128 + 512)},
      {"v3 bulk 16 stages, contig", v3_bulk<16, 1>, 256, 0, 0, false, 16 * (64 * 128 + 512)}};
  for (const Case& cs : cases) {
    std::printf("\n== %s: %.1f MB of weights + scales\n", cs.name,
                (double(cs.M) * cs.K / 2 * cs.N + 2.0 * cs.M * cs.K / 128 * cs.N * 2) / 1e6);
    std::printf("%-28s %10s %10s %8s %10s\n", "version", "span us", "GB/s", "regs", "max err");
    // Host reference for matrix 0 (the same dequant, in double).
    repack_for_v8(hw.data(), hrep.data(), cs.M, cs.K, cs.N);
    CHECK(cudaMemcpy(dwrep, hrep.data(), size_t(cs.M) * cs.K / 2 * cs.N, cudaMemcpyHostToDevice));
    repack_for_v9(hw.data(), hrep.data(), cs.M, cs.K, cs.N);
    CHECK(cudaMemcpy(dwfrag, hrep.data(), size_t(cs.M) * cs.K / 2 * cs.N, cudaMemcpyHostToDevice));
    std::vector<double> ref(cs.N, 0.0);
    for (int k = 0; k < cs.K; ++k) {
      const double xv = bf16_to_float(hx[k]);
      for (int n = 0; n < cs.N; ++n) {
        const uint8_t byte = hw[size_t(k / 2) * cs.N + n];
        const int q = (k & 1) ? byte >> 4 : byte & 15;
        const size_t so = size_t(k / 128) * cs.N + n;
        const float d = bf16_to_float(float_to_bf16(float(q) - bf16_to_float(hz[so])));
        ref[n] += xv * bf16_to_float(float_to_bf16(d * bf16_to_float(hs[so])));
      }
    }
    for (const Version& v : versions) {
      // Arguments: run only the versions they name (asked_for).
      if (!asked_for(v.name, argc, argv, 1)) continue;
      Problem p{dw, ds, dz, dx, dy, cs.M, cs.K, cs.N, cs.S, dspan, dwrep, dwfrag};
      const int warps = v.threads / 32;
      const bool stream = v.kernel == v0_stream<4> || v.kernel == v0_stream<8> || v.kernel == v0_stream<16>;
      const size_t smem = stream ? 0
                                                : size_t(cs.K) * 2 + size_t(warps) * TILE * 4 +
                                                      size_t(v.ring) * 32 * v.threads +
                                                      (v.ring ? size_t(ring_group_slots(v.ring, v.mode)) * 64 * v.threads : 0) +
                                                      (v.ring_bytes ? v.ring_bytes + 512 : 0);
      CHECK(cudaFuncSetAttribute(v.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      cudaFuncAttributes fa;
      CHECK(cudaFuncGetAttributes(&fa, v.kernel));
      double best = 1e30;
      for (int rep = 0; rep < 7; ++rep) {
        CHECK(cudaMemset(flush, rep, flush_bytes));
        CHECK(cudaMemset(dy, 0xff, size_t(cs.M) * cs.S * cs.N * 4));  // poison
        v.kernel<<<sms, v.threads, smem>>>(p);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        std::vector<unsigned long long> span(2 * sms);
        CHECK(cudaMemcpy(span.data(), dspan, span.size() * 8, cudaMemcpyDeviceToHost));
        unsigned long long t0 = ~0ull, t1 = 0;
        for (int b = 0; b < sms; ++b) {
          t0 = std::min(t0, span[2 * b]);
          t1 = std::max(t1, span[2 * b + 1]);
        }
        if (rep > 0) best = std::min(best, (t1 - t0) / 1e3);
      }
      double err = 0;
      if (!stream && v.checked) {
        std::vector<float> y(size_t(cs.S) * cs.N);
        CHECK(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost));
        double scale = 0;
        for (int n = 0; n < cs.N; ++n) scale = std::max(scale, std::fabs(ref[n]));
        for (int n = 0; n < cs.N; ++n) {
          double s = 0;
          for (int sp = 0; sp < cs.S; ++sp) s += y[size_t(sp) * cs.N + n];
          err = std::max(err, std::fabs(s - ref[n]) / scale);
        }
      }
      const double bytes = double(cs.M) * cs.K / 2 * cs.N + 2.0 * cs.M * cs.K / 128 * cs.N * 2;
      std::printf("%-28s %10.2f %10.0f %8d %10.2e%s\n", v.name, best, bytes / best / 1e3, fa.numRegs, err,
                  err > 1e-3 ? "  WRONG" : v.checked ? "" : "  (not checked)");
    }
  }
  // v10: sequences of one Kimi-Linear K layer's GEMV phases (q,k,v,g; o_proj;
  // the MoE's 9 gate/up; its 9 downs), each phase's own weights, repacked once.
  bool want_seq = argc < 2;
  for (int i = 1; i < argc; ++i)
    want_seq = want_seq || std::strncmp(argv[i], "v10", 3) == 0 || std::strncmp(argv[i], "v11", 3) == 0;
  if (want_seq) {
    struct Shape {
      const char* name;
      int K, N;
    };
    const Shape layer[] = {{"qkvg", 2304, 16384}, {"o_proj", 4096, 2304}, {"gate/up", 2304, 18432}, {"down", 9216, 2304}};
    constexpr int kLayers = 4, kPhases = 4 * kLayers;
    std::vector<size_t> stage_off(kPhases + 1, 0);
    size_t woff = 0, soff = 0;
    std::vector<std::vector<uint16_t>> xs(kPhases);
    std::vector<std::vector<double>> refs(kPhases);
    std::vector<size_t> wofs(kPhases), sofs(kPhases);
    for (int p = 0; p < kPhases; ++p) {
      const Shape& sh = layer[p % 4];
      wofs[p] = woff;
      sofs[p] = soff;
      woff += size_t(sh.K) / 2 * sh.N;
      soff += size_t(sh.K) / 128 * sh.N;
      stage_off[p + 1] = stage_off[p] + size_t(sh.N / TILE) * (sh.K / 128) * V10_STAGE;
    }
    if (woff > wbytes || soff > hs.size()) {
      std::fprintf(stderr, "v10: the sequence needs more weights than allocated\n");
      return 1;
    }
    std::vector<uint8_t> hst(stage_off[kPhases]);
    double seq_bytes = 0;
    for (int p = 0; p < kPhases; ++p) {
      const Shape& sh = layer[p % 4];
      repack_for_v10(hw.data() + wofs[p], hs.data() + sofs[p], hz.data() + sofs[p], sh.K, sh.N, hst.data() + stage_off[p]);
      xs[p].resize(sh.K);
      for (auto& v : xs[p]) v = float_to_bf16(ux(rng));
      refs[p].assign(sh.N, 0.0);
      for (int k = 0; k < sh.K; ++k) {
        const double xv = bf16_to_float(xs[p][k]);
        const uint8_t* row = hw.data() + wofs[p] + size_t(k / 2) * sh.N;
        const uint16_t *srow = hs.data() + sofs[p] + size_t(k / 128) * sh.N, *zrow = hz.data() + sofs[p] + size_t(k / 128) * sh.N;
        for (int n = 0; n < sh.N; ++n) {
          const int qv = (k & 1) ? row[n] >> 4 : row[n] & 15;
          const float d = bf16_to_float(float_to_bf16(float(qv) - bf16_to_float(zrow[n])));
          refs[p][n] += xv * bf16_to_float(float_to_bf16(d * bf16_to_float(srow[n])));
        }
      }
      seq_bytes += double(sh.K) / 2 * sh.N + 2.0 * sh.K / 128 * sh.N * 2;
    }
    uint8_t* dst;
    uint16_t* dxs;
    float* dys;
    unsigned* dbar;
    unsigned long long* dspan2;
    size_t xtotal = 0, ytotal = 0;
    for (int p = 0; p < kPhases; ++p) xtotal += layer[p % 4].K, ytotal += layer[p % 4].N;
    CHECK(cudaMalloc(&dst, hst.size()));
    CHECK(cudaMalloc(&dxs, xtotal * 2));
    CHECK(cudaMalloc(&dys, ytotal * 4));
    CHECK(cudaMalloc(&dbar, 4));
    CHECK(cudaMalloc(&dspan2, (2 * 1024 + V10_MAX_PHASES) * 8));
    CHECK(cudaMemcpy(dst, hst.data(), hst.size(), cudaMemcpyHostToDevice));
    Sequence all{};
    all.nph = kPhases;
    all.bar = dbar;
    all.span = dspan2;
    size_t xo = 0, yo = 0;
    for (int p = 0; p < kPhases; ++p) {
      const Shape& sh = layer[p % 4];
      CHECK(cudaMemcpy(dxs + xo, xs[p].data(), sh.K * 2, cudaMemcpyHostToDevice));
      all.ph[p] = SeqPhase{dst + stage_off[p], dxs + xo, dys + yo, sh.K, sh.N};
      xo += sh.K;
      yo += sh.N;
    }
    struct SeqVersion {
      const char* name;
      void (*kernel)(Sequence);
      int ns, consumers;
      bool checked;
      int tacc_rows = 1;  // v11: one row of tile sums per consumer warp
    };
    const SeqVersion sv[] = {{"v10 ring 20 x 8.5 KB, 8 consumer warps", v10_sequence<20, 8>, 20, 8, true},
                             {"v10 ring 12, 8 consumers", v10_sequence<12, 8>, 12, 8, true},
                             {"v10 ring 20, 16 consumers", v10_sequence<20, 16>, 20, 16, true},
                             {"v10 ring 20, no compute", v10_sequence<20, 8, true>, 20, 8, false},
                             {"v11 Q1, 8 consumers", v11_sequence<20, 8, 1>, 20, 8, true, 8},
                             {"v11 Q2, 8 consumers", v11_sequence<20, 8, 2>, 20, 8, true, 8},
                             {"v11 Q4, 8 consumers", v11_sequence<20, 8, 4>, 20, 8, true, 8},
                             {"v11 Q8, 8 consumers", v11_sequence<20, 8, 8>, 20, 8, true, 8},
                             {"v11 Q1, 16 consumers", v11_sequence<20, 16, 1>, 20, 16, true, 16},
                             {"v11 Q2, 16 consumers", v11_sequence<20, 16, 2>, 20, 16, true, 16},
                             {"v11 Q2, no compute", v11_sequence<20, 8, 2, 1>, 20, 8, false, 8},
                             {"v11 Q4, 8 consumers, no loads", v11_sequence<20, 8, 4, 2>, 20, 8, false, 8},
                             {"v11 Q4, 16 consumers, no loads", v11_sequence<20, 16, 4, 2>, 20, 16, false, 16},
                             {"v11 Q1, 8 consumers, no loads", v11_sequence<20, 8, 1, 2>, 20, 8, false, 8},
                             {"v11 Q4, 16 consumers", v11_sequence<20, 16, 4>, 20, 16, true, 16},
                             {"v11 Q4, 8 consumers, ring 22", v11_sequence<22, 8, 4>, 22, 8, true, 8},
                             {"v11 Q4, 8 consumers, ring 12", v11_sequence<12, 8, 4>, 12, 8, true, 8},
                             {"v11 Q4, 8 consumers, no grid barriers", v11_sequence<20, 8, 4, 3>, 20, 8, true, 8},
                             {"v11 Q2, stream alone, no grid barriers", v11_sequence<20, 8, 2, 4>, 20, 8, false, 8},
                             {"v11 Q2, stream alone in 4 pieces a stage, no grid barriers", v11_sequence<20, 8, 2, 5>, 20, 8, false, 8},
                             {"v11 Q2, 8 consumers, no grid barriers", v11_sequence<20, 8, 2, 3>, 20, 8, true, 8},
                             {"v11 Q2, 12 consumers, no grid barriers", v11_sequence<20, 12, 2, 3>, 20, 12, true, 12},
                             {"v11 Q2, 16 consumers, no grid barriers", v11_sequence<20, 16, 2, 3>, 20, 16, true, 16},
                             {"v11 pure Q1, 8 consumers", v11_sequence<20, 8, 1, 6>, 20, 8, false, 8},
                             {"v11 pure Q2, 8 consumers", v11_sequence<20, 8, 2, 6>, 20, 8, false, 8},
                             {"v11 pure Q4, 8 consumers", v11_sequence<20, 8, 4, 6>, 20, 8, false, 8},
                             {"v11 pure Q8, 8 consumers", v11_sequence<20, 8, 8, 6>, 20, 8, false, 8},
                             {"v11 pure Q2, 12 consumers", v11_sequence<20, 12, 2, 6>, 20, 12, false, 12},
                             {"v11 pure Q2, 16 consumers", v11_sequence<20, 16, 2, 6>, 20, 16, false, 16},
                             {"v11 pure Q4, 16 consumers", v11_sequence<20, 16, 4, 6>, 20, 16, false, 16},
                             {"v11 pure Q1, 16 consumers", v11_sequence<20, 16, 1, 6>, 20, 16, false, 16},
                             {"v11 pure Q2, 8 consumers, probe: multiply only", v11_sequence<20, 8, 2, 6, 1>, 20, 8, false, 8},
                             {"v11 pure Q2, 8 consumers, probe: one HFMA2", v11_sequence<20, 8, 2, 6, 2>, 20, 8, false, 8},
                             {"v11 pure Q2, 8 consumers, probe: no arithmetic", v11_sequence<20, 8, 2, 6, 3>, 20, 8, false, 8},
                             {"v11 pure Q2, 8 consumers, probe: fp16", v11_sequence<20, 8, 2, 6, 4>, 20, 8, false, 8},
                             {"v11 pure Q2, 16 consumers, probe: one HFMA2", v11_sequence<20, 16, 2, 6, 2>, 20, 16, false, 16},
                             {"v11 pure Q2, 16 consumers, probe: no arithmetic", v11_sequence<20, 16, 2, 6, 3>, 20, 16, false, 16},
                             {"v11 pure Q2, 8 consumers, probe: wgmma, no arithmetic", v11_sequence<20, 8, 2, 6, 5>, 20, 8, false, 8},
                             {"v11 pure Q2, 8 consumers, probe: wgmma", v11_sequence<20, 8, 2, 6, 6>, 20, 8, false, 8},
                             {"v11 pure Q2, 8 consumers, probe: no mma", v11_sequence<20, 8, 2, 6, 7>, 20, 8, false, 8},
                             {"v11 pure Q2, 8 consumers, probe: no mma, no arithmetic", v11_sequence<20, 8, 2, 6, 8>, 20, 8, false, 8},
                             {"v11 pure Q2, 16 consumers, probe: wgmma", v11_sequence<20, 16, 2, 6, 6>, 20, 16, false, 16}};
    struct Run {
      const char* name;
      int first, count;
    };
    const Run runs[] = {{"4 layers (16 phases)", 0, 16}, {"1 layer (4 phases)", 0, 4}, {"qkvg alone", 0, 1},
                        {"o_proj alone", 1, 1}, {"gate/up alone", 2, 1}, {"down alone", 3, 1}};
    for (const Run& r : runs) {
      Sequence sq = all;
      sq.nph = r.count;
      double bytes = 0;
      for (int p = 0; p < r.count; ++p) {
        sq.ph[p] = all.ph[r.first + p];
        const Shape& sh = layer[(r.first + p) % 4];
        bytes += double(sh.K) / 2 * sh.N + 2.0 * sh.K / 128 * sh.N * 2;
      }
      std::printf("\n== v10 %s: %.1f MB of weights + scales\n", r.name, bytes / 1e6);
      std::printf("%-40s %10s %10s %8s %10s  %s\n", "version", "span us", "GB/s", "regs", "max err", "block 0's phase ends (us)");
      for (const SeqVersion& v : sv) {
        if (!asked_for(v.name, argc, argv, 1)) continue;
        const size_t smem = 9216 * 2 + size_t(v.tacc_rows) * V10_TILES_PER_RANGE * TILE * 4 + 2 * v.ns * 8 + 128 + size_t(v.ns) * V10_STAGE;
        CHECK(cudaFuncSetAttribute(v.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        cudaFuncAttributes fa;
        CHECK(cudaFuncGetAttributes(&fa, v.kernel));
        double best = 1e30;
        std::vector<unsigned long long> span(2 * sms + V10_MAX_PHASES), best_span;
        for (int rep = 0; rep < 7; ++rep) {
          CHECK(cudaMemset(flush, rep, flush_bytes));
          CHECK(cudaMemset(dys, 0, ytotal * 4));
          CHECK(cudaMemset(dbar, 0, 4));
          v.kernel<<<sms, v.consumers * 32 + 32, smem>>>(sq);
          CHECK(cudaGetLastError());
          CHECK(cudaDeviceSynchronize());
          CHECK(cudaMemcpy(span.data(), dspan2, span.size() * 8, cudaMemcpyDeviceToHost));
          unsigned long long t0 = ~0ull, t1 = 0;
          for (int b = 0; b < sms; ++b) {
            t0 = std::min(t0, span[2 * b]);
            t1 = std::max(t1, span[2 * b + 1]);
          }
          if (rep > 0 && (t1 - t0) / 1e3 < best) {
            best = (t1 - t0) / 1e3;
            best_span = span;
            for (int p = 0; p < r.count; ++p) best_span[2 * sms + p] -= t0;
          }
        }
        double err = 0;
        if (v.checked) {
          std::vector<float> y(ytotal);
          CHECK(cudaMemcpy(y.data(), dys, y.size() * 4, cudaMemcpyDeviceToHost));
          for (int p = 0; p < r.count; ++p) {
            const std::vector<double>& ref = refs[r.first + p];
            const size_t yo_p = size_t(sq.ph[p].y - dys);
            double scale = 0;
            for (double v2 : ref) scale = std::max(scale, std::fabs(v2));
            for (size_t n = 0; n < ref.size(); ++n) err = std::max(err, std::fabs(y[yo_p + n] - ref[n]) / scale);
          }
        }
        std::printf("%-40s %10.2f %10.0f %8d %10.2e%s ", v.name, best, bytes / best / 1e3, fa.numRegs, err,
                    err > 1e-3 ? "  WRONG" : v.checked ? "" : "  (not checked)");
        for (int p = 0; p < r.count; ++p) std::printf(" %.1f", best_span[2 * sms + p] / 1e3);
        std::printf("\n");
      }
    }
  }
  return 0;
}
