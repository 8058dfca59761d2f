// The "cuda" runner backend: the task's weights resident in device memory
// for the runner's whole life (uploaded once), a variant's cubin loaded
// through the driver's module API, its launch table launched once per
// step, timed with device events, launches counted by CUPTI; its prepare
// table (abi.h) launched once per load, outside both. A sticky GPU
// error (illegal address, illegal instruction, ...) is reported as a fault:
// the runner exits and its client starts a fresh one.
//
// Built only with the CUDA toolkit; links the static CUDA runtime and finds
// the driver at run time, so the runner starts (and says so) on a machine
// without a GPU.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <vector>

#include "base/fs.h"
#include "kernels/kimi/templates.h"
#include "measure/cupti_counter.h"
#include "measure/device_args.h"
#include "measure/launch_table.h"
#include "measure/loaded_variant.h"
#include "measure/runner_backend.h"

namespace ktune::measure {

namespace {

// The driver entry points the backend uses, resolved through the runtime
// (no link-time dependency on libcuda).
struct Driver {
  decltype(&cuModuleLoad) ModuleLoad = nullptr;
  decltype(&cuModuleUnload) ModuleUnload = nullptr;
  decltype(&cuModuleGetFunction) ModuleGetFunction = nullptr;
  decltype(&cuModuleGetGlobal) ModuleGetGlobal = nullptr;
  decltype(&cuFuncSetAttribute) FuncSetAttribute = nullptr;
  decltype(&cuFuncGetAttribute) FuncGetAttribute = nullptr;
  decltype(&cuOccupancyMaxActiveBlocksPerMultiprocessor) Occupancy = nullptr;
  decltype(&cuLaunchKernel) LaunchKernel = nullptr;
  decltype(&cuLaunchCooperativeKernel) LaunchCooperativeKernel = nullptr;
  decltype(&cuGetErrorString) GetErrorString = nullptr;

  bool load(std::string* err) {
    auto get = [&](const char* name, auto* fn) {
      cudaDriverEntryPointQueryResult q;
      void* p = nullptr;
      if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
          q != cudaDriverEntryPointSuccess || !p) {
        *err = std::string("CUDA driver entry point ") + name + " not found";
        return false;
      }
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(p);
      return true;
    };
    return get("cuModuleLoad", &ModuleLoad) && get("cuModuleUnload", &ModuleUnload) &&
           get("cuModuleGetFunction", &ModuleGetFunction) && get("cuModuleGetGlobal", &ModuleGetGlobal) &&
           get("cuFuncSetAttribute", &FuncSetAttribute) && get("cuFuncGetAttribute", &FuncGetAttribute) &&
           get("cuOccupancyMaxActiveBlocksPerMultiprocessor", &Occupancy) && get("cuLaunchKernel", &LaunchKernel) &&
           get("cuLaunchCooperativeKernel", &LaunchCooperativeKernel) && get("cuGetErrorString", &GetErrorString);
  }
  std::string message(CUresult r) const {
    const char* s = nullptr;
    if (GetErrorString) GetErrorString(r, &s);
    return std::string(s ? s : "unknown CUDA driver error") + " (" + std::to_string(int(r)) + ")";
  }
};

// Errors after which the context is unusable: the variant faulted.
bool is_sticky(int code) {
  switch (code) {
    case 700: case 702: case 710: case 714: case 715: case 716: case 717: case 718: case 719: case 720:
      return true;
    default:
      return false;
  }
}

std::string rt_message(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

constexpr uint8_t kPoisonByte = 0xff;  // bf16 0xffff is a NaN

class CudaBackend : public RunnerBackend {
 public:
  explicit CudaBackend(const kimi::KimiConfig& cfg) : cfg_(cfg) {}
  ~CudaBackend() override { unload(); }

  bool start(std::string* err) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
      *err = "no CUDA device: " + (e != cudaSuccess ? rt_message(e) : std::string("none found"));
      return false;
    }
    if ((e = cudaSetDevice(0)) != cudaSuccess || (e = cudaFree(nullptr)) != cudaSuccess) {
      *err = "cannot initialize the GPU: " + rt_message(e);
      return false;
    }
    if (!drv_.load(err)) return false;
    cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, 0);
    cudaEventCreate(&ev0_);
    cudaEventCreate(&ev1_);
    return true;
  }

  std::string name() const override { return "cuda"; }

  json facts() override {
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, 0);
    auto attr = [](cudaDeviceAttr a) {
      int v = 0;
      cudaDeviceGetAttribute(&v, a, 0);
      return v;
    };
    int drv = 0, rt = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    return {{"backend", "cuda"},
            {"device", p.name},
            {"compute_capability", std::to_string(p.major) + "." + std::to_string(p.minor)},
            {"sms", sms_},
            {"l2_bytes", attr(cudaDevAttrL2CacheSize)},
            {"smem_per_block_optin", attr(cudaDevAttrMaxSharedMemoryPerBlockOptin)},
            {"smem_per_sm", attr(cudaDevAttrMaxSharedMemoryPerMultiprocessor)},
            {"regs_per_sm", attr(cudaDevAttrMaxRegistersPerMultiprocessor)},
            {"sm_clock_khz", attr(cudaDevAttrClockRate)},
            {"mem_clock_khz", attr(cudaDevAttrMemoryClockRate)},
            {"mem_bus_bits", attr(cudaDevAttrGlobalMemoryBusWidth)},
            {"memory_bytes", double(total_b)},
            {"driver_version", drv},
            {"runtime_version", rt},
            {"cupti", cupti_.available() ? "yes" : cupti_.unavailable_reason()}};
  }

  bool init(const kimi::KimiWeights& w, int capacity, std::string* err) override {
    capacity_ = capacity;
    // All tensors lie in one mapped file: upload the span that holds them
    // in one copy and translate the pointers.
    const uint8_t* lo = nullptr;
    const uint8_t* hi = nullptr;
    for (auto& [name, t] : w.file.tensors) {
      if (!lo || t.data < lo) lo = t.data;
      if (!hi || t.data + t.nbytes > hi) hi = t.data + t.nbytes;
    }
    size_t span = size_t(hi - lo);
    if (!check(cudaMalloc(&weights_, span), "allocating " + std::to_string(span >> 20) + " MiB of weights", err) ||
        !check(cudaMemcpy(weights_, lo, span, cudaMemcpyHostToDevice), "uploading the weights", err))
      return false;
    weight_bytes_ = span;
    // The weights' pointers, translated into the device copy; then the
    // state's device buffers.
    args_ = KimiDeviceArgs{};
    if (!bind_weights(w, &args_, err, [&](const void* p) -> const void* {
          return static_cast<const uint8_t*>(weights_) + (static_cast<const uint8_t*>(p) - lo);
        }))
      return false;
    for (int i = 0; i < cfg_.layers(); ++i) {
      KtLayer& d = args_.layers[i];
      if (cfg_.is_kda(i)) {
        if (!alloc(&d.kda.S, size_t(cfg_.kda_heads) * cfg_.kda_head_dim * cfg_.kda_head_dim, err)) return false;
        for (auto& win : d.kda.win)
          if (!alloc(&win, size_t(3) * cfg_.kda_dim(), err)) return false;
      } else if (!alloc(&d.mla.c_kv, size_t(capacity) * cfg_.kv_lora, err) ||
                 !alloc(&d.mla.k_rope, size_t(capacity) * cfg_.qk_rope, err)) {
        return false;
      }
    }
    // The runner calls init once, before any load (runner.cc), so no
    // variant is loaded here; were one loaded, its prepare table would run
    // again on the new weights, as abi.h promises.
    return alloc(&x_[0], cfg_.hidden, err) && alloc(&x_[1], cfg_.hidden, err) &&
           alloc(&topk_, size_t(cfg_.layers()) * cfg_.n_active, err) &&
           alloc(&attn_out_, size_t(cfg_.layers()) * cfg_.attn_out_stride(), err) &&
           alloc(&logits_, size_t(cfg_.layers()) * cfg_.n_experts, err) && (!module_ || reset_scratch(err));
  }

  bool load(const std::string& artifact, std::string* err) override {
    unload();
    CUresult r = drv_.ModuleLoad(&module_, artifact.c_str());
    if (r != CUDA_SUCCESS) {
      module_ = nullptr;
      *err = "cannot load the cubin: " + drv_.message(r);
      return false;
    }
    long long scratch = 0;
    bool ok = read_variant(&scratch, err);
    if (ok && scratch > 0) {
      ok = check(cudaMalloc(&scratch_, size_t(scratch)), "allocating scratch", err);
      scratch_bytes_ = ok ? size_t(scratch) : 0;
    }
    if (!ok || !reset_scratch(err)) {
      unload();
      return false;
    }
    return true;
  }

  bool faulted() const override { return fault_; }

  int declared_launches() const override { return int(steps_.size()); }

  bool put_state(const kimi::KimiState& st, const std::vector<uint16_t>& token, std::string* err) override {
    if (st.context + 1 > capacity_) {
      *err = "context " + std::to_string(st.context) + " exceeds the runner's cache capacity";
      return false;
    }
    for (int i = 0; i < cfg_.layers(); ++i) {
      const kimi::LayerState& L = st.layers[i];
      KtLayer& d = args_.layers[i];
      if (cfg_.is_kda(i)) {
        if (!put(d.kda.S, L.S, err) || !put(d.kda.win[0], L.cq, err) || !put(d.kda.win[1], L.ck, err) ||
            !put(d.kda.win[2], L.cv, err))
          return false;
      } else {
        size_t rows = size_t(st.context);
        if (!check(cudaMemcpy(d.mla.c_kv, L.c_kv.data(), rows * cfg_.kv_lora * 2, cudaMemcpyHostToDevice), "cache",
                   err) ||
            !check(cudaMemcpy(d.mla.k_rope, L.k_rope.data(), rows * cfg_.qk_rope * 2, cudaMemcpyHostToDevice),
                   "cache", err) ||
            !check(cudaMemset(d.mla.c_kv + rows * cfg_.kv_lora, kPoisonByte, cfg_.kv_lora * 2), "poison", err) ||
            !check(cudaMemset(d.mla.k_rope + rows * cfg_.qk_rope, kPoisonByte, cfg_.qk_rope * 2), "poison", err))
          return false;
      }
    }
    current_ = 0;
    return put(x_[0], token, err) &&
           check(cudaMemset(x_[1], kPoisonByte, size_t(cfg_.hidden) * 2), "poison", err) &&
           check(cudaMemset(topk_, 0xff, size_t(cfg_.layers()) * cfg_.n_active * sizeof(int)), "poison", err) &&
           check(cudaMemset(attn_out_, kPoisonByte, size_t(cfg_.layers()) * cfg_.attn_out_stride() * 2), "poison", err) &&
           check(cudaMemset(logits_, kPoisonByte, size_t(cfg_.layers()) * cfg_.n_experts * 2), "poison", err);
  }

  // The step's arguments at position `context`: the hidden ping-pongs
  // between two buffers, each step's output the next one's input.
  void set_step_args(int context) {
    args_.x_in = x_[current_];
    args_.x_out = x_[1 - current_];
    args_.context = context;
    args_.topk_out = topk_;
    args_.attn_out = attn_out_;
    args_.logits_out = logits_;
    args_.scratch = static_cast<uint8_t*>(scratch_);
    args_.trace = reinterpret_cast<float*>(trace_);
  }

  StepStatus step(int context, bool count_launches) override {
    StepStatus s;
    if (!module_) return fail(s, "no variant loaded");
    set_step_args(context);
    if (trace_ && cudaMemset(trace_, 0, trace_words_ * 8) != cudaSuccess) return fail(s, "cannot clear the trace");
    if (count_launches) cupti_.begin();
    cudaEventRecord(ev0_);
    if (!launch_step(&s) || !finish_timing(&s, "the step failed on the GPU: ")) return s;
    if (count_launches) s.launches = cupti_.end(int(steps_.size()));
    current_ = 1 - current_;
    last_context_ = context;
    return s;
  }

  // The launches of `count` steps go into the stream one after another
  // (the driver copies each launch's parameters, so args_ can move on),
  // between two events, with no wait in between.
  StepStatus steps_back_to_back(int context, int cycle, int count) override {
    StepStatus s;
    if (!module_) return fail(s, "no variant loaded");
    cudaEventRecord(ev0_);
    for (int i = 0; i < count; ++i) {
      const int at = context + i % cycle;
      set_step_args(at);
      if (!launch_step(&s)) return s;
      current_ = 1 - current_;
      last_context_ = at;
    }
    finish_timing(&s, "a step failed on the GPU: ");
    return s;
  }

  // Puts one step's launches (args_ as set) into the stream; false, with s
  // failed, if one is refused.
  bool launch_step(StepStatus* s) {
    for (const Resolved& e : steps_) {
      CUresult r = launch(e, &args_);
      if (r != CUDA_SUCCESS) {
        fail(*s, "launch of ktune_k" + std::to_string(e.l.kernel) + ": " + drv_.message(r), is_sticky(r));
        return false;
      }
    }
    return true;
  }

  // Records the end event, waits for it and sets s->us from the start event
  // (ev0_); false, with s failed (`what` and the error), if the GPU failed.
  bool finish_timing(StepStatus* s, const std::string& what) {
    cudaEventRecord(ev1_);
    cudaError_t e = cudaEventSynchronize(ev1_);
    if (e != cudaSuccess) {
      fail(*s, what + rt_message(e), is_sticky(e));
      return false;
    }
    float ms = 0;
    cudaEventElapsedTime(&ms, ev0_, ev1_);
    s->us = double(ms) * 1000.0;
    return true;
  }

  bool get_state(kimi::KimiState* st, kimi::StepOutput* out, std::string* err) override {
    st->context = last_context_ + 1;
    st->layers.resize(cfg_.layers());
    out->topk.assign(cfg_.layers(), {});
    out->ckv_row.assign(cfg_.layers(), {});
    out->krope_row.assign(cfg_.layers(), {});
    out->attn_out.assign(cfg_.layers(), {});
    out->router_logits.assign(cfg_.layers(), {});
    std::vector<int> topk(size_t(cfg_.layers()) * cfg_.n_active);
    if (!get(&out->hidden, x_[current_], cfg_.hidden, err) || !get(&topk, topk_, topk.size(), err)) return false;
    std::vector<uint16_t> logits;
    if (abi_reports_logits(abi_) && !get(&logits, logits_, size_t(cfg_.layers()) * cfg_.n_experts, err)) return false;
    for (int i = 0; i < cfg_.layers(); ++i) {
      kimi::LayerState& L = st->layers[i];
      const KtLayer& d = args_.layers[i];
      out->topk[i].assign(topk.begin() + size_t(i) * cfg_.n_active, topk.begin() + size_t(i + 1) * cfg_.n_active);
      if (!logits.empty()) out->router_logits[i] = bf16_row(logits, i, cfg_.n_experts);
      if (abi_reports_attn_out(abi_) &&
          !get(&out->attn_out[i], attn_out_ + size_t(i) * cfg_.attn_out_stride(),
               size_t(cfg_.attn_out_dim(i)), err))
        return false;
      if (cfg_.is_kda(i)) {
        size_t w = size_t(3) * cfg_.kda_dim();
        if (!get(&L.S, d.kda.S, size_t(cfg_.kda_heads) * cfg_.kda_head_dim * cfg_.kda_head_dim, err) ||
            !get(&L.cq, d.kda.win[0], w, err) || !get(&L.ck, d.kda.win[1], w, err) || !get(&L.cv, d.kda.win[2], w, err))
          return false;
      } else {
        if (!get(&out->ckv_row[i], d.mla.c_kv + size_t(last_context_) * cfg_.kv_lora, cfg_.kv_lora, err) ||
            !get(&out->krope_row[i], d.mla.k_rope + size_t(last_context_) * cfg_.qk_rope, cfg_.qk_rope, err))
          return false;
      }
    }
    return true;
  }

  json probe(std::string* err) override;

  bool set_trace(size_t words, std::string* err) override {
    if (trace_) cudaFree(trace_);
    trace_ = nullptr;
    trace_words_ = words;
    return words == 0 || check(cudaMalloc(&trace_, words * 8), "allocating the trace", err);
  }
  bool read_trace(std::vector<uint64_t>* out, std::string* err) override {
    out->assign(trace_words_, 0);
    return !trace_ || check(cudaMemcpy(out->data(), trace_, trace_words_ * 8, cudaMemcpyDeviceToHost), "trace", err);
  }

 private:
  // A launch-table entry, resolved: its kernel and its grid in blocks.
  struct Resolved {
    KtLaunch l;
    CUfunction f;
    int grid;
  };

  void unload() {
    if (module_) drv_.ModuleUnload(module_);
    module_ = nullptr;
    if (scratch_) cudaFree(scratch_);
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    steps_.clear();
    prepare_.clear();
  }

  // The loaded module's exports (abi.h): checks the version and the sizes,
  // reads both launch tables and resolves them.
  bool read_variant(long long* scratch, std::string* err) {
    int abi = 0;
    std::vector<int> config(KT_CONFIG_FIELDS);
    if (!read_global("ktune_abi_version", &abi, sizeof abi, err) ||
        !read_global("ktune_config", config.data(), config.size() * sizeof(int), err) ||
        !read_global("ktune_scratch_bytes", scratch, sizeof *scratch, err))
      return false;
    if (!abi_supported(abi, err)) return false;
    abi_ = abi;
    if (!check_signature(config.data(), kimi::config_signature(cfg_), err)) return false;
    ReadSymbol read = [&](const char* name, void* out, size_t bytes, bool* absent, std::string* e) {
      return read_global(name, out, bytes, e, absent);
    };
    std::vector<KtLaunch> steps, prepare;
    return read_launch_table(kStepTable, read, &steps, err) && read_launch_table(kPrepareTable, read, &prepare, err) &&
           resolve(steps, prepare, err);
  }

  // Each kernel either table names, once, with room for the most dynamic
  // shared memory any entry gives it; then each entry's grid, so nothing but
  // launches sits between the timing events of a step.
  bool resolve(const std::vector<KtLaunch>& steps, const std::vector<KtLaunch>& prepare, std::string* err) {
    std::map<int, std::pair<CUfunction, int>> kernels;  // kernel -> function, largest smem
    for (const auto* table : {&steps, &prepare})
      for (const KtLaunch& l : *table) {
        auto [it, fresh] = kernels.try_emplace(l.kernel, CUfunction{}, 0);
        it->second.second = std::max(it->second.second, l.smem);
        if (!fresh) continue;
        std::string fname = "ktune_k" + std::to_string(l.kernel);
        CUresult r = drv_.ModuleGetFunction(&it->second.first, module_, fname.c_str());
        if (r != CUDA_SUCCESS) {
          *err = std::string(table == &steps ? "the launch table" : "the prepare table") + " names " + fname +
                 ", which the cubin lacks: " + drv_.message(r);
          return false;
        }
      }
    for (auto& [kernel, fs] : kernels)
      if (fs.second > 48 * 1024) {
        CUresult r = drv_.FuncSetAttribute(fs.first, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, fs.second);
        if (r != CUDA_SUCCESS) {
          *err = "cannot give ktune_k" + std::to_string(kernel) + " " + std::to_string(fs.second) +
                 " bytes of shared memory: " + drv_.message(r);
          return false;
        }
      }
    auto grids = [&](const std::vector<KtLaunch>& table, std::vector<Resolved>* out) {
      for (const KtLaunch& l : table) {
        CUfunction f = kernels[l.kernel].first;
        int per_sm = 0;
        CUresult occ = drv_.Occupancy(&per_sm, f, l.block, size_t(l.smem));
        if (occ != CUDA_SUCCESS) {
          *err = "occupancy query failed: " + drv_.message(occ);
          return false;
        }
        int grid = resolve_grid(l, per_sm, sms_);
        if (grid < 1 || (l.cooperative && grid > per_sm * sms_)) {
          *err = "a " + std::string(l.cooperative ? "cooperative " : "") + "grid of " + std::to_string(grid) +
                 " blocks of " + std::to_string(l.block) + " threads cannot run (" + std::to_string(per_sm) +
                 " fit per SM x " + std::to_string(sms_) + " SMs)";
          return false;
        }
        out->push_back({l, f, grid});
      }
      return true;
    };
    return grids(steps, &steps_) && grids(prepare, &prepare_);
  }

  CUresult launch(const Resolved& e, KimiDeviceArgs* args) {
    KtLaunchArgs la = e.l.args;
    void* params[] = {args, &la};
    return e.l.cooperative
               ? drv_.LaunchCooperativeKernel(e.f, e.grid, 1, 1, e.l.block, 1, 1, e.l.smem, nullptr, params)
               : drv_.LaunchKernel(e.f, e.grid, 1, 1, e.l.block, 1, 1, e.l.smem, nullptr, params, nullptr);
  }

  // Zeroes the variant's scratch and runs its prepare table (abi.h), each
  // launch finished before the next, so a failure names its launch. Outside
  // the step's events and CUPTI's count: never timed, never counted.
  bool reset_scratch(std::string* err) {
    if (scratch_ && !check(cudaMemset(scratch_, 0, scratch_bytes_), "zeroing scratch", err)) return false;
    KimiDeviceArgs a = prepare_args(args_, static_cast<uint8_t*>(scratch_));
    for (size_t i = 0; i < prepare_.size(); ++i) {
      CUresult r = launch(prepare_[i], &a);
      cudaError_t e = r == CUDA_SUCCESS ? cudaDeviceSynchronize() : cudaSuccess;
      if (r == CUDA_SUCCESS && e == cudaSuccess) continue;
      fault_ = r != CUDA_SUCCESS ? is_sticky(r) : is_sticky(e);
      *err = prepare_error(i, prepare_[i].l, r != CUDA_SUCCESS ? drv_.message(r) : rt_message(e));
      return false;
    }
    return true;
  }

  static StepStatus fail(StepStatus& s, const std::string& msg, bool fault = false) {
    s.ok = false;
    s.fault = fault;
    s.error = msg;
    return s;
  }
  static bool check(cudaError_t e, const std::string& what, std::string* err) {
    if (e == cudaSuccess) return true;
    *err = what + ": " + rt_message(e);
    return false;
  }
  template <class T>
  bool alloc(T** p, size_t n, std::string* err) {
    void* v = nullptr;
    if (!check(cudaMalloc(&v, n * sizeof(T)), "allocating device memory", err)) return false;
    *p = static_cast<T*>(v);
    return true;
  }
  template <class T>
  bool put(T* dst, const std::vector<T>& src, std::string* err) {
    return check(cudaMemcpy(dst, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice), "upload", err);
  }
  template <class T>
  bool get(std::vector<T>* dst, const T* src, size_t n, std::string* err) {
    dst->resize(n);
    return check(cudaMemcpy(dst->data(), src, n * sizeof(T), cudaMemcpyDeviceToHost), "download", err);
  }
  // *absent (when given) tells a symbol the cubin lacks from other failures.
  bool read_global(const char* name, void* out, size_t bytes, std::string* err, bool* absent = nullptr) {
    CUdeviceptr p;
    size_t size = 0;
    CUresult r = drv_.ModuleGetGlobal(&p, &size, module_, name);
    if (absent) *absent = r == CUDA_ERROR_NOT_FOUND;
    if (r != CUDA_SUCCESS || size < bytes) {
      *err = std::string("the cubin does not export ") + name + (r != CUDA_SUCCESS ? ": " + drv_.message(r) : "");
      return false;
    }
    return check(cudaMemcpy(out, reinterpret_cast<void*>(p), bytes, cudaMemcpyDeviceToHost), name, err);
  }

  const kimi::KimiConfig cfg_;
  Driver drv_;
  CuptiCounter cupti_;
  int sms_ = 0, capacity_ = 0, current_ = 0, last_context_ = 0;
  void* weights_ = nullptr;
  size_t weight_bytes_ = 0;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  bool fault_ = false;  // a prepare launch left the context unusable
  void* trace_ = nullptr;
  size_t trace_words_ = 0;
  uint16_t* x_[2] = {nullptr, nullptr};
  int* topk_ = nullptr;
  uint16_t* attn_out_ = nullptr;  // layers x cfg_.attn_out_stride()
  uint16_t* logits_ = nullptr;    // layers x cfg_.n_experts
  int abi_ = 0;                   // the loaded variant's ABI version
  KimiDeviceArgs args_{};
  CUmodule module_ = nullptr;
  std::vector<Resolved> steps_;    // the step's launch table
  std::vector<Resolved> prepare_;  // the prepare table (abi.h), empty when the variant has none
  cudaEvent_t ev0_ = nullptr, ev1_ = nullptr;
};

// Probes: device-to-device copy bandwidth (cudaMemcpy), and, from the
// probe kernels built beside the runner, launch cost, grid-barrier cost and
// the streaming read rate of 16-byte loads.
json CudaBackend::probe(std::string* err) {
  json out = json::array();
  const size_t n = size_t(1) << 30;
  void *a = nullptr, *b = nullptr;
  if (!check(cudaMalloc(&a, n), "probe buffer", err) || !check(cudaMalloc(&b, n), "probe buffer", err)) return out;
  cudaMemset(a, 1, n);
  cudaMemset(b, 2, n);
  float best = 1e30f;
  for (int rep = 0; rep < 6; ++rep) {
    cudaEventRecord(ev0_);
    cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice);
    cudaEventRecord(ev1_);
    cudaEventSynchronize(ev1_);
    float ms;
    cudaEventElapsedTime(&ms, ev0_, ev1_);
    if (rep > 0) best = std::min(best, ms);
  }
  out.push_back({{"name", "d2d_bandwidth"}, {"value", 2.0 * n / (best * 1e-3) / 1e9}, {"unit", "GB/s"},
                 {"detail", "cudaMemcpy device to device of 1 GiB, read + write bytes, best of 5 after a warm-up"}});
  std::string cubin = join_path(self_dir(), "ktune_probes.cubin");
  CUmodule mod = nullptr;
  if (!file_exists(cubin) || drv_.ModuleLoad(&mod, cubin.c_str()) != CUDA_SUCCESS) {
    out.push_back({{"name", "probe_kernels"}, {"value", 0}, {"unit", ""}, {"detail", "not found: " + cubin}});
    cudaFree(a);
    cudaFree(b);
    return out;
  }
  CUfunction empty, barrier, stream;
  drv_.ModuleGetFunction(&empty, mod, "ktune_probe_empty");
  drv_.ModuleGetFunction(&barrier, mod, "ktune_probe_barrier");
  drv_.ModuleGetFunction(&stream, mod, "ktune_probe_stream");
  auto timed = [&](auto launch, int reps) {
    launch();
    cudaDeviceSynchronize();
    cudaEventRecord(ev0_);
    for (int i = 0; i < reps; ++i) launch();
    cudaEventRecord(ev1_);
    cudaEventSynchronize(ev1_);
    float ms;
    cudaEventElapsedTime(&ms, ev0_, ev1_);
    return double(ms) * 1000.0 / reps;  // us per launch
  };
  const int reps = 2000;
  double launch_us = timed([&] { drv_.LaunchKernel(empty, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr); }, reps);
  out.push_back({{"name", "launch_cost"}, {"value", launch_us}, {"unit", "us"},
                 {"detail", "empty kernel, back-to-back launches on one stream"}});
  // What launching a step costs the step as `step` times it (an event, one
  // launch, an event, then a wait: nothing before or after to overlap with),
  // built up from an empty kernel to the megakernel's launch: its parameters
  // (KimiDeviceArgs by value), a block an SM of 384 threads with the
  // defaults' 182 KB of dynamic shared memory, and a cooperative launch.
  CUfunction step_launch = nullptr;
  if (drv_.ModuleGetFunction(&step_launch, mod, "ktune_probe_step_launch") == CUDA_SUCCESS) {
    constexpr int kStepThreads = 384, kStepSmem = 186368;
    auto alone = [&](auto launch) {  // the median of single launches, each waited for
      std::vector<double> us;
      for (int i = 0; i < 101; ++i) {
        cudaEventRecord(ev0_);
        launch();
        cudaEventRecord(ev1_);
        cudaEventSynchronize(ev1_);
        float ms = 0;
        cudaEventElapsedTime(&ms, ev0_, ev1_);
        if (i > 0) us.push_back(double(ms) * 1000.0);
      }
      std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
      return us[us.size() / 2];
    };
    KimiDeviceArgs args{};
    KtLaunchArgs largs{};
    void* sp[] = {&args, &largs, &b};
    const bool smem_ok = drv_.FuncSetAttribute(step_launch, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                               kStepSmem) == CUDA_SUCCESS;
    struct Case {
      const char* name;
      const char* detail;
      bool smem;  // needs the dynamic shared memory attribute
      std::function<CUresult()> launch;
    };
    const std::vector<Case> cases = {
        {"step_launch_empty", "an empty kernel, 1 block of 32 threads, timed alone (events around it, then a wait)", false,
         [&] { return drv_.LaunchKernel(empty, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr); }},
        {"step_launch_args", "the step's parameters, a block of 384 threads an SM, timed alone", false,
         [&] { return drv_.LaunchKernel(step_launch, sms_, 1, 1, kStepThreads, 1, 1, 0, nullptr, sp, nullptr); }},
        {"step_launch_args_smem", "the same with 182 KB of dynamic shared memory a block", true,
         [&] { return drv_.LaunchKernel(step_launch, sms_, 1, 1, kStepThreads, 1, 1, kStepSmem, nullptr, sp, nullptr); }},
        {"step_launch_args_smem_coop", "the same as a cooperative launch (the megakernel's step)", true, [&] {
           return drv_.LaunchCooperativeKernel(step_launch, sms_, 1, 1, kStepThreads, 1, 1, kStepSmem, nullptr, sp);
         }}};
    for (const Case& c : cases) {
      if (c.smem && !smem_ok) continue;
      CUresult first = c.launch();
      if (first != CUDA_SUCCESS || cudaDeviceSynchronize() != cudaSuccess) {
        out.push_back({{"name", c.name}, {"value", 0}, {"unit", ""}, {"detail", "launch failed: " + drv_.message(first)}});
        continue;
      }
      out.push_back({{"name", c.name}, {"value", alone([&] { c.launch(); })}, {"unit", "us"}, {"detail", c.detail}});
    }
  }
  int per_sm = 0;
  drv_.Occupancy(&per_sm, barrier, 256, 0);
  cudaMemset(b, 0, 64);  // the barrier's counter and generation start at zero
  for (int blocks_per_sm : {1, 2}) {
    if (blocks_per_sm > per_sm) break;
    int grid = blocks_per_sm * sms_;
    int iters = 1000;
    void* p[] = {&b, &iters};
    double with = timed([&] { drv_.LaunchCooperativeKernel(barrier, grid, 1, 1, 256, 1, 1, 0, nullptr, p); }, 20);
    int zero = 0;
    void* p0[] = {&b, &zero};
    double without = timed([&] { drv_.LaunchCooperativeKernel(barrier, grid, 1, 1, 256, 1, 1, 0, nullptr, p0); }, 20);
    out.push_back({{"name", "grid_barrier_cost_" + std::to_string(grid)}, {"value", (with - without) / iters},
                   {"unit", "us"},
                   {"detail", "atomic grid barrier across " + std::to_string(grid) + " blocks of 256 threads"}});
  }
  int sgrid = 0;
  drv_.Occupancy(&sgrid, stream, 512, 0);
  sgrid *= sms_;
  unsigned long long words = n / 16;
  void* sp[] = {&a, &words, &b};
  double us = timed([&] { drv_.LaunchKernel(stream, sgrid, 1, 1, 512, 1, 1, 0, nullptr, sp, nullptr); }, 10);
  out.push_back({{"name", "stream_read_bandwidth"}, {"value", double(n) / (us * 1e-6) / 1e9}, {"unit", "GB/s"},
                 {"detail", "1 GiB read with 16-byte loads by a full grid (read bytes only)"}});
  // The megakernel's tile-striped weight reads (ktune_probe_tiles): row-major
  // as stored and as if repacked tile-contiguous, with 8 and 16 warps per SM.
  CUfunction tiles = nullptr;
  if (drv_.ModuleGetFunction(&tiles, mod, "ktune_probe_tiles") == CUDA_SUCCESS) {
    int matrices = int(n / (size_t(1152) * 4096));
    for (int contiguous : {0, 1})
      for (int threads : {256, 512}) {
        void* tp[] = {&a, &matrices, &contiguous, &b};
        double tus = timed([&] { drv_.LaunchKernel(tiles, sms_, 1, 1, threads, 1, 1, 0, nullptr, tp, nullptr); }, 10);
        double bytes = double(matrices) * 1152 * 4096;
        out.push_back({{"name", std::string("tile_read_bandwidth_") + (contiguous ? "contiguous_" : "rowmajor_") +
                                    std::to_string(threads / 32) + "warps"},
                       {"value", bytes / (tus * 1e-6) / 1e9},
                       {"unit", "GB/s"},
                       {"detail", "the megakernel's GEMV load pattern alone: one block per SM, 128-column tiles, 4 chunks "
                                  "in flight per warp, " + std::string(contiguous ? "tiles laid out contiguously" : "row-major [rows, N]")}});
      }
  }
  drv_.ModuleUnload(mod);
  cudaFree(a);
  cudaFree(b);
  cudaDeviceSynchronize();
  return out;
}

}  // namespace

std::unique_ptr<RunnerBackend> make_cuda_backend(const kimi::KimiConfig& cfg, std::string* err) {
  auto b = std::make_unique<CudaBackend>(cfg);
  if (!b->start(err)) return nullptr;
  return b;
}

}  // namespace ktune::measure
