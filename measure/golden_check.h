// Runs a backend's loaded variant over every case and step of a golden
// file (kernels/kimi/golden.h) and sums up the comparison: how the CPU
// emulator and the GPU prove a kernel computes the specified function.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "kernels/kimi/golden.h"
#include "measure/runner_backend.h"

namespace ktune::measure {

struct GoldenSummary {
  int checks = 0, failed = 0;
  int launches = -1;                      // per step, the most counted
  std::map<std::string, double> worst;    // output kind -> worst cosine
  std::vector<std::string> failures;      // the first few
  std::string describe() const;           // one line
};

bool check_golden_file(RunnerBackend& backend, const kimi::GoldenFile& g, const kimi::GoldenOptions& opts,
                       GoldenSummary* out, std::string* err);

}  // namespace ktune::measure
