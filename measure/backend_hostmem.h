// Backends whose device memory is host memory (see backend_hostmem.cc).
#pragma once
#include <memory>
#include <vector>

#include "measure/host_runtime.h"
#include "measure/loaded_variant.h"
#include "measure/runner_backend.h"

namespace ktune::measure {

class HostMemoryBackend : public RunnerBackend {
 public:
  explicit HostMemoryBackend(const kimi::KimiConfig& cfg);
  // Also re-runs the prepare table (abi.h) of a loaded variant on zeroed
  // scratch, so scratch never holds a function of other weights.
  bool init(const kimi::KimiWeights& w, int capacity, std::string* err) override;
  bool load(const std::string& artifact, std::string* err) override;
  int declared_launches() const override { return -1; }
  bool put_state(const kimi::KimiState& st, const std::vector<uint16_t>& token, std::string* err) override;
  StepStatus step(int context, bool count_launches) override;
  bool get_state(kimi::KimiState* st, kimi::StepOutput* out, std::string* err) override;
  bool set_trace(size_t words, std::string* err) override;
  bool read_trace(std::vector<uint64_t>* out, std::string* err) override;

 protected:
  virtual bool accepts(const LoadedVariant& v, std::string* err) = 0;
  virtual StepStatus run_step(bool count_launches) = 0;
  // Runs the loaded variant's prepare table with these arguments (abi.h);
  // host variants have none.
  virtual bool run_prepare(const KimiDeviceArgs&, std::string*) { return true; }
  // Zeroes the variant's scratch, then runs its prepare table.
  bool prepare_scratch(std::string* err);
  // The variant's scratch, 64-byte aligned.
  uint8_t* scratch();

  const kimi::KimiConfig cfg_;
  int capacity_ = 0;
  KimiDeviceArgs args_{};
  kimi::KimiState state_;
  std::vector<uint16_t> x_[2];
  int current_ = 0, last_context_ = 0;
  std::vector<int> topk_;
  std::vector<uint16_t> attn_out_;  // layers x cfg_.attn_out_stride()
  std::vector<uint16_t> logits_;    // layers x cfg_.n_experts
  std::vector<uint8_t> scratch_;
  std::vector<uint64_t> trace_;
  std::unique_ptr<LoadedVariant> variant_;
};

class HostBackend : public HostMemoryBackend {
 public:
  explicit HostBackend(const kimi::KimiConfig& cfg);
  std::string name() const override { return "host"; }
  json facts() override;
  json probe(std::string* err) override;

 private:
  bool accepts(const LoadedVariant& v, std::string* err) override;
  StepStatus run_step(bool count_launches) override;
  HostRuntime runtime_;
};

class EmuBackend : public HostMemoryBackend {
 public:
  using HostMemoryBackend::HostMemoryBackend;
  std::string name() const override { return "cuda-emu"; }
  json facts() override;
  json probe(std::string* err) override;
  int declared_launches() const override;

 private:
  int sms() const;
  bool accepts(const LoadedVariant& v, std::string* err) override;
  StepStatus run_step(bool count_launches) override;
  bool run_prepare(const KimiDeviceArgs& args, std::string* err) override;
  // One entry of a launch table; false with the emulator's message.
  bool launch(const KtLaunch& l, const KimiDeviceArgs& args, std::string* err);
};

}  // namespace ktune::measure
