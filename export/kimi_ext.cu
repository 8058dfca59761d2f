// kimi_ext.cu: the host side of an exported ktune megakernel, built by
// PyTorch's extension builder (solution.py does it on first use). It
// compiles the rendered variant (kernel.cu, beside this file) into the same
// translation unit, reads the kernel's own launch table and scratch size
// from its exported globals, binds the weight tensors once, and launches
// ktune_k0 exactly once per step() with cudaLaunchCooperativeKernel on the
// current PyTorch stream. The entry points are PyTorch operators
// (TORCH_LIBRARY), not a pybind11 module, so building needs PyTorch's C++
// headers but not Python's.
//
// Defining KIMI_EXT_LAUNCHER_ONLY leaves out everything that needs PyTorch's
// headers, so the kernel and the launcher compile with plain nvcc (ktune's
// own tests do that on machines without PyTorch).
#ifndef KIMI_EXT_LAUNCHER_ONLY
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>
#endif

#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "kernel.cu"

namespace kimi_ext {

// How to launch the variant on one device, from its exported globals.
struct LaunchPlan {
  KtLaunch launch{};
  int grid = 0;                  // resolved from the table's entry and the device
  long long scratch_bytes = 0;   // variant-owned memory, zeroed once
  int config[KT_CONFIG_FIELDS];  // the sizes the kernel was built for (see abi.h)
};

std::string cuda_message(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

// Fills `plan` for the current device; returns "" or what is wrong.
std::string plan_launch(LaunchPlan* plan) {
  int device = 0, sms = 0;
  cudaError_t e;
  // The launch table and sizes come from the included kernel at compile
  // time: kernels that declare their tables `extern "C" __device__ T x = ...`
  // get no host shadow in a host+device translation unit, so the symbols
  // cannot be read here: the megakernel keeps its entries as constants
  // for this (mk::kStepLaunch, mk::kScratchBytes).
  const int abi = KT_ABI_VERSION, launches = 1;
  plan->launch = mk::kStepLaunch;
  plan->scratch_bytes = mk::kScratchBytes;
  const int config[KT_CONFIG_FIELDS] = {KT_D, KT_KH, KT_KD, KT_MH, KT_R, KT_NOPE, KT_ROPE, KT_VH,
                                        KT_E, KT_TOPK, KT_NSH, KT_I, KT_G, KT_LAYERS, KT_PATTERN_M};
  for (int i = 0; i < KT_CONFIG_FIELDS; ++i) plan->config[i] = config[i];
  if (abi != KT_ABI_VERSION) return "the kernel speaks ABI " + std::to_string(abi) + ", this wrapper " +
                                    std::to_string(KT_ABI_VERSION);
  if (launches != 1 || plan->launch.kernel != 0)
    return "the variant's launch table has " + std::to_string(launches) +
           " entries; an exported module runs exactly one launch of ktune_k0";
  const KtLaunch& l = plan->launch;
  if (l.smem > 48 * 1024 &&
      (e = cudaFuncSetAttribute(ktune_k0, cudaFuncAttributeMaxDynamicSharedMemorySize, l.smem)) != cudaSuccess)
    return cuda_message(("giving ktune_k0 " + std::to_string(l.smem) + " bytes of shared memory").c_str(), e);
  int per_sm = 0;
  if ((e = cudaGetDevice(&device)) != cudaSuccess ||
      (e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess ||
      (e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, ktune_k0, l.block, size_t(l.smem))) != cudaSuccess)
    return cuda_message("querying the occupancy of ktune_k0", e);
  // grid > 0: that many blocks; 0: all that fit; -n: n per SM (abi.h).
  plan->grid = l.grid > 0 ? l.grid : (l.grid == 0 ? per_sm * sms : -l.grid * sms);
  if (plan->grid < 1 || (l.cooperative && plan->grid > per_sm * sms))
    return "a cooperative grid of " + std::to_string(plan->grid) + " blocks of " + std::to_string(l.block) +
           " threads cannot run here (" + std::to_string(per_sm) + " fit per SM x " + std::to_string(sms) + " SMs)";
  return "";
}

// The step's one launch. The arguments travel by value (a __grid_constant__
// parameter), so `args` may change right after the call.
cudaError_t launch_step(const LaunchPlan& plan, const KimiDeviceArgs& args, cudaStream_t stream) {
  KimiDeviceArgs a = args;
  KtLaunchArgs la = plan.launch.args;
  void* params[] = {&a, &la};
  if (plan.launch.cooperative)
    return cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(ktune_k0), dim3(plan.grid),
                                       dim3(plan.launch.block), params, size_t(plan.launch.smem), stream);
  return cudaLaunchKernel(reinterpret_cast<const void*>(ktune_k0), dim3(plan.grid), dim3(plan.launch.block), params,
                          size_t(plan.launch.smem), stream);
}

// The prepare table's launch (variants whose `feed` reads repacked weights,
// which ktune_k1 repacks into the scratch, or whose `numbering` is prepare
// or items, whose plans and items it makes), once after the scratch is
// zeroed and the weights are bound: the template's entry
// (mk::kPrepareLaunch, n blocks per SM). Nothing for others.
cudaError_t launch_prepare(const KimiDeviceArgs& args, cudaStream_t stream) {
#if KT_HAS_PREPARE
  int device = 0, sms = 0;
  cudaError_t e;
  if ((e = cudaGetDevice(&device)) != cudaSuccess ||
      (e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess)
    return e;
  KimiDeviceArgs a = args;
  KtLaunchArgs la{};
  void* params[] = {&a, &la};
  const KtLaunch& l = mk::kPrepareLaunch;
  return cudaLaunchKernel(reinterpret_cast<const void*>(ktune_k1), dim3(-l.grid * sms), dim3(l.block), params,
                          size_t(l.smem), stream);
#else
  (void)args;
  (void)stream;
  return cudaSuccess;
#endif
}

}  // namespace kimi_ext

#ifndef KIMI_EXT_LAUNCHER_ONLY

namespace kimi_ext {

constexpr int kLayers = KT_LAYERS;
constexpr bool is_mla(int layer) { return (KT_PATTERN_M >> layer) & 1; }

// What bind() packs into a CPU byte tensor (Python keeps it) and step()
// reads back: how to launch, and the kernel's arguments with the weights,
// the scratch and the experts' output bound.
struct Bound {
  LaunchPlan plan;
  KimiDeviceArgs args;
  int device;
};

// Checks one tensor against what the kernel reads through its pointer. It
// names the tensor as `what` or, for a state tensor, state[layer][what]; the
// message is only built when the check fails (step() stays cheap).
void expect(const at::Tensor& t, at::ScalarType dtype, int64_t numel, int device, const char* what, int layer = -1,
            bool at_least = false) {
  auto name = [&] { return layer < 0 ? std::string(what) : "state[" + std::to_string(layer) + "]" + what; };
  TORCH_CHECK(t.is_cuda() && t.get_device() == device, name(), " must be on cuda:", device, " (it is on ",
              t.device(), ")");
  TORCH_CHECK(t.scalar_type() == dtype, name(), " must be ", dtype, ", not ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), name(), " must be contiguous");
  TORCH_CHECK(at_least ? t.numel() >= numel : t.numel() == numel, name(), " has ", t.numel(),
              " elements, expected ", at_least ? "at least " : "", numel);
}

const Bound& bound_of(const at::Tensor& t) {
  TORCH_CHECK(!t.is_cuda() && t.scalar_type() == at::kByte && t.numel() == int64_t(sizeof(Bound)) &&
                  t.is_contiguous(),
              "not a tensor made by bind()");
  return *static_cast<const Bound*>(t.data_ptr());
}

// Fills the weight pointers of `args` from the tensors, in the order
// solution.py's _abi_weights gives them.
void bind_weights(at::TensorList weights, int device, KimiDeviceArgs* args) {
  size_t n = 0;
  int layer = 0;
  auto next = [&](at::ScalarType dtype, int64_t numel, const std::string& what) {
    TORCH_CHECK(n < weights.size(), "too few weight tensors (", weights.size(), ")");
    const at::Tensor& t = weights[n++];
    expect(t, dtype, numel, device, ("blocks." + std::to_string(layer) + "." + what).c_str());
    return t.data_ptr();
  };
  auto bf16 = [&](int64_t numel, const std::string& what) {
    return static_cast<const uint16_t*>(next(at::kBFloat16, numel, what));
  };
  // A stack of `count` W4A16 matrices with input dim K and output dim N.
  auto w4 = [&](int64_t count, int64_t K, int64_t N, const std::string& what) {
    KtW4 q;
    q.w_q = static_cast<const uint8_t*>(next(at::kByte, count * (K / 2) * N, what + ".w_q"));
    q.scales = bf16(count * (K / KT_G) * N, what + ".scales");
    q.zeros = bf16(count * (K / KT_G) * N, what + ".zeros");
    return q;
  };
  constexpr int64_t C = int64_t(KT_KH) * KT_KD, QDIM = int64_t(KT_MH) * (KT_NOPE + KT_ROPE);
  for (int i = 0; i < kLayers; ++i) {
    layer = i;
    KtLayer& L = args->layers[i];
    L.attn_norm = bf16(KT_D, "attn_norm");
    L.moe_norm = bf16(KT_D, "moe_norm");
    if (is_mla(i)) {
      L.mla.q = w4(1, KT_D, QDIM, "attn.q_proj");
      L.mla.kv_a = w4(1, KT_D, KT_R + KT_ROPE, "attn.kv_a");
      L.mla.kv_b = w4(1, KT_R, int64_t(KT_MH) * (KT_NOPE + KT_VH), "attn.kv_b");
      L.mla.o = w4(1, int64_t(KT_MH) * KT_VH, KT_D, "attn.o_proj");
    } else {
      L.kda.q = w4(1, KT_D, C, "attn.q_proj");
      L.kda.k = w4(1, KT_D, C, "attn.k_proj");
      L.kda.v = w4(1, KT_D, C, "attn.v_proj");
      L.kda.g = w4(1, KT_D, C, "attn.g_proj");
      L.kda.o = w4(1, C, KT_D, "attn.o_proj");
      L.kda.beta = bf16(int64_t(KT_KH) * KT_D, "attn.beta_proj.weight");
      L.kda.conv_w = bf16(3 * C * 4, "attn.conv_w");
    }
    KtMoeLayer& m = L.moe;
    m.router = bf16(int64_t(KT_E) * KT_D, "moe.router.weight");
    m.gate = w4(KT_E, KT_D, KT_I, "moe.gate");
    m.up = w4(KT_E, KT_D, KT_I, "moe.up");
    m.down = w4(KT_E, KT_I, KT_D, "moe.down");
    m.s_gate = w4(KT_NSH, KT_D, KT_I, "moe.s_gate");
    m.s_up = w4(KT_NSH, KT_D, KT_I, "moe.s_up");
    m.s_down = w4(KT_NSH, KT_I, KT_D, "moe.s_down");
  }
  TORCH_CHECK(n == weights.size(), "got ", weights.size(), " weight tensors, the kernel reads ", n);
}

// Plans the launch on the weights' device, checks the kernel's sizes against
// `signature` (the model's ktune_config), binds the weights (the caller
// keeps them alive) and allocates the scratch (zeroed once, here) and the
// routed experts' output. Returns (bound, scratch, topk).
std::tuple<at::Tensor, at::Tensor, at::Tensor> bind(at::TensorList weights, at::IntArrayRef signature) {
  TORCH_CHECK(!weights.empty() && weights[0].is_cuda(), "the weights must be CUDA tensors");
  Bound b{};
  b.device = weights[0].get_device();
  c10::cuda::CUDAGuard guard(b.device);
  std::string err = plan_launch(&b.plan);
  TORCH_CHECK(err.empty(), err);
  TORCH_CHECK(signature.size() == KT_CONFIG_FIELDS, "the signature has ", signature.size(), " fields");
  for (int i = 0; i < KT_CONFIG_FIELDS; ++i)
    TORCH_CHECK(signature[i] == b.plan.config[i], "the kernel was built for other sizes: ktune_config[", i, "] is ",
                b.plan.config[i], ", the model's ", signature[i]);
  bind_weights(weights, b.device, &b.args);
  auto on_device = at::TensorOptions().dtype(at::kByte).device(at::kCUDA, b.device);
  at::Tensor scratch = at::empty({std::max<int64_t>(b.plan.scratch_bytes, 1)}, on_device);
  at::Tensor topk = at::empty({kLayers, KT_TOPK}, on_device.dtype(at::kInt));
  cudaStream_t stream = at::cuda::getCurrentCUDAStream(b.device);
  cudaError_t e = cudaMemsetAsync(scratch.data_ptr(), 0, scratch.numel(), stream);
  if (e == cudaSuccess) e = cudaMemsetAsync(topk.data_ptr(), 0xff, topk.numel() * sizeof(int), stream);
  TORCH_CHECK(e == cudaSuccess, cuda_message("zeroing the kernel's scratch", e));
  b.args.scratch = static_cast<uint8_t*>(scratch.data_ptr());
  b.args.topk_out = topk.data_ptr<int>();
  // The prepare table reads the weights bound above; it and the zeroing are
  // done before any stream the caller picks for the steps launches one.
  e = launch_prepare(b.args, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  TORCH_CHECK(e == cudaSuccess, cuda_message("repacking the weights (the variant's prepare table)", e));
  at::Tensor bound = at::empty({int64_t(sizeof(Bound))}, at::TensorOptions().dtype(at::kByte));
  std::memcpy(bound.data_ptr(), &b, sizeof b);
  return {bound, scratch, topk};
}

// [grid, block, shared memory bytes, scratch bytes] of a bound kernel.
std::vector<int64_t> info(const at::Tensor& bound) {
  const Bound& b = bound_of(bound);
  return {b.plan.grid, b.plan.launch.block, b.plan.launch.smem, b.plan.scratch_bytes};
}

// One decode step: x_out = block(x_in); `state` holds, per layer, S, cq, ck,
// cv (K) or c_kv, k_rope (M: buffers with room for context + 1 rows).
void step(const at::Tensor& bound, const at::Tensor& x_in, const at::Tensor& x_out, at::TensorList state,
          int64_t context) {
  const Bound& b = bound_of(bound);
  c10::cuda::CUDAGuard guard(b.device);
  expect(x_in, at::kBFloat16, KT_D, b.device, "hidden");
  expect(x_out, at::kBFloat16, KT_D, b.device, "the output");
  TORCH_CHECK(x_in.data_ptr() != x_out.data_ptr(), "the output must not alias the input");
  TORCH_CHECK(context >= 0 && context < (int64_t(1) << 30), "context ", context, " is out of range");
  KimiDeviceArgs args = b.args;
  size_t s = 0;
  for (int i = 0; i < kLayers; ++i) {
    TORCH_CHECK(s + (is_mla(i) ? 2 : 4) <= state.size(), "the state has too few tensors for layer ", i);
    if (is_mla(i)) {
      expect(state[s], at::kBFloat16, (context + 1) * KT_R, b.device, "['c_kv']", i, true);
      expect(state[s + 1], at::kBFloat16, (context + 1) * KT_ROPE, b.device, "['k_rope']", i, true);
      args.layers[i].mla.c_kv = static_cast<uint16_t*>(state[s].data_ptr());
      args.layers[i].mla.k_rope = static_cast<uint16_t*>(state[s + 1].data_ptr());
      s += 2;
    } else {
      KtKdaLayer& k = args.layers[i].kda;
      expect(state[s], at::kFloat, int64_t(KT_KH) * KT_KD * KT_KD, b.device, "['S']", i);
      k.S = state[s].data_ptr<float>();
      const char* names[3] = {"['cq']", "['ck']", "['cv']"};
      for (int w = 0; w < 3; ++w) {
        expect(state[s + 1 + w], at::kBFloat16, int64_t(3) * KT_KH * KT_KD, b.device, names[w], i);
        k.win[w] = static_cast<uint16_t*>(state[s + 1 + w].data_ptr());
      }
      s += 4;
    }
  }
  TORCH_CHECK(s == state.size(), "the state has ", state.size(), " tensors, expected ", s);
  args.x_in = static_cast<const uint16_t*>(x_in.data_ptr());
  args.x_out = static_cast<uint16_t*>(x_out.data_ptr());
  args.context = int(context);
  cudaError_t e = launch_step(b.plan, args, at::cuda::getCurrentCUDAStream(b.device));
  TORCH_CHECK(e == cudaSuccess, cuda_message("launching ktune_k0", e));
}

}  // namespace kimi_ext

// Operators in the namespace TORCH_EXTENSION_NAME (unique per kernel, so two
// exported variants load side by side): torch.ops.<name>.bind/info/step.
// The indirection expands the macro before TORCH_LIBRARY pastes it.
#define KIMI_EXT_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
#define KIMI_EXT_LIBRARY_IMPL(ns, key, m) TORCH_LIBRARY_IMPL(ns, key, m)

KIMI_EXT_LIBRARY(TORCH_EXTENSION_NAME, m) {
  m.def("bind(Tensor[] weights, int[] signature) -> (Tensor, Tensor, Tensor)");
  m.def("info(Tensor bound) -> int[]");
  m.def("step(Tensor bound, Tensor x_in, Tensor(a!) x_out, Tensor(b!)[] state, int context) -> ()");
}

KIMI_EXT_LIBRARY_IMPL(TORCH_EXTENSION_NAME, CompositeExplicitAutograd, m) {
  m.impl("bind", &kimi_ext::bind);
  m.impl("info", &kimi_ext::info);
  m.impl("step", &kimi_ext::step);
}

#endif  // KIMI_EXT_LAUNCHER_ONLY
