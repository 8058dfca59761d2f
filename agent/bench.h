// `ktune probe` and `ktune bench`: the measure phase on its own (device
// facts, bandwidth, launch and barrier cost, the floor per context), and
// the side-by-side benchmark of the baseline and a megakernel variant at
// every decode shape of the task, validated, timed by the same runner in
// the same run, with the speedup and the fraction of the floor reached.
#pragma once
#include <string>
#include <vector>

#include "base/json.h"

namespace ktune::agent {

struct BenchOptions {
  std::string task = "kimi-linear";
  std::string size = "full";
  std::string backend = "cuda";
  std::vector<json> knob_sets;  // one megakernel variant each (defaults where absent); none: the defaults
  std::string db, variant;      // or: a variant recorded in a database (its source is used as is)
  int samples = 0, warmup = -1;
  int seeds = 3;
  uint64_t weights_seed = 0;
  std::string runner;
  std::string json_out;         // also write the results here
  bool with_baseline = true;
  int rounds = 1;               // times each variant is timed, in turn with the others (A B A B ...)
};

int run_probe(const std::string& backend, const std::string& size, const std::string& runner);
int run_bench(const BenchOptions& opts);

}  // namespace ktune::agent
