// BackendSpec: what the orchestrator needs to know about a backend to use
// it: how to compile a variant's source for it, which runner backend hosts
// it, how long things may take, and whether builds may run while the
// device measures (on the host backend the CPU is the device, so not).
#pragma once
#include <string>

#include "sandbox/build_cache.h"

namespace ktune::agent {

struct BackendSpec {
  std::string name;               // host, cuda, cuda-emu
  std::string templates;          // the templates it runs: "host" or "cuda"
  bool builds_overlap_timing = false;
  int warmup = 3, samples = 20;   // timing defaults per context
  int build_workers = 1;
  double build_timeout_s = 120;
  double step_timeout_s = 60;     // a validate or time request, per case or context
  size_t runner_memory_bytes = 0; // runner address-space limit (0 for CUDA, which maps huge ranges)
  size_t build_memory_bytes = size_t(4) << 30;

  // The compile command for a rendered source (the build cache keys on it).
  sandbox::BuildRequest build_request(const std::string& source) const;
};

bool backend_spec(const std::string& name, BackendSpec* out, std::string* err);

// nvcc, found on PATH or in /usr/local/cuda/bin; empty when absent.
std::string find_nvcc();

}  // namespace ktune::agent
