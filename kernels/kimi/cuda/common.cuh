// Device helpers shared by the Kimi CUDA kernels (the megakernel and the
// baseline): bf16 conversions and packed bf16 arithmetic, the W4A16 nibble
// unpacking, tensor-core mma, loads with cache hints, warp reductions and a
// grid-wide barrier. Every architectural operation (PTX, intrinsics) goes
// through a kt_* function here, with a bit-exact twin for the CPU emulator
// (kernels/emu/cuda_emu.h, KT_EMULATION), so the kernels' logic can be
// tested without a GPU.
#pragma once

#ifndef KT_EMULATION
#include <cuda_bf16.h>
#include <cooperative_groups.h>
#endif

#define KT_DEV __device__ __forceinline__

// The kernel table (see cuda_emu.h): the runner finds GPU kernels by name,
// so on the GPU the table is empty.
#ifndef KT_EMULATION
#define KT_KERNEL_TABLE_BEGIN
#define KT_KERNEL(k)
#define KT_KERNEL_TABLE_END
#endif

// ---- bf16 ------------------------------------------------------------------
KT_DEV float kt_bf2f(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }

KT_DEV uint16_t kt_f2bf(float f) {
#ifdef KT_EMULATION
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
#else
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#endif
}

KT_DEV float kt_round_bf16(float f) { return kt_bf2f(kt_f2bf(f)); }

// Two bf16 in one word: element 0 (the lower index) in the low half.
KT_DEV float kt_lo(uint32_t p) { return __uint_as_float(p << 16); }
KT_DEV float kt_hi(uint32_t p) { return __uint_as_float(p & 0xffff0000u); }
KT_DEV uint32_t kt_pack(float lo, float hi) { return uint32_t(kt_f2bf(lo)) | (uint32_t(kt_f2bf(hi)) << 16); }

// Packed bf16 a - b and a * b, each rounded once to nearest even (what the
// spec's "rounded to bf16 as bf16 arithmetic would" means).
KT_DEV uint32_t kt_hsub2(uint32_t a, uint32_t b) {
#ifdef KT_EMULATION
  return kt_pack(kt_lo(a) - kt_lo(b), kt_hi(a) - kt_hi(b));
#else
  __nv_bfloat162 r = __hsub2(*reinterpret_cast<__nv_bfloat162*>(&a), *reinterpret_cast<__nv_bfloat162*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
#endif
}

KT_DEV uint32_t kt_hmul2(uint32_t a, uint32_t b) {
#ifdef KT_EMULATION
  return kt_pack(kt_lo(a) * kt_lo(b), kt_hi(a) * kt_hi(b));
#else
  __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&a), *reinterpret_cast<__nv_bfloat162*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
#endif
}

// ---- W4A16 unpacking -----------------------------------------------------
// Byte `b` (0..3) of `word` holds rows 2r (low nibble) and 2r+1 (high
// nibble) of one column. Returns them as packed bf16 (128 + q_lo, 128 + q_hi):
// 0x4300 is 128.0 in bf16 and its unit in the last place is 1, so OR-ing a
// nibble into the mantissa adds it exactly. `shifted` is word >> 4.
// With `bias` (0x43004300) in a register, the mask-and-bias is one LOP3; with
// the literal, ptxas emits two (a LOP3 takes one immediate).
KT_DEV uint32_t kt_nibble_pair(uint32_t word, uint32_t shifted, int b, uint32_t bias = 0x43004300u) {
  uint32_t sel = uint32_t(b) | (uint32_t(b) << 4) | (uint32_t(b + 4) << 8) | (uint32_t(b + 4) << 12);
  return (__byte_perm(word, shifted, sel) & 0x000f000fu) | bias;
}

// Exact dequantization of a nibble pair: ((128+q) - (128+z)) * s, each step
// rounded to bf16; zz = packed (128+z, 128+z), ss = packed (s, s).
KT_DEV uint32_t kt_dequant_pair(uint32_t pair, uint32_t zz, uint32_t ss) {
  return kt_hmul2(kt_hsub2(pair, zz), ss);
}

// The same with the zero and the scale taken from half h of words that hold
// two columns' each: the bf16 ops read either half of a register broadcast,
// so a lane keeps 8 words per group for its 16 columns, not 16 per-column
// copies of each.
template <int h>
KT_DEV uint32_t kt_dequant_half(uint32_t pair, uint32_t zz2, uint32_t ss2) {
#ifdef KT_EMULATION
  const uint32_t z = h ? (zz2 >> 16) : (zz2 & 0xffffu), s = h ? (ss2 >> 16) : (ss2 & 0xffffu);
  return kt_dequant_pair(pair, z | (z << 16), s | (s << 16));
#else
  const __nv_bfloat162 p2 = *reinterpret_cast<const __nv_bfloat162*>(&pair);
  const __nv_bfloat162 z2 = *reinterpret_cast<const __nv_bfloat162*>(&zz2);
  const __nv_bfloat162 s2 = *reinterpret_cast<const __nv_bfloat162*>(&ss2);
  const __nv_bfloat162 zb = h ? __high2bfloat162(z2) : __low2bfloat162(z2);
  const __nv_bfloat162 sb = h ? __high2bfloat162(s2) : __low2bfloat162(s2);
  const __nv_bfloat162 r = __hmul2(__hsub2(p2, zb), sb);
  return *reinterpret_cast<const uint32_t*>(&r);
#endif
}

// ---- tensor cores ----------------------------------------------------------
// d += A * B for one m16n8k16 bf16 mma with fp32 accumulation. Fragment
// layout per the PTX ISA (lane = 4 * group + tid_in_group):
//   a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..], a[2] = A[g][2t+8..], a[3] = A[g+8][2t+8..]
//   b[0] = B[2t..2t+1][g], b[1] = B[2t+8..2t+9][g]
//   d[0..1] = D[g][2t..2t+1], d[2..3] = D[g+8][2t..2t+1]
KT_DEV void kt_mma_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#ifdef KT_EMULATION
  struct Frag {
    uint32_t a[4], b[2];
  } mine{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}};
  auto slots = kt_emu::warp_gather(&mine, sizeof mine);
  auto frag = [&](int lane) {
    Frag f;
    memcpy(&f, slots[lane], sizeof f);
    return f;
  };
  auto A = [&](int row, int col) {
    Frag f = frag((row % 8) * 4 + (col % 8) / 2);
    uint32_t reg = f.a[(row >= 8 ? 1 : 0) + (col >= 8 ? 2 : 0)];
    return (col & 1) ? kt_hi(reg) : kt_lo(reg);
  };
  auto B = [&](int k, int n) {
    Frag f = frag(n * 4 + (k % 8) / 2);
    uint32_t reg = f.b[k >= 8 ? 1 : 0];
    return (k & 1) ? kt_hi(reg) : kt_lo(reg);
  };
  int lane = int(kt_emu::lane_id()), g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; ++i) {
    int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
    float acc = d[i];
    for (int k = 0; k < 16; ++k) acc += A(row, k) * B(k, col);
    d[i] = acc;
  }
  kt_emu::warp_release();
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// Four 8x8 bf16 matrices from shared memory, one fragment register each:
// lane i gives the address of row i % 8 of matrix i / 8 (16 contiguous
// bytes, 16-byte aligned). r[j] of lane (g, t) = M_j[g][2t..2t+1], or with
// trans M_j[2t][g] (low half) and M_j[2t+1][g] (high half).
template <bool trans>
KT_DEV void kt_ldmatrix_x4(uint32_t (&r)[4], const void* row) {
#ifdef KT_EMULATION
  auto slots = kt_emu::warp_gather(&row, sizeof row);
  auto element = [&](int lane, int e) {
    const uint16_t* p;
    memcpy(&p, slots[lane], sizeof p);
    return uint32_t(p[e]);
  };
  const int lane = int(kt_emu::lane_id()), g = lane / 4, t = lane % 4;
  for (int j = 0; j < 4; ++j)
    r[j] = trans ? element(8 * j + 2 * t, g) | (element(8 * j + 2 * t + 1, g) << 16)
                 : element(8 * j + g, 2 * t) | (element(8 * j + g, 2 * t + 1) << 16);
  kt_emu::warp_release();
#else
  const unsigned s = unsigned(__cvta_generic_to_shared(row));
  if (trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
#endif
}

// ---- loads ---------------------------------------------------------------------
#ifndef KT_EMULATION
// An L2 eviction policy for a load's cache_hint: hint 1 marks the lines
// first to evict, hint 2 last.
template <int hint>
KT_DEV uint64_t kt_l2_policy() {
  uint64_t policy;
  if (hint == 2)
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
  else
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
#endif
// Weights are read once per step: stream them past L1 and mark them first
// to evict from L2 (hint = 1), or load them plainly (hint = 0).
template <int hint>
KT_DEV uint4 kt_ld_weights(const void* p) {
#ifdef KT_EMULATION
  uint4 v;
  memcpy(&v, p, sizeof v);
  return v;
#else
  uint4 v;
  if (hint == 1) {
    const uint64_t policy = kt_l2_policy<1>();
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(policy));
  } else {
    v = __ldg(reinterpret_cast<const uint4*>(p));
  }
  return v;
#endif
}

// Data written earlier in the same launch by other blocks: read at L2
// (never a stale L1 line).
template <class T>  // float, float2, int: types __ldcg takes as they are
KT_DEV T kt_ld_cg(const T* p) {
#ifdef KT_EMULATION
  return *p;
#else
  return __ldcg(p);
#endif
}
KT_DEV uint16_t kt_ld_cg(const uint16_t* p) {
#ifdef KT_EMULATION
  return *p;
#else
  return __ldcg(reinterpret_cast<const unsigned short*>(p));
#endif
}

// ---- asynchronous copies into shared memory (cp.async, 16 bytes) ----------
// `valid` false writes zeros (the copy reads nothing). The emulator copies at
// once, so commit and wait are no-ops there. hint 1 marks the line first to
// evict from L2: for data read once per step (the MLA cache), so that it does
// not push out what the next phases and the next step read again (the
// router's rows, the KDA state); hint 2 marks it last to evict, so that the
// cache itself stays for the next step while the weights stream through.
template <int hint = 0>
KT_DEV void kt_cp_async16(void* smem, const void* gmem, bool valid) {
#ifdef KT_EMULATION
  if (valid) memcpy(smem, gmem, 16);
  else memset(smem, 0, 16);
#else
  unsigned s = unsigned(__cvta_generic_to_shared(smem));
  if (hint == 1 || hint == 2) {
    const uint64_t policy = kt_l2_policy<hint>();
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(s), "l"(gmem),
                 "r"(valid ? 16 : 0), "l"(policy));
  } else {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
  }
#endif
}
KT_DEV void kt_cp_async_commit() {
#ifndef KT_EMULATION
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Waits until at most `n` committed groups are still in flight.
template <int n>
KT_DEV void kt_cp_async_wait() {
#ifndef KT_EMULATION
  asm volatile("cp.async.wait_group %0;\n" ::"n"(n));
#endif
}

// ---- mbarriers and bulk copies into shared memory ---------------------------
// An mbarrier (8 bytes of shared memory) completes a phase when `count`
// arrivals and every byte announced by arrive_expect_tx have come in; a
// bulk copy (the copy engine: one instruction, no registers, no load slots
// held while in flight) completes its bytes on one. Waiters name the phase
// by its parity. The emulator copies at once (kernels/emu/cuda_emu.h).
#ifndef KT_EMULATION
KT_DEV uint32_t kt_smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
#endif
KT_DEV void kt_mbar_init(uint64_t* bar, unsigned count) {
#ifdef KT_EMULATION
  kt_emu::mbar_init(bar, count);
#else
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(kt_smem_addr(bar)), "r"(count) : "memory");
#endif
}
// After a block's mbarriers are initialised, before others use them (then a
// __syncthreads).
KT_DEV void kt_mbar_fence_init() {
#ifndef KT_EMULATION
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
KT_DEV void kt_mbar_arrive(uint64_t* bar) {
#ifdef KT_EMULATION
  kt_emu::mbar_arrive(bar, 0);
#else
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(kt_smem_addr(bar)) : "memory");
#endif
}
// One arrival that also announces `bytes` still to come (by bulk copies).
KT_DEV void kt_mbar_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
#ifdef KT_EMULATION
  kt_emu::mbar_arrive(bar, int(bytes));
#else
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(kt_smem_addr(bar)), "r"(bytes)
               : "memory");
#endif
}
// Waits until the phase of parity `parity` has completed.
KT_DEV void kt_mbar_wait(uint64_t* bar, unsigned parity) {
#ifdef KT_EMULATION
  kt_emu::mbar_wait(bar, parity);
#else
  asm volatile(
      "{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}" ::"r"(
          kt_smem_addr(bar)),
      "r"(parity)
      : "memory");
#endif
}
// Orders this thread's earlier generic-proxy accesses to shared memory
// (reads of a ring slot) before its later bulk copies into it.
KT_DEV void kt_fence_proxy_async() {
#ifndef KT_EMULATION
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}
// One arrival on `bar`, made when this thread's earlier cp.async copies have
// landed (the mbarrier's count includes it: .noinc).
KT_DEV void kt_cp_async_mbar_arrive(uint64_t* bar) {
#ifdef KT_EMULATION
  kt_emu::mbar_arrive(bar, 0);  // the emulator's copies land when issued
#else
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(kt_smem_addr(bar)) : "memory");
#endif
}
// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to
// shared memory, completing on `bar`; first to evict from L2 (weights are
// read once per step).
KT_DEV void kt_bulk_copy_g2s(void* smem, const void* gmem, unsigned bytes, uint64_t* bar) {
#ifdef KT_EMULATION
  memcpy(smem, gmem, bytes);
  kt_emu::mbar_complete_tx(bar, int(bytes));
#else
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          kt_smem_addr(smem)),
      "l"(gmem), "r"(bytes), "r"(kt_smem_addr(bar)), "l"(policy)
      : "memory");
#endif
}

// A word other blocks write in this launch, polled: read at L2, not ordered
// with anything else (the word carries its own validity).
KT_DEV unsigned kt_ld_relaxed(const unsigned* p) {
#ifdef KT_EMULATION
  return *(volatile const unsigned*)p;
#else
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
#endif
}
// Four such words at once (each is its own; the four are not one access).
KT_DEV uint4 kt_ld_relaxed_v4(const uint4* p) {
#ifdef KT_EMULATION
  const volatile unsigned* w = reinterpret_cast<const volatile unsigned*>(p);
  return make_uint4(w[0], w[1], w[2], w[3]);
#else
  uint4 v;
  asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
#endif
}
KT_DEV void kt_st_relaxed(unsigned* p, unsigned v) {
#ifdef KT_EMULATION
  *(volatile unsigned*)p = v;
#else
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
#endif
}

// ---- acquire / release on global counters --------------------------------------
KT_DEV unsigned kt_ld_acquire(const unsigned* p) {
#ifdef KT_EMULATION
  return *(volatile const unsigned*)p;
#else
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
#endif
}
KT_DEV void kt_red_release_add(unsigned* p, unsigned v) {
#ifdef KT_EMULATION
  *p += v;
#else
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
#endif
}

// An atomic add with acquire-release order at GPU scope: after a block
// barrier, one thread's release also publishes what the block's other
// threads wrote before it (cumulativity), without a full fence.
KT_DEV int kt_atom_add_acq_rel(int* p, int v) {
#ifdef KT_EMULATION
  return atomicAdd(p, v);
#else
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
#endif
}

// Nanoseconds of the GPU's global timer (the host clock in the emulator).
KT_DEV unsigned long long kt_globaltimer() {
#ifdef KT_EMULATION
  return (unsigned long long)std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
#else
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
#endif
}

KT_DEV void kt_prefetch_l2(const void* p) {
#ifndef KT_EMULATION
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
#endif
}
// `bytes` (a multiple of 16, 16-byte aligned) into L2 through the copy
// engine: one instruction, nothing returned, no register or load slot held
// while it is in flight.
KT_DEV void kt_prefetch_l2_bulk(const void* p, unsigned bytes) {
#ifndef KT_EMULATION
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
#endif
}

// The block's dynamic shared memory.
KT_DEV unsigned char* kt_smem() {
#ifdef KT_EMULATION
  return kt_emu::g_launch->blocks[kt_emu::self().block].smem.data();
#else
  extern __shared__ __align__(16) unsigned char kt_dynamic_smem[];
  return kt_dynamic_smem;
#endif
}

// ---- reductions and math ------------------------------------------------------
KT_DEV float kt_warp_sum(float v) {
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}
KT_DEV float kt_warp_max(float v) {
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}

KT_DEV float kt_silu(float v) { return v / (1.0f + expf(-v)); }
KT_DEV float kt_sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }
KT_DEV float kt_softplus(float v) { return v > 20.0f ? v : log1pf(expf(v)); }

// ---- register split (sm_90a) ---------------------------------------------------------
// setmaxnreg: a warpgroup (all 4 of its warps, together) gives registers
// back to the SM's pool (dec) or takes more from it (inc, waiting until the
// pool has them), so a producer warpgroup that needs few lends its share to
// the consumers. N: a multiple of 8 in 24..256. Only an sm_90a build has
// the instruction; elsewhere (the emulator, a build for plain sm_90 such as
// PyTorch's extension builder may make) every thread keeps the launch's
// count, which is correct, only with fewer registers for the consumers.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) && !defined(KT_EMULATION)
#define KT_HAS_SETMAXNREG 1
#endif
template <int N>
KT_DEV void kt_setmaxnreg_dec() {
#ifdef KT_HAS_SETMAXNREG
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
#endif
}
template <int N>
KT_DEV void kt_setmaxnreg_inc() {
#ifdef KT_HAS_SETMAXNREG
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
#endif
}

// ---- block barrier -------------------------------------------------------------------
// The kernel's block-wide barrier. Where a kernel defines KT_SYNC_THREADS
// (its block has a loader warp past those threads that never waits with
// them), named barrier 1 among the first KT_SYNC_THREADS threads;
// otherwise __syncthreads.
KT_DEV void kt_block_sync() {
#if !defined(KT_SYNC_THREADS)
  __syncthreads();
#elif defined(KT_EMULATION)
  kt_emu::named_barrier(KT_SYNC_THREADS);
#else
  asm volatile("bar.sync 1, %0;" ::"n"(KT_SYNC_THREADS) : "memory");
#endif
}

// ---- grid-wide barrier -----------------------------------------------------------
// All blocks of a cooperative launch meet here. style 0: a counter and a
// generation number in global memory (the last block to arrive resets the
// counter and bumps the generation); style 1: cooperative groups' grid.sync;
// style 2: one monotonic counter, each block waits for it to reach its own
// target (one atomic per block, no reset on the way; kt_grid_exit resets it
// when the last block leaves the kernel).
struct KtGridBarrier {
  unsigned count;
  unsigned generation;
  unsigned exits;
  unsigned target;  // style 2: unused in memory (each block keeps its own), kept for layout
};

// Style 2 in two halves, so a block can work between its arrival and the
// grid's: kt_grid_arrive, then kt_grid_wait. The other styles do the whole
// barrier in kt_grid_arrive.
template <int style>
KT_DEV void kt_grid_sync(KtGridBarrier* bar, unsigned* target = nullptr);
template <int style>
KT_DEV void kt_grid_arrive(KtGridBarrier* bar, unsigned* target) {
  if (style != 2) {
    kt_grid_sync<style>(bar, target);
    return;
  }
  kt_block_sync();
  if (threadIdx.x == 0) {
    *target += gridDim.x;
    kt_red_release_add(&bar->count, 1u);
  }
}
template <int style>
KT_DEV void kt_grid_wait(KtGridBarrier* bar, const unsigned* target) {
  if (style != 2) return;
  if (threadIdx.x == 0)
    while (kt_ld_acquire(&bar->count) < *target) __nanosleep(8);
  kt_block_sync();
}

template <int style>
KT_DEV void kt_grid_sync(KtGridBarrier* bar, unsigned* target) {
#ifndef KT_EMULATION
  if (style == 1) {
    cooperative_groups::this_grid().sync();
    return;
  }
#endif
  if (style == 2) {
    kt_grid_arrive<2>(bar, target);
    kt_grid_wait<2>(bar, target);
    return;
  }
  kt_block_sync();
  if (threadIdx.x == 0) {
    volatile unsigned* gen = &bar->generation;
    unsigned seen = *gen;  // read before arriving: the last arriver bumps it only after everyone arrived
    __threadfence();
    if (atomicAdd(&bar->count, 1u) == gridDim.x - 1) {
      atomicExch(&bar->count, 0u);
      __threadfence();
      atomicAdd(&bar->generation, 1u);
    } else {
      while (*gen == seen) __nanosleep(32);
    }
    __threadfence();
  }
  kt_block_sync();
}

// Style 2's reset: the last block out of the kernel zeroes the counter for
// the next launch (no block polls it any more by then).
KT_DEV void kt_grid_exit(KtGridBarrier* bar) {
  kt_block_sync();
  if (threadIdx.x == 0 && atomicAdd(&bar->exits, 1u) == gridDim.x - 1) {
    atomicExch(&bar->count, 0u);
    atomicExch(&bar->exits, 0u);
  }
}
