// A tuning session: the measure phase, then design -> build -> validate ->
// time -> decide in a loop until the budget runs out or Ctrl-C, every step
// recorded as it happens. `ktune run` is a thin wrapper around run_session.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/json.h"

namespace ktune::agent {

struct SessionOptions {
  std::string task = "kimi-linear";
  std::string size = "small";
  std::string backend = "host";
  std::string designer = "search";
  std::string db = "ktune.sqlite";
  double budget_s = 120;
  int max_attempts = 0;       // attempts this run may begin, the baseline's included (0: as many as the budget allows)
  uint64_t seed = 1;          // designer and validation seeds
  uint64_t weights_seed = 0;  // the task's weights
  int64_t resume = 0;         // continue this session instead of starting one
  double min_gain = 0.01;     // a new best must be at least this much faster (and beyond the noise)
  double min_cosine = 0.99;   // validation gate (the spec asks for >= 0.98)
  int batch = 0;              // proposals per design step (0: backend default)
  int samples = 0, warmup = -1;  // timing samples per context (0 / -1: backend default)
  double step_timeout_s = 0;  // a validate or time request (0: backend default)
  std::string runner;         // path of ktune-runner (default: beside ktune)
  std::string workdir;        // sandbox root (default: under the cache dir)
  json designer_options = json::object();  // llm / replay settings
  std::vector<std::string> argv;
  bool quiet = false;
};

// Runs (or resumes) a session; prints progress and a summary. Returns the
// process exit code (0 for a session that ended normally or by Ctrl-C).
int run_session(const SessionOptions& opts);

}  // namespace ktune::agent
