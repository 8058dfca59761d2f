// Kimi-Linear decode baseline for CUDA: one kernel per operation, the way a
// careful PyTorch eager implementation runs it. Every W4A16 matrix is first
// dequantized to a dense bf16 matrix in memory, then multiplied by a plain
// GEMV; norms, conv, the KDA update, attention steps, top-k and residuals
// are kernels of their own. This is the floor a megakernel must beat; the
// runner times it with the same method, in the same process.
//
// The sequence of launches is a compile-time table (ktune_launches) built
// by make_table() below; kernels find their operands by the table's
// arguments (layer, matrix, buffer offsets). Activations live in scratch as
// fp32, holding exactly the bf16 values wherever the spec rounds.
#include "kernels/kimi/cuda/abi.h"
#include "kernels/kimi/cuda/common.cuh"
#include "kernels/kimi/topk.h"

namespace base {

constexpr int D = KT_D, KH = KT_KH, KD = KT_KD, C = KH * KD;
constexpr int MH = KT_MH, R = KT_R, NOPE = KT_NOPE, ROPE = KT_ROPE, VH = KT_VH, QH = NOPE + ROPE;
constexpr int QDIM = MH * QH, KVA = R + ROPE, KVB = MH * (NOPE + VH), MO = MH * VH;
constexpr int E = KT_E, TOPK = KT_TOPK, NSH = KT_NSH, I = KT_I, G = KT_G, LAYERS = KT_LAYERS;
constexpr int SLOTS = TOPK + NSH;
constexpr int kMaxRows = 65536;  // longest cache the baseline's score buffer holds
constexpr int cmax(int a, int b) { return a > b ? a : b; }
constexpr int kAttnOutStride = KT_ATTN_OUT_STRIDE(C, MO);

// Scratch layout, in floats.
enum : long long {
  XF = 0,                       // the layer input
  H = XF + D,                   // after attention
  XN = H + D,                   // a normalized input
  Q = XN + D, K = Q + C, V = K + C, GR = V + C, BETA = GR + C, O = BETA + cmax(KH, 4),
  MQ = O + C, KV = MQ + QDIM, QABS = KV + KVA, OL = QABS + MH * R, MOUT = OL + MH * R,
  LOGIT = MOUT + MO, TOPW = LOGIT + E, TOPI = TOPW + TOPK, GU = TOPI + TOPK,
  ACT = GU + SLOTS * 2 * I, Y = ACT + I, ATT = Y + D,
  SCORES = ATT + D, WBUF = SCORES + (long long)MH * kMaxRows,  // bf16 dense weights from here
  FLOATS = WBUF + (cmax(cmax(D * C, D * QDIM), cmax(R * KVB, cmax(MO * D, D * I))) + 1) / 2
};

// Matrix ids.
enum { MQP, MKP, MVP, MGP, MOP, MLQ, MLKVA, MLKVB, MLO, EGATE, EUP, EDOWN, SGATE, SUP, SDOWN };

struct Dims {
  int K, N;
};
KT_DEV Dims dims(int m) {
  switch (m) {
    case MQP: case MKP: case MVP: case MGP: return {D, C};
    case MOP: return {C, D};
    case MLQ: return {D, QDIM};
    case MLKVA: return {D, KVA};
    case MLKVB: return {R, KVB};
    case MLO: return {MO, D};
    case EGATE: case EUP: case SGATE: case SUP: return {D, I};
    default: return {I, D};  // EDOWN, SDOWN
  }
}

KT_DEV float* F(const KimiDeviceArgs& a) { return reinterpret_cast<float*>(a.scratch); }
KT_DEV uint16_t* Wbuf(const KimiDeviceArgs& a) { return reinterpret_cast<uint16_t*>(F(a) + WBUF); }
KT_DEV int slot_expert(const KimiDeviceArgs& a, int slot) { return __float_as_uint(F(a)[TOPI + slot]); }

// The W4A16 matrix `m` of a layer (for experts: slot j's expert).
KT_DEV KtW4 matrix(const KimiDeviceArgs& a, int layer, int m, int slot) {
  const KtLayer& L = a.layers[layer];
  auto expert = [&](const KtW4& w, size_t e, int K, int N) {
    return KtW4{w.w_q + e * (K / 2) * N, w.scales + e * (K / G) * N, w.zeros + e * (K / G) * N};
  };
  switch (m) {
    case MQP: return L.kda.q;
    case MKP: return L.kda.k;
    case MVP: return L.kda.v;
    case MGP: return L.kda.g;
    case MOP: return L.kda.o;
    case MLQ: return L.mla.q;
    case MLKVA: return L.mla.kv_a;
    case MLKVB: return L.mla.kv_b;
    case MLO: return L.mla.o;
    case EGATE: return expert(L.moe.gate, slot_expert(a, slot), D, I);
    case EUP: return expert(L.moe.up, slot_expert(a, slot), D, I);
    case EDOWN: return expert(L.moe.down, slot_expert(a, slot), I, D);
    case SGATE: return expert(L.moe.s_gate, slot, D, I);
    case SUP: return expert(L.moe.s_up, slot, D, I);
    default: return expert(L.moe.s_down, slot, I, D);
  }
}

KT_DEV int gtid() { return int(blockIdx.x * blockDim.x + threadIdx.x); }

}  // namespace base

using namespace base;

// k0: the token into the fp32 residual stream (a[0] = 1: the final output to x_out instead).
extern "C" __global__ void ktune_k0(const __grid_constant__ KimiDeviceArgs a, const KtLaunchArgs la) {
  for (int i = gtid(); i < D; i += gridDim.x * blockDim.x) {
    if (la.a[0] == 0) F(a)[XF + i] = kt_bf2f(a.x_in[i]);
    else a.x_out[i] = kt_f2bf(F(a)[XF + i]);
  }
}

// k1: RMSNorm of scratch[a0] into XN with layer a1's norm a2 (0 attn, 1 moe). One block.
extern "C" __global__ void ktune_k1(const __grid_constant__ KimiDeviceArgs a, const KtLaunchArgs la) {
  float* red = reinterpret_cast<float*>(kt_smem());
  const float* x = F(a) + la.a[0];
  const uint16_t* w = la.a[2] == 0 ? a.layers[la.a[1]].attn_norm : a.layers[la.a[1]].moe_norm;
  float ss = 0;
  for (int i = threadIdx.x; i < D; i += blockDim.x) ss += x[i] * x[i];
  ss = kt_warp_sum(ss);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = ss;
  __syncthreads();
  float t = 0;
  for (int wi = 0; wi < int(blockDim.x / 32); ++wi) t += red[wi];
  const float inv = rsqrtf(t / float(D) + float(KT_EPS));
  for (int i = threadIdx.x; i < D; i += blockDim.x) F(a)[XN + i] = kt_round_bf16(x[i] * inv * kt_bf2f(w[i]));
}

// k2: dequantize matrix a1 of layer a0 (expert slot a2) to dense bf16 in WBUF.
extern "C" __global__ void ktune_k2(const __grid_constant__ KimiDeviceArgs a, const KtLaunchArgs la) {
  const Dims d = dims(la.a[1]);
  const KtW4 w = matrix(a, la.a[0], la.a[1], la.a[2]);
  const long long bytes = (long long)(d.K / 2) * d.N;
  for (long long i = gtid(); i < bytes; i += (long long)gridDim.x * blockDim.x) {
    const int rp = int(i / d.N), n = int(i % d.N);
    const size_t sz = size_t(2 * rp / G) * d.N + n;
    const uint32_t s = w.scales[sz], z = kt_f2bf(128.0f + kt_bf2f(w.zeros[sz]));
    const uint32_t pr = kt_dequant_pair(kt_nibble_pair(w.w_q[i], w.w_q[i] >> 4, 0), z | (z << 16), s | (s << 16));
    Wbuf(a)[size_t(2 * rp) * d.N + n] = uint16_t(pr & 0xffff);
    Wbuf(a)[size_t(2 * rp + 1) * d.N + n] = uint16_t(pr >> 16);
  }
}

// k3: y = x @ WBUF for matrix id a2: x = scratch[a0], y = scratch[a1].
// a3 bit 0: round y to bf16; bit 1: accumulate into y instead of storing.
extern "C" __global__ void ktune_k3(const __grid_constant__ KimiDeviceArgs a, const KtLaunchArgs la) {
  const Dims d = dims(la.a[2]);
  const int n = gtid();
  if (n >= d.N) return;
  const float* x = F(a) + la.a[0];
  const uint16_t* W = Wbuf(a);
  float acc = 0;
  for (int k = 0; k < d.K; ++k) acc += x[k] * kt_bf2f(W[size_t(k) * d.N + n]);
  float* y = F(a) + la.a[1] + n;
  if (la.a[3] & 1) acc = kt_round_bf16(acc);
  *y = (la.a[3] & 2) ? *y + acc : acc;
}

// k4: short conv + SiLU of q, k, v of layer a0, in place; windows shift.
extern "C" __global__ void ktune_k4(const __grid_constant__ KimiDeviceArgs a, const KtLaunchArgs la) {
  const KtKdaLayer& L = a.layers[la.a[0]].kda;
  for (int i = gtid(); i < 3 * C; i += gridDim.x * blockDim.x) {
    const int m = i / C, n = i % C;
    float* v = F(a) + (m == 0 ? Q : m == 1 ? K : V) + n;
    uint16_t* win = L.win[m];
    const uint16_t* cw = L.conv_w + (size_t(m) * C + n) * 4;
    const uint16_t raw = kt_f2bf(*v);
    const float s = kt_bf2f(win[n]) * kt_bf2f(cw[0]) + kt_bf2f(win[C + n]) * kt_bf2f(cw[1]) +
                    kt_bf2f(win[2 * C + n]) * kt_bf2f(cw[2]) + kt_bf2f(raw) * kt_bf2f(cw[3]);
    *v = kt_round_bf16(kt_silu(s));
    win[n] = win[C + n];
    win[C + n] = win[2 * C + n];
    win[2 * C + n] = raw;
  }
}

// k5: bf16-weight rows: a1 = 0 beta (KH rows), 1 router (E rows) of layer a0;
// out[r] = bf16(XN . w[r]) into scratch[a2]. One warp per row.
extern "C" __global__ void ktune_k5(const __grid_constant__ KimiDeviceArgs a, const KtLaunchArgs la) {
  const int rows = la.a[1] == 0 ? KH : E;
  const uint16_t* w = la.a[1] == 0 ? a.layers[la.a[0]].kda.beta : a.layers[la.a[0]].moe.router;
  const int r = gtid() / 32, lane = threadIdx.x & 31;
  if (r >= rows) return;
  float acc = 0;
  for (int k = lane; k < D; k += 32) acc += F(a)[XN + k] * kt_bf2f(w[size_t(r) * D + k]);
  acc = kt_warp_sum(acc);
  if (lane == 0) F(a)[la.a[2] + r] = kt_round_bf16(acc);
}

// k6: the KDA delta-rule update of layer a0: one block per head, a thread per value column.
extern "C" __global__ void ktune_k6(const __grid_constant__ KimiDeviceArgs a, const KtLaunchArgs la) {
  const int h = blockIdx.x, j = threadIdx.x;
  float* S = a.layers[la.a[0]].kda.S + size_t(h) * KD * KD;
  const float* q = F(a) + Q + h * KD;
  const float* k = F(a) + K + h * KD;
  const float* g = F(a) + GR + h * KD;
  const float beta = kt_sigmoid(F(a)[BETA + h]);
  float pred = 0;
  for (int i = 0; i < KD; ++i) {
    const float s = S[size_t(i) * KD + j] * expf(-kt_softplus(g[i]));
    S[size_t(i) * KD + j] = s;
    pred += s * k[i];
  }
  const float delta = beta * (F(a)[V + h * KD + j] - pred);
  float o = 0;
  for (int i = 0; i < KD; ++i) {
    const float s = S[size_t(i) * KD + j] + k[i] * delta;
    S[size_t(i) * KD + j] = s;
    o += s * q[i] * 0.08838834764831845f;
  }
  F(a)[O + h * KD + j] = kt_round_bf16(o);
  if (a.attn_out) a.attn_out[size_t(la.a[0]) * kAttnOutStride + h * KD + j] = kt_f2bf(o);
}

// k7: scratch[a2] = bf16(scratch[a0] + bf16(scratch[a1])) over D.
extern "C" __global__ void ktune_k7(const __grid_constant__ KimiDeviceArgs a, const KtLaunchArgs la) {
  for (int i = gtid(); i < D; i += gridDim.x * blockDim.x)
    F(a)[la.a[2] + i] = kt_round_bf16(F(a)[la.a[0] + i] + kt_round_bf16(F(a)[la.a[1] + i]));
}

// k8: softmax + top-k of layer a0's router logits (PyTorch's order), the
// routing weights, and zeroes the MoE accumulator. One block.
extern "C" __global__ void ktune_k8(const __grid_constant__ KimiDeviceArgs a, const KtLaunchArgs la) {
  for (int i = threadIdx.x; i < D; i += blockDim.x) F(a)[Y + i] = 0;
  if (threadIdx.x != 0) return;
  float lv[E];
  int idx[TOPK];
  ktune::kimi::topk_detail::Item items[E];
  float mx = -INFINITY;
  for (int e = 0; e < E; ++e) {
    mx = fmaxf(mx, lv[e] = F(a)[LOGIT + e]);
    if (a.logits_out) a.logits_out[la.a[0] * E + e] = kt_f2bf(lv[e]);
  }
  float total = 0;
  for (int e = 0; e < E; ++e) total += expf(lv[e] - mx);
  ktune::kimi::torch_topk(lv, E, TOPK, idx, items);
  float wsum = 0;
  for (int j = 0; j < TOPK; ++j) wsum += expf(lv[idx[j]] - mx) / total;
  for (int j = 0; j < TOPK; ++j) {
    F(a)[TOPI + j] = __uint_as_float(unsigned(idx[j]));
    F(a)[TOPW + j] = expf(lv[idx[j]] - mx) / total / (wsum + 1e-9f) * float(KT_SCALING);
    if (a.topk_out) a.topk_out[la.a[0] * TOPK + j] = idx[j];
  }
}

// k9: ACT = silu(gate) * up * w for expert slot a0 (w = 1 for shared slots).
extern "C" __global__ void ktune_k9(const __grid_constant__ KimiDeviceArgs a, const KtLaunchArgs la) {
  const int s = la.a[0];
  const float w = s < TOPK ? F(a)[TOPW + s] : 1.0f;
  for (int i = gtid(); i < I; i += gridDim.x * blockDim.x)
    F(a)[ACT + i] = kt_silu(F(a)[GU + (s * 2) * I + i]) * F(a)[GU + (s * 2 + 1) * I + i] * w;
}

// k10: RoPE of layer a0's q rope parts (in MQ) and k rope part (in KV), and
// the new cache row appended at position `context`.
extern "C" __global__ void ktune_k10(const __grid_constant__ KimiDeviceArgs a, const KtLaunchArgs la) {
  const KtMlaLayer& L = a.layers[la.a[0]].mla;
  const int pos = a.context;
  for (int i = gtid(); i < (MH + 1) * (ROPE / 2) + R; i += gridDim.x * blockDim.x) {
    if (i >= (MH + 1) * (ROPE / 2)) {
      const int c = i - (MH + 1) * (ROPE / 2);
      L.c_kv[size_t(pos) * R + c] = kt_f2bf(F(a)[KV + c]);
      continue;
    }
    const int h = i / (ROPE / 2), p = i % (ROPE / 2);
    float* x = h < MH ? F(a) + MQ + h * QH + NOPE + 2 * p : F(a) + KV + R + 2 * p;
    double s, co;
    sincos(double(pos) * pow(double(KT_ROPE_THETA), -2.0 * p / ROPE), &s, &co);
    const double x0 = x[0], x1 = x[1];
    x[0] = kt_round_bf16(float(x0 * co - x1 * s));
    x[1] = kt_round_bf16(float(x1 * co + x0 * s));
    if (h == MH) {
      L.k_rope[size_t(pos) * ROPE + 2 * p] = kt_f2bf(x[0]);
      L.k_rope[size_t(pos) * ROPE + 2 * p + 1] = kt_f2bf(x[1]);
    }
  }
}

// k11: q_abs[h][r] = sum_d kv_b[r][h*(NOPE+VH)+d] q_nope[h][d], scaled by 192^-0.5 (kv_b dense in WBUF).
extern "C" __global__ void ktune_k11(const __grid_constant__ KimiDeviceArgs a, const KtLaunchArgs) {
  const int i = gtid();
  if (i >= MH * R) return;
  const int h = i / R, r = i % R;
  float acc = 0;
  for (int d = 0; d < NOPE; ++d)
    acc += kt_bf2f(Wbuf(a)[size_t(r) * KVB + h * (NOPE + VH) + d]) * F(a)[MQ + h * QH + d];
  F(a)[QABS + i] = acc * 0.07216878364870322f;
}

// k12: scores[h][t] for every cached row t <= context.
extern "C" __global__ void ktune_k12(const __grid_constant__ KimiDeviceArgs a, const KtLaunchArgs la) {
  const KtMlaLayer& L = a.layers[la.a[0]].mla;
  const int rows = a.context + 1;
  for (int i = gtid(); i < rows * MH; i += gridDim.x * blockDim.x) {
    const int t = i / MH, h = i % MH;
    float s = 0;
    for (int r = 0; r < R; ++r) s += F(a)[QABS + h * R + r] * kt_bf2f(L.c_kv[size_t(t) * R + r]);
    for (int p = 0; p < ROPE; ++p)
      s += F(a)[MQ + h * QH + NOPE + p] * 0.07216878364870322f * kt_bf2f(L.k_rope[size_t(t) * ROPE + p]);
    F(a)[SCORES + (long long)h * kMaxRows + t] = s;
  }
}

// k13: softmax over rows, per head (one block per head), in place.
extern "C" __global__ void ktune_k13(const __grid_constant__ KimiDeviceArgs a, const KtLaunchArgs) {
  float* red = reinterpret_cast<float*>(kt_smem());
  float* s = F(a) + SCORES + (long long)blockIdx.x * kMaxRows;
  const int rows = a.context + 1;
  float mx = -INFINITY;
  for (int t = threadIdx.x; t < rows; t += blockDim.x) mx = fmaxf(mx, s[t]);
  mx = kt_warp_max(mx);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = mx;
  __syncthreads();
  mx = -INFINITY;
  for (int w = 0; w < int(blockDim.x / 32); ++w) mx = fmaxf(mx, red[w]);
  __syncthreads();
  float sum = 0;
  for (int t = threadIdx.x; t < rows; t += blockDim.x) sum += (s[t] = expf(s[t] - mx));
  sum = kt_warp_sum(sum);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = sum;
  __syncthreads();
  sum = 0;
  for (int w = 0; w < int(blockDim.x / 32); ++w) sum += red[w];
  for (int t = threadIdx.x; t < rows; t += blockDim.x) s[t] /= sum;
}

// k14: o_lat[h][r] = sum_t p[h][t] c_kv[t][r].
extern "C" __global__ void ktune_k14(const __grid_constant__ KimiDeviceArgs a, const KtLaunchArgs la) {
  const KtMlaLayer& L = a.layers[la.a[0]].mla;
  const int i = gtid();
  if (i >= MH * R) return;
  const int h = i / R, r = i % R;
  const float* p = F(a) + SCORES + (long long)h * kMaxRows;
  float acc = 0;
  for (int t = 0; t <= a.context; ++t) acc += p[t] * kt_bf2f(L.c_kv[size_t(t) * R + r]);
  F(a)[OL + i] = acc;
}

// k15: o[h][d] = bf16(sum_r o_lat[h][r] kv_b[r][h*(NOPE+VH)+NOPE+d]) (kv_b dense in WBUF)
// of layer a0.
extern "C" __global__ void ktune_k15(const __grid_constant__ KimiDeviceArgs a, const KtLaunchArgs la) {
  const int i = gtid();
  if (i >= MO) return;
  const int h = i / VH, d = i % VH;
  float acc = 0;
  for (int r = 0; r < R; ++r) acc += F(a)[OL + h * R + r] * kt_bf2f(Wbuf(a)[size_t(r) * KVB + h * (NOPE + VH) + NOPE + d]);
  F(a)[MOUT + i] = kt_round_bf16(acc);
  if (a.attn_out) a.attn_out[size_t(la.a[0]) * kAttnOutStride + i] = kt_f2bf(acc);
}

// ---- the launch table -----------------------------------------------------------
namespace base {

constexpr int kMaxEntries = 512;
struct Table {
  KtLaunch e[kMaxEntries];
  int n;
};

constexpr int blocks(long long threads, int per = 256) { return int((threads + per - 1) / per); }

constexpr void push(Table& t, int k, int grid, int block, int smem, int a0 = 0, int a1 = 0, int a2 = 0, int a3 = 0) {
  t.e[t.n] = KtLaunch{k, grid, block, smem, 0, {{a0, a1, a2, a3}}};
  ++t.n;
}

// dequantize + GEMV of matrix m (expert slot s): x = scratch[in], y = scratch[out].
constexpr void linear(Table& t, int layer, int m, int s, long long in, long long out, int flags) {
  int K = 0, N = 0;
  switch (m) {
    case MQP: case MKP: case MVP: case MGP: K = D; N = C; break;
    case MOP: K = C; N = D; break;
    case MLQ: K = D; N = QDIM; break;
    case MLKVA: K = D; N = KVA; break;
    case MLO: K = MO; N = D; break;
    case EGATE: case EUP: case SGATE: case SUP: K = D; N = I; break;
    default: K = I; N = D;
  }
  push(t, 2, blocks((long long)(K / 2) * N), 256, 0, layer, m, s);
  push(t, 3, blocks(N), 256, 0, int(in), int(out), m, flags);
}

constexpr Table make_table() {
  Table t{};
  push(t, 0, blocks(D), 256, 0, 0);
  for (int layer = 0; layer < LAYERS; ++layer) {
    push(t, 1, 1, 1024, 128, XF, layer, 0);
    if (((KT_PATTERN_M >> layer) & 1) == 0) {
      linear(t, layer, MQP, 0, XN, Q, 1);
      linear(t, layer, MKP, 0, XN, K, 1);
      linear(t, layer, MVP, 0, XN, V, 1);
      linear(t, layer, MGP, 0, XN, GR, 1);
      push(t, 5, blocks(KH * 32), 256, 0, layer, 0, BETA);
      push(t, 4, blocks(3 * C), 256, 0, layer);
      push(t, 6, KH, KD, 0, layer);
      linear(t, layer, MOP, 0, O, ATT, 1);
    } else {
      linear(t, layer, MLQ, 0, XN, MQ, 1);
      linear(t, layer, MLKVA, 0, XN, KV, 1);
      push(t, 10, blocks((MH + 1) * (ROPE / 2) + R), 256, 0, layer);
      push(t, 2, blocks((long long)(R / 2) * KVB), 256, 0, layer, MLKVB, 0);
      push(t, 11, blocks(MH * R), 256, 0, layer);
      push(t, 12, 1024, 256, 0, layer);
      push(t, 13, MH, 1024, 128, layer);
      push(t, 14, blocks(MH * R), 256, 0, layer);
      push(t, 15, blocks(MO), 256, 0, layer);
      linear(t, layer, MLO, 0, MOUT, ATT, 1);
    }
    push(t, 7, blocks(D), 256, 0, XF, ATT, H);
    push(t, 1, 1, 1024, 128, H, layer, 1);
    push(t, 5, blocks(E * 32), 256, 0, layer, 1, LOGIT);
    push(t, 8, 1, 256, 0, layer);
    for (int s = 0; s < SLOTS; ++s) {
      const bool shared = s >= TOPK;
      linear(t, layer, shared ? SGATE : EGATE, shared ? s - TOPK : s, XN, GU + (s * 2) * I, 0);
      linear(t, layer, shared ? SUP : EUP, shared ? s - TOPK : s, XN, GU + (s * 2 + 1) * I, 0);
      push(t, 9, blocks(I), 256, 0, s);
      linear(t, layer, shared ? SDOWN : EDOWN, shared ? s - TOPK : s, ACT, Y, 2);
    }
    push(t, 7, blocks(D), 256, 0, H, Y, XF);
  }
  push(t, 0, blocks(D), 256, 0, 1);
  return t;
}

constexpr Table kTable = make_table();
static_assert(kTable.n <= kMaxEntries, "launch table overflow");
static_assert(FLOATS < (1ll << 31), "scratch offsets must fit the launch table's ints");

}  // namespace base

extern "C" {
__device__ int ktune_abi_version = KT_ABI_VERSION;
__device__ int ktune_config[KT_CONFIG_FIELDS] = {KT_D, KT_KH, KT_KD, KT_MH, KT_R, KT_NOPE, KT_ROPE, KT_VH,
                                                 KT_E, KT_TOPK, KT_NSH, KT_I, KT_G, KT_LAYERS, KT_PATTERN_M};
__device__ long long ktune_scratch_bytes = base::FLOATS * 4;
__device__ int ktune_num_launches = base::kTable.n;
__device__ base::Table ktune_launches = base::kTable;
}

KT_KERNEL_TABLE_BEGIN
KT_KERNEL(ktune_k0) KT_KERNEL(ktune_k1) KT_KERNEL(ktune_k2) KT_KERNEL(ktune_k3) KT_KERNEL(ktune_k4)
KT_KERNEL(ktune_k5) KT_KERNEL(ktune_k6) KT_KERNEL(ktune_k7) KT_KERNEL(ktune_k8) KT_KERNEL(ktune_k9)
KT_KERNEL(ktune_k10) KT_KERNEL(ktune_k11) KT_KERNEL(ktune_k12) KT_KERNEL(ktune_k13) KT_KERNEL(ktune_k14)
KT_KERNEL(ktune_k15)
KT_KERNEL_TABLE_END
