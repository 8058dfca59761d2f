// The measuring half of an attempt, shared by sessions and `ktune bench`:
// render a variant, load it into the runner, validate it on fresh seeded
// cases against the oracle, and time it. Each step fills a Measurement and
// returns false when the attempt stops there (its outcome says why).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "agent/backend.h"
#include "base/json.h"
#include "kernels/kimi/config.h"
#include "measure/oracle_pool.h"
#include "measure/runner_client.h"
#include "measure/stats.h"
#include "measure/validate.h"
#include "variants/templates.h"

namespace ktune::agent {

struct Variant {
  std::string id;  // sha256 of the rendered source
  std::string template_name, backend, source, parent, origin, rationale;
  json knobs = json::object();
  int max_launches = 0;  // 0: any
  json to_event() const;
};

// Renders a template (or, when `body` is non-empty, a designer's own
// source for it) with the config's sizes and the knobs.
bool render_variant(const kimi::KimiConfig& cfg, const BackendSpec& spec, const variants::Template& t,
                    const json& knobs, const std::string& body, Variant* out, std::string* err);

struct Measurement {
  std::string outcome = "ok";  // see traces/events.h
  std::string error;
  double load_s = 0, validate_s = 0, time_s = 0;
  // validate_s in three parts: the variant's runs on the cases (the
  // runner's reply; runner_s says where its time went), waiting for the CPU
  // reference's answers (computed ahead, in the background, by the
  // OraclePool), and comparing the outputs with them.
  double variant_run_s = 0, reference_wait_s = 0, compare_s = 0;
  json runner_s = json::object();  // {state, upload, step, download, write}
  int launches = -1;           // counted per step (CUPTI on the GPU, the runtime on the host)
  int declared_launches = -1;
  std::vector<measure::CaseCheck> cases;
  json timings = json::array();  // per context: {context, steps, warmup, samples_us, median_us, p10_us, ...,
                                 // back_to_back_us and its median when asked for}
  measure::Score score;
};

class Evaluator {
 public:
  Evaluator(const kimi::KimiWeights& w, const BackendSpec& spec, measure::RunnerClient& runner,
            measure::OraclePool& oracle, std::string out_dir, measure::Gate gate, double step_timeout_s)
      : w_(w), spec_(spec), runner_(runner), oracle_(oracle), out_dir_(std::move(out_dir)), gate_(gate),
        step_timeout_s_(step_timeout_s) {}

  bool load(const std::string& artifact, Measurement* m);
  // cases: (seed, context) pairs; max_launches 0 = any.
  bool validate(const std::vector<std::pair<int, int>>& cases, int max_launches, Measurement* m);
  // contexts: (context, steps) pairs. Each step is timed alone (the
  // score's samples); with back_to_back n > 0, also kBackToBackBatches
  // batches of n steps launched back to back (a timing's back_to_back_us,
  // per step).
  static constexpr int kBackToBackBatches = 5;
  bool time(const std::vector<std::pair<int, int>>& contexts, int warmup, int samples, Measurement* m,
            int back_to_back = 0);

  const measure::Gate& gate() const { return gate_; }
  // Keep oracle answers after use (validating several variants on the same cases).
  void keep_oracle_answers(bool keep) { keep_oracle_ = keep; }

 private:
  bool failed(const measure::RunnerReply& r, Measurement* m);
  const kimi::KimiWeights& w_;
  const BackendSpec& spec_;
  measure::RunnerClient& runner_;
  measure::OraclePool& oracle_;
  std::string out_dir_;
  measure::Gate gate_;
  double step_timeout_s_;
  bool keep_oracle_ = false;
};

}  // namespace ktune::agent
