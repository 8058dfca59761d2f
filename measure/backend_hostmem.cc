// The two runner backends whose "device memory" is host memory: "host"
// (host variants, stepped through the runner's thread pool) and "cuda-emu"
// (CUDA variants compiled for the CPU emulator, launched from their launch
// table). State lives in a KimiState the backend owns.
#include <chrono>
#include <cstring>
#include <thread>

#include "base/clock.h"
#include "kernels/kimi/templates.h"
#include "measure/backend_hostmem.h"
#include "measure/device_args.h"
#include "measure/launch_table.h"

namespace ktune::measure {

namespace {
constexpr uint16_t kPoison = 0xffff;  // a bf16 NaN: an output left unwritten reads as NaN
}

HostMemoryBackend::HostMemoryBackend(const kimi::KimiConfig& cfg) : cfg_(cfg) {}

bool HostMemoryBackend::init(const kimi::KimiWeights& w, int capacity, std::string* err) {
  capacity_ = capacity;
  args_ = KimiDeviceArgs{};
  return bind_weights(w, &args_, err) && (!variant_ || prepare_scratch(err));
}

bool HostMemoryBackend::load(const std::string& artifact, std::string* err) {
  variant_ = std::make_unique<LoadedVariant>();
  if (!variant_->load(artifact, kimi::config_signature(cfg_), err)) {
    variant_.reset();
    return false;
  }
  if (!accepts(*variant_, err)) {
    variant_.reset();
    return false;
  }
  // Zeroed once per load, as on the GPU: a variant keeps its own invariants
  // (counters, barrier state) in scratch across steps.
  scratch_.assign(size_t(variant_->scratch_bytes()) + 64, 0);
  if (!prepare_scratch(err)) {
    variant_.reset();
    return false;
  }
  return true;
}

bool HostMemoryBackend::prepare_scratch(std::string* err) {
  std::fill(scratch_.begin(), scratch_.end(), 0);
  return run_prepare(prepare_args(args_, scratch()), err);
}

uint8_t* HostMemoryBackend::scratch() {
  return scratch_.data() + (64 - reinterpret_cast<uintptr_t>(scratch_.data()) % 64) % 64;
}

bool HostMemoryBackend::put_state(const kimi::KimiState& st, const std::vector<uint16_t>& token, std::string* err) {
  if (st.context + 1 > capacity_) {
    *err = "context " + std::to_string(st.context) + " exceeds the runner's cache capacity";
    return false;
  }
  state_ = st;
  for (int i = 0; i < cfg_.layers(); ++i)
    if (!cfg_.is_kda(i)) {
      state_.layers[i].c_kv.resize(size_t(capacity_) * cfg_.kv_lora, 0);
      state_.layers[i].k_rope.resize(size_t(capacity_) * cfg_.qk_rope, 0);
      std::fill_n(state_.layers[i].c_kv.begin() + size_t(st.context) * cfg_.kv_lora, cfg_.kv_lora, kPoison);
      std::fill_n(state_.layers[i].k_rope.begin() + size_t(st.context) * cfg_.qk_rope, cfg_.qk_rope, kPoison);
    }
  x_[0] = token;
  x_[1].assign(cfg_.hidden, kPoison);
  current_ = 0;
  topk_.assign(size_t(cfg_.layers()) * cfg_.n_active, -1);
  attn_out_.assign(size_t(cfg_.layers()) * cfg_.attn_out_stride(), kPoison);
  logits_.assign(size_t(cfg_.layers()) * cfg_.n_experts, kPoison);
  return true;
}

StepStatus HostMemoryBackend::step(int context, bool count_launches) {
  StepStatus s;
  if (!variant_) {
    s.ok = false;
    s.error = "no variant loaded";
    return s;
  }
  if (context + 1 > capacity_) {
    s.ok = false;
    s.error = "context beyond the cache capacity";
    return s;
  }
  state_.context = context;
  bind_state(cfg_, &state_, &args_);
  args_.x_in = x_[current_].data();
  args_.x_out = x_[1 - current_].data();
  args_.topk_out = topk_.data();
  args_.attn_out = attn_out_.data();
  args_.logits_out = logits_.data();
  args_.scratch = scratch();
  std::fill(trace_.begin(), trace_.end(), 0);
  args_.trace = trace_.empty() ? nullptr : reinterpret_cast<float*>(trace_.data());
  double t0 = mono_seconds();
  s = run_step(count_launches);
  s.us = (mono_seconds() - t0) * 1e6;
  current_ = 1 - current_;
  last_context_ = context;
  return s;
}

bool HostMemoryBackend::get_state(kimi::KimiState* st, kimi::StepOutput* out, std::string*) {
  *st = state_;
  st->context = last_context_ + 1;
  out->hidden = x_[current_];
  out->topk.assign(cfg_.layers(), {});
  out->ckv_row.assign(cfg_.layers(), {});
  out->krope_row.assign(cfg_.layers(), {});
  out->attn_out.assign(cfg_.layers(), {});
  out->router_logits.assign(cfg_.layers(), {});
  const bool reports = variant_ && abi_reports_attn_out(variant_->abi_version());
  const bool reports_logits = variant_ && abi_reports_logits(variant_->abi_version());
  for (int i = 0; i < cfg_.layers(); ++i) {
    out->topk[i].assign(topk_.begin() + size_t(i) * cfg_.n_active, topk_.begin() + size_t(i + 1) * cfg_.n_active);
    if (reports_logits) out->router_logits[i] = bf16_row(logits_, i, cfg_.n_experts);
    if (reports) {
      const auto row = attn_out_.begin() + size_t(i) * cfg_.attn_out_stride();
      out->attn_out[i].assign(row, row + cfg_.attn_out_dim(i));
    }
    if (!cfg_.is_kda(i)) {
      const auto& L = state_.layers[i];
      out->ckv_row[i].assign(L.c_kv.begin() + size_t(last_context_) * cfg_.kv_lora,
                             L.c_kv.begin() + size_t(last_context_ + 1) * cfg_.kv_lora);
      out->krope_row[i].assign(L.k_rope.begin() + size_t(last_context_) * cfg_.qk_rope,
                               L.k_rope.begin() + size_t(last_context_ + 1) * cfg_.qk_rope);
    }
  }
  return true;
}

bool HostMemoryBackend::set_trace(size_t words, std::string*) {
  trace_.assign(words, 0);
  return true;
}

bool HostMemoryBackend::read_trace(std::vector<uint64_t>* out, std::string*) {
  *out = trace_;
  return true;
}

// ---- host -----------------------------------------------------------------------

HostBackend::HostBackend(const kimi::KimiConfig& cfg)
    : HostMemoryBackend(cfg), runtime_(int(std::max(1u, std::thread::hardware_concurrency()))) {}

json HostBackend::facts() {
  return {{"backend", "host"}, {"threads", runtime_.threads()}, {"device", "CPU"}};
}

bool HostBackend::accepts(const LoadedVariant& v, std::string* err) {
  if (!v.host_step()) {
    *err = "not a host variant (no ktune_host_step)";
    return false;
  }
  return true;
}

StepStatus HostBackend::run_step(bool) {
  StepStatus s;
  runtime_.reset_launches();
  int rc = variant_->host_step()(&args_, runtime_.abi());
  s.launches = int(runtime_.launches());
  if (rc != 0) {
    s.ok = false;
    s.error = "the variant's step returned " + std::to_string(rc);
  }
  return s;
}

json HostBackend::probe(std::string*) {
  json out = json::array();
  // Memory bandwidth: copy a buffer far larger than the caches; bytes read
  // plus bytes written, best of several.
  const size_t n = size_t(256) << 20;
  std::vector<char> a(n, 1), b(n, 2);
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    double t0 = mono_seconds();
    std::memcpy(b.data(), a.data(), n);
    best = std::min(best, mono_seconds() - t0);
    a[rep] = b[n - 1 - rep];  // keep the copies observable
  }
  out.push_back({{"name", "memory_bandwidth"}, {"value", 2.0 * n / best / 1e9}, {"unit", "GB/s"},
                 {"detail", "memcpy of 256 MiB, read + write bytes, best of 5"}});
  // The cost of one parallel region over every thread (the host's launch).
  const int reps = 2000;
  auto empty = [](void*, int, int) {};
  double t0 = mono_seconds();
  for (int i = 0; i < reps; ++i) runtime_.abi()->parallel(runtime_.abi(), empty, nullptr, runtime_.threads());
  out.push_back({{"name", "launch_cost"}, {"value", (mono_seconds() - t0) / reps * 1e6}, {"unit", "us"},
                 {"detail", "an empty parallel region over " + std::to_string(runtime_.threads()) + " threads"}});
  out.push_back({{"name", "threads"}, {"value", runtime_.threads()}, {"unit", ""}});
  return out;
}

// ---- cuda-emu ----------------------------------------------------------------------

json EmuBackend::facts() {
  return {{"backend", "cuda-emu"}, {"device", "CPU emulator of CUDA kernels"}, {"sms", sms()}};
}

int EmuBackend::sms() const {
  const char* v = std::getenv("KTUNE_EMU_SMS");
  int n = v ? std::atoi(v) : 2;
  return n > 0 ? n : 2;
}

bool EmuBackend::accepts(const LoadedVariant& v, std::string* err) {
  if (!v.emu_launch()) {
    *err = "not a CUDA variant built for the emulator (no ktune_emu_launch)";
    return false;
  }
  return true;
}

int EmuBackend::declared_launches() const { return variant_ ? int(variant_->launches().size()) : -1; }

bool EmuBackend::launch(const KtLaunch& l, const KimiDeviceArgs& args, std::string* err) {
  char msg[512] = {0};
  // One block per SM "fits": the emulator has no occupancy limit of its own.
  if (variant_->emu_launch()(l.kernel, resolve_grid(l, 1, sms()), l.block, l.smem, l.cooperative, &args, &l.args, msg,
                             sizeof msg))
    return true;
  *err = msg;
  return false;
}

StepStatus EmuBackend::run_step(bool) {
  StepStatus s;
  s.launches = 0;
  for (const KtLaunch& l : variant_->launches()) {
    if (!launch(l, args_, &s.error)) {
      s.ok = false;
      return s;
    }
    ++s.launches;
  }
  return s;
}

// Outside the step: not timed, not counted (run_step counts its own).
bool EmuBackend::run_prepare(const KimiDeviceArgs& args, std::string* err) {
  const std::vector<KtLaunch>& table = variant_->prepare();
  for (size_t i = 0; i < table.size(); ++i) {
    std::string why;
    if (!launch(table[i], args, &why)) {
      *err = prepare_error(i, table[i], why);
      return false;
    }
  }
  return true;
}

json EmuBackend::probe(std::string*) { return json::array(); }

}  // namespace ktune::measure
