// The contract between the trusted runner and a CUDA variant of the Kimi
// task. A variant is device code only (a cubin): it exports kernels named
// ktune_k0, ktune_k1, ... and a launch table saying which to launch, in
// order, with what shape, once per decode step. The runner owns every
// buffer, launches the table, times it and checks the outputs; the variant
// never runs host code. The same header compiles for the CPU emulator
// (kernels/emu), where the "device" pointers are host memory.
//
// Sizes are compile-time: the renderer prepends #defines KT_D, KT_KH, ...
// (see variants/) and the runner checks ktune_config against its task.
//
// A variant exports these __device__ globals, with C linkage (see the end
// of this file for the prepare table):
//   int ktune_abi_version                  KT_ABI_VERSION
//   int ktune_config[KT_CONFIG_FIELDS]     the sizes it was built for
//   long long ktune_scratch_bytes          variant-owned device memory it needs
//   int ktune_num_launches                 1..KT_MAX_LAUNCHES entries ...
//   KtLaunch ktune_launches[]              ... of the step's launch table
//   int ktune_num_prepare                  optional: 0..KT_MAX_PREPARE entries ...
//   KtLaunch ktune_prepare[]               ... of the once-per-load table
#pragma once
#include <stdint.h>

// 2: the optional prepare table (ktune_num_prepare, ktune_prepare).
// 3: KimiDeviceArgs::attn_out, each layer's attention output, validated.
// 4: KimiDeviceArgs::logits_out, each layer's router logits, validated.
#define KT_ABI_VERSION 4
// Version 1 is version 2 without the prepare table, version 2 is version 3
// without attn_out, and version 3 is version 4 without logits_out (fields
// added at the end, which an older kernel never reads), so the runner
// still loads them: sessions recorded before (their sources carry the old
// header) replay and resume; their attention outputs or logits go
// unchecked.
#define KT_ABI_OLDEST 1
#define KT_MAX_LAYERS 4
#define KT_MAX_LAUNCHES 4096
#define KT_MAX_PREPARE 64

// One W4A16 matrix: w_q [K/2, N] bytes, scales / zeros bf16 [K/128, N].
struct KtW4 {
  const uint8_t* w_q;
  const uint16_t* scales;
  const uint16_t* zeros;
};

struct KtKdaLayer {
  KtW4 q, k, v, g, o;
  const uint16_t* beta;    // bf16 [heads, hidden]
  const uint16_t* conv_w;  // bf16 [3, C, 4]
  float* S;                // fp32 [heads, 128, 128], updated in place
  uint16_t* win[3];        // bf16 [3, C] conv windows of q, k, v, updated in place
};

struct KtMlaLayer {
  KtW4 q, kv_a, kv_b, o;
  uint16_t* c_kv;    // bf16 [capacity, kv_lora]; row `context` is written by the step
  uint16_t* k_rope;  // bf16 [capacity, qk_rope]
};

struct KtMoeLayer {
  const uint16_t* router;  // bf16 [experts, hidden]
  KtW4 gate, up, down;     // stacks of n_experts (pointers to expert 0)
  KtW4 s_gate, s_up, s_down;
};

struct KtLayer {
  const uint16_t* attn_norm;
  const uint16_t* moe_norm;
  KtKdaLayer kda;
  KtMlaLayer mla;
  KtMoeLayer moe;
};

struct KimiDeviceArgs {
  KtLayer layers[KT_MAX_LAYERS];
  const uint16_t* x_in;  // bf16 [hidden], the token's hidden state
  uint16_t* x_out;       // bf16 [hidden], the block's output
  int context;           // cached rows before this step = the new token's position
  int* topk_out;         // int [layers][n_active]: the routed experts, best first
  uint8_t* scratch;      // ktune_scratch_bytes of variant-owned memory, zeroed once at load
  float* trace;          // nullptr, or a zeroed buffer of KT_TRACE_WORDS 64-bit words for profile
                         // stamps (KT_PROFILE builds): [count, tag, ns, tag, ns, ...] for block 0's
                         // points, then each block's arrival time at each grid barrier (below)
  // nullptr, or bf16 [layers][KT_ATTN_OUT_STRIDE]: each layer's attention
  // output, the input of its o_proj (KDA: o over heads x head_dim; MLA: o
  // over heads x v_head), from the start of its row. The hidden output alone
  // does not show the MLA attention on random caches: dropping it moved the
  // hidden's cosine by 3e-6 (RESULTS.md, "How much the validation sees of
  // the attention"). The runner sets it for every step, timed ones included,
  // so the validated kernel is the timed one.
  uint16_t* attn_out;
  // nullptr, or bf16 [layers][n_experts]: each layer's router logits as the
  // kernel ranked them. A kernel may pick other experts than the oracle
  // where two logits nearly tie; its own logits tell a tie broken the other
  // way by rounding (its experts are the top-k of its logits, and they
  // match the oracle's logits as closely as any output must) from a wrong
  // choice (measure/validate.h). Set, like attn_out, for every step.
  uint16_t* logits_out;
};
// The row length of attn_out: the larger of the two attentions' outputs.
#define KT_ATTN_OUT_STRIDE(kda_dim, mla_o) ((kda_dim) > (mla_o) ? (kda_dim) : (mla_o))

// The profile trace: block 0 writes up to KT_TRACE_STAMPS (tag, ns) pairs
// after the count word; from word KT_TRACE_ARRIVALS on, block b's arrival at
// the k-th grid barrier of the launch is at KT_TRACE_ARRIVALS + k *
// KT_TRACE_MAX_BLOCKS + b (0: not written), where k counts the barriers and
// the events every block records (the MoE routing's), in launch order. The
// arrivals show which blocks a phase waits for, which block 0's stamps alone
// cannot.
#define KT_TRACE_STAMPS 511
#define KT_TRACE_ARRIVALS 1024
#define KT_TRACE_MAX_BARRIERS 64
#define KT_TRACE_MAX_BLOCKS 512
#define KT_TRACE_WORDS (KT_TRACE_ARRIVALS + KT_TRACE_MAX_BARRIERS * KT_TRACE_MAX_BLOCKS)

// The arguments a launch-table entry adds (a kernel reused for several
// operations reads which one from here).
struct KtLaunchArgs {
  int a[4];
};

// grid > 0: that many blocks; 0: every SM times the number of blocks that
// fit on one (what a cooperative launch allows); -n: n per SM.
struct KtLaunch {
  int kernel;       // the N of ktune_kN
  int grid;
  int block;
  int smem;         // dynamic shared memory bytes
  int cooperative;  // 1: cooperative launch (grid-wide barriers inside)
  KtLaunchArgs args;
};

// ktune_config holds, in this order, the sizes the variant was built for.
#define KT_CONFIG_FIELDS 15
// {hidden, kda_heads, kda_head_dim, mla_heads, kv_lora, qk_nope, qk_rope,
//  v_head, n_experts, n_active, n_shared, moe_inter, group, layers,
//  pattern bits (bit i set = layer i is M)}

// ---- The prepare table: once per load, never timed ----------------------
// The task spec lets a fast implementation "repack the weights once, when
// they are loaded (outside the timed step), into whatever layout its kernel
// streams best". A variant does that with a second launch table, optional:
//
//   extern "C" {
//   __device__ int ktune_num_prepare = 1;        // 0..KT_MAX_PREPARE
//   __device__ KtLaunch ktune_prepare[1] = {{2, -1, 256, 0, 0, {{0, 0, 0, 0}}}};
//   }
//
// Entries have the format of ktune_launches (same kernels ktune_kN, same
// grid rules, same kernel parameters: a KimiDeviceArgs and the entry's
// KtLaunchArgs). A variant that exports neither symbol has no prepare step;
// a count outside 0..KT_MAX_PREPARE, or a count without the table, is a load
// error (launch_error) naming the symbol.
//
// What the runner guarantees:
//  - it launches the table in order, each launch finished before the next,
//    after the variant is loaded and its scratch zeroed, and before any step;
//  - again, on zeroed scratch, whenever the weights are (re)made resident
//    while the variant is loaded, so scratch never holds a function of other
//    weights than the step's;
//  - the launches are never timed and never counted as the step's launches.
// What a prepare kernel sees: the weights (read-only) and `scratch`, nothing
// else. Everything the step brings (x_in, x_out, context, topk_out,
// attn_out, the KDA state S and windows, the MLA caches, trace) is null or 0
// then: it is not set yet, and changes with every step. So the only thing a
// prepare table can do is write a function of the weights alone (a repacked
// copy of a matrix, precomputed scales, ...) into scratch, which the step's
// kernels then read. It is untrusted variant code like the rest: a prepare
// kernel that faults or hangs is the attempt's device_fault or timeout, and
// it cannot touch the step's timing or its validation (the runner writes
// the inputs and the state, and poisons the outputs, after it has run).
