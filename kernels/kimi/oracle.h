// The oracle: one decode step of the block computed on the CPU in double
// precision, rounding to bf16 exactly where the spec rounds. Validation
// compares every backend's outputs with it; it must reproduce the golden
// vectors from the independent implementation.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "kernels/kimi/state.h"
#include "kernels/kimi/weights.h"

namespace ktune::kimi {

struct StepOutput {
  std::vector<uint16_t> hidden;                    // bf16 [hidden]
  std::vector<std::vector<int>> topk;              // per layer: routed experts, best first
  std::vector<std::vector<float>> router_logits;   // per layer: the bf16-rounded router logits
  std::vector<std::vector<uint16_t>> ckv_row;      // per M layer: the appended c_kv row
  std::vector<std::vector<uint16_t>> krope_row;    // per M layer: the appended k_rope row
  // Per layer: the attention's output, its o_proj's input (bf16). Empty
  // when a backend's variant does not report it (ABI version < 3).
  std::vector<std::vector<uint16_t>> attn_out;
};

// Named intermediates ("L0.q", "L3.o", ...), for telling which phase
// of a kernel went wrong. Filled only when asked for.
using OracleTrace = std::map<std::string, std::vector<float>>;

// Experts to use instead of the top-k, per layer (an empty list: the top-k).
using Routing = std::vector<std::vector<int>>;

// Advances `state` by one token (S, windows updated; caches grow by a row).
// With `routing`, a layer given a list routes to those experts (weighted by
// the oracle's own probabilities): the oracle's answer for a kernel that
// broke a near-tie of router logits the other way.
void oracle_step(const KimiWeights& w, KimiState* state, const uint16_t* token, StepOutput* out,
                 OracleTrace* trace = nullptr, const Routing* routing = nullptr);

// oracle_step in parts, so steps that share their first layers can share
// their computation (a seed's cases at several contexts share every layer
// before the first M layer: the same token and K states, only the caches
// differ). start_step sizes `out` and gives the hidden going in;
// oracle_layers runs layers [first, last) on it; finish_step ends the step.
// oracle_step is the three in a row.
std::vector<double> start_step(const KimiConfig& c, const uint16_t* token, StepOutput* out);
void oracle_layers(const KimiWeights& w, KimiState* state, int first, int last, std::vector<double>* hidden,
                   StepOutput* out, OracleTrace* trace = nullptr, const Routing* routing = nullptr);
void finish_step(KimiState* state, const std::vector<double>& hidden, StepOutput* out);

// y = x @ W with W dequantized exactly as the spec says, accumulated in
// double, not rounded (callers round where the spec does).
void w4_linear(const QLinear& q, const double* x, double* y);
// One dequantized weight, w[k, n] = bf16(bf16(q - zero) * scale).
float w4_weight(const QLinear& q, int k, int n);

}  // namespace ktune::kimi
