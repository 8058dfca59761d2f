// RunnerBackend: what the trusted runner needs from a place that runs
// variants. Three exist: "host" (a g++-built host variant on the CPU),
// "cuda-emu" (a CUDA variant compiled for the CPU emulator) and "cuda" (a
// cubin on the GPU, weights resident in device memory). The runner's request
// loop (runner.h) is the same for all three.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "base/bf16.h"
#include "base/json.h"
#include "kernels/kimi/oracle.h"

namespace ktune::measure {

// Row `row` of a [rows][n] bf16 array, as floats (a kernel's router logits
// for StepOutput::router_logits).
inline std::vector<float> bf16_row(const std::vector<uint16_t>& a, int row, int n) {
  std::vector<float> out(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) out[size_t(i)] = bf16_to_float(a[size_t(row) * size_t(n) + size_t(i)]);
  return out;
}

struct StepStatus {
  bool ok = true;
  bool fault = false;      // the device is unusable now (GPU fault, or a detected crash)
  std::string error;       // when !ok: what happened
  int launches = -1;       // kernel launches (parallel regions) counted in this step, -1 if not counted
  double us = 0;           // device-timed duration of the step
};

class RunnerBackend {
 public:
  virtual ~RunnerBackend() = default;
  virtual std::string name() const = 0;
  // Device facts for the record (name, SMs, caches, versions, ...).
  virtual json facts() = 0;
  // Makes the weights resident; caches get room for `capacity` rows. With
  // a variant loaded, runs its prepare table again (abi.h).
  virtual bool init(const kimi::KimiWeights& w, int capacity, std::string* err) = 0;
  // Loads a built variant (replacing the previous one), zeroes its scratch
  // and runs its prepare table (abi.h), if it has one, to completion. A
  // false return is the variant's launch_error, or its device_fault when
  // faulted() says so.
  virtual bool load(const std::string& artifact, std::string* err) = 0;
  // True once a failure outside a step (a prepare launch) left the device
  // unusable: the runner then exits, as after a step's fault.
  virtual bool faulted() const { return false; }
  // The variant's launches per step as declared (its launch table), -1 if
  // the backend cannot know before running.
  virtual int declared_launches() const = 0;
  // Sets the state and the input token; poisons the pure outputs (hidden
  // out, the cache row the step will write) so unwritten ones show.
  virtual bool put_state(const kimi::KimiState& st, const std::vector<uint16_t>& token, std::string* err) = 0;
  // One decode step at position `context`; its output becomes the next
  // step's input.
  virtual StepStatus step(int context, bool count_launches) = 0;
  // `count` decode steps launched back to back, as a decode loop runs
  // them (positions context + i % cycle, each step's output the next one's
  // input), timed together: us is their total. step() times one step
  // alone, so it includes the launch's whole cost; here each launch can
  // overlap the step before it. The CPU backends' steps cannot overlap:
  // there it is the sum of step()'s.
  virtual StepStatus steps_back_to_back(int context, int cycle, int count);
  // Reads back the state (S, windows, cache rows), the hidden output and
  // the chosen experts.
  virtual bool get_state(kimi::KimiState* st, kimi::StepOutput* out, std::string* err) = 0;
  // Gives the variant a zeroed trace buffer of `words` 64-bit words for the
  // next step (args.trace; profiled variants stamp their phases there) and
  // reads it back after the step. words = 0 turns it off.
  virtual bool set_trace(size_t words, std::string* err) = 0;
  virtual bool read_trace(std::vector<uint64_t>* out, std::string* err) = 0;
  // Hardware probes (bandwidth, launch and barrier cost, ...):
  // [{name, value, unit, detail}].
  virtual json probe(std::string* err) = 0;
};

// "host", "cuda-emu" or "cuda". Null with `err` when the backend is not
// available in this build or on this machine.
std::unique_ptr<RunnerBackend> make_backend(const std::string& name, const kimi::KimiConfig& cfg, std::string* err);

}  // namespace ktune::measure
