// RunnerClient: the orchestrator's handle on a ktune-runner process. It
// starts the runner in the sandbox, sends requests with a deadline, and
// turns a runner that dies (a crashing variant, a GPU fault) or hangs (a
// variant that never finishes) into an attempt outcome; the next request
// starts a fresh runner.
#pragma once
#include <memory>
#include <string>

#include "base/json.h"
#include "sandbox/process.h"

namespace ktune::measure {

struct RunnerOptions {
  std::string runner;         // path of the ktune-runner executable
  std::string backend;        // host, cuda, cuda-emu
  std::string size;           // a config preset ...
  uint64_t weights_seed = 0;
  std::string weights_file;   // ... or a weights file with its config (golden)
  std::string workdir;        // the runner's private directory
  std::string log_path;       // its stderr
  size_t memory_bytes = 0;    // address-space limit (0: none; CUDA needs a large one)
  double start_timeout_s = 900;
};

struct RunnerReply {
  bool ok = false;
  std::string outcome;  // when !ok: launch_error, device_fault, timeout
  std::string error;
  json body = json::object();
};

class RunnerClient {
 public:
  // Starts the runner and asks for its facts.
  bool start(const RunnerOptions& opts, std::string* err);
  // One request; starts a new runner first if the last one is gone.
  RunnerReply call(const json& request, double timeout_s);
  void stop();

  const json& facts() const { return facts_; }
  int starts() const { return starts_; }
  double last_start_seconds() const { return last_start_s_; }

 private:
  bool spawn(std::string* err);
  RunnerOptions opts_;
  std::unique_ptr<sandbox::LineChild> child_;
  json facts_ = json::object();
  int starts_ = 0;
  double last_start_s_ = 0;
};

}  // namespace ktune::measure
