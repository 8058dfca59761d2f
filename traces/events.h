// The event vocabulary of a session. A session is its ordered events: the
// orchestrator emits them as things happen, the store appends each one and
// updates the tables derived from it in the same transaction, a trace file is
// the events in order, and import feeds them back through the same path. So
// a killed session loses nothing written, and export -> import round-trips.
//
// kind               data (JSON object; "attempt" is the attempt's seq in the session)
// session_started    {task, size, backend, designer, budget_s, seed, weights_seed, config, env, argv, options}
// session_resumed    {budget_s, argv}
// phase              {name: "measure"|"design"|..., state: "begin"|"end", seconds?}
// probe              {name, value, unit, detail?}
// variant            {id, template, backend, knobs, source, parent, origin, rationale}
// attempt_started    {attempt, variant, purpose: "baseline"|"reference"|"candidate"}
// build              {attempt, ok, cached, seconds, command, log, resources, timed_out}
// validation         {attempt, ok, seconds, variant_run_s, runner_s: {state, upload, step, download, write}, reference_wait_s, compare_s, gate, cases: [{seed, context, passed, metrics: {output: {cosine, rel_l2, nonfinite, n}}, experts_match}], error?}
// timing             {attempt, seconds, launches_per_step, score_us, contexts: [{context, steps, warmup, samples_us: [..], median_us, p10_us, p90_us, mad_us}]}
// profile            {attempt, launches_per_step, resources, extra?}
// attempt_finished   {attempt, outcome, decision?, reason, error?, score_us?, speedup?, best_before?, best_after?, phase_s: {build, build_wait, load, validate, variant_run, reference_wait, compare, time}}
// best_changed       {variant, attempt, score_us, speedup}
// llm_call           {attempt?, provider, model, url, prompt, reply, status, http_status, tokens_in, tokens_out, latency_s, retries, error?}
// session_ended      {status: "completed"|"interrupted"|"failed", reason, summary}
//
// outcome is one of kOutcomes; decision is "accepted" or "rolled_back" for
// ok attempts and absent otherwise.
//
// Rules the store relies on:
// - A session emits the `variant` event before the variant's first
//   attempt_started in that session, even when the database already knows the
//   variant from an earlier session: a trace is self-contained, so it imports
//   into an empty database.
// - attempt_started comes before the attempt's attempt_finished (the store
//   refuses to finish an attempt it never saw start).
// - An event's attempt is the `attempt` passed to Store::record, or
//   data.attempt when that is 0.
// - Kinds not listed here are kept in the event log only, so a newer
//   orchestrator can add kinds without breaking older readers.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "base/json.h"

namespace ktune::traces {

inline constexpr int kSchemaVersion = 1;
inline constexpr const char* kTraceFormat = "ktune-trace";

inline constexpr const char* kOutcomes[] = {"ok",           "compile_error", "launch_error",      "timeout",
                                            "device_fault", "wrong_answer",  "too_many_launches", "interrupted"};

inline bool is_outcome(std::string_view s) {
  for (const char* o : kOutcomes)
    if (s == o) return true;
  return false;
}

// Where an attempt's time went (attempt_finished's phase_s, a session
// summary's phase_s), in the loop's order. Some keys are parts of the phase
// before them, not phases of their own: validate is the variant's runs on
// the cases, waiting for the CPU reference's answers and comparing. Reports
// show a part under its phase, by its label, and never add it to the sum.
inline constexpr const char* kPhaseOrder[] = {"measure",     "design",         "build",   "load",    "validate",
                                              "variant_run", "reference_wait", "compare", "profile", "time"};
struct PhasePart {
  const char* key;
  const char* phase;
  const char* label;
};
inline constexpr PhasePart kPhaseParts[] = {{"variant_run", "validate", "the variant's runs"},
                                            {"reference_wait", "validate", "waiting for the reference"},
                                            {"compare", "validate", "comparing"}};
inline const PhasePart* phase_part(std::string_view key) {
  for (const PhasePart& p : kPhaseParts)
    if (key == p.key) return &p;
  return nullptr;
}

// JSON text of a value. Invalid UTF-8 (a compiler log, an LLM reply) is
// replaced rather than thrown on, so recording never fails on odd bytes.
inline std::string json_text(const json& v, int indent = -1) {
  return v.dump(indent, ' ', false, json::error_handler_t::replace);
}

// Reading event data without exceptions: a missing key, or a value of
// another type, gives the fallback.
inline const json& data_field(const json& data, const char* key) {
  static const json missing;
  if (!data.is_object()) return missing;
  auto it = data.find(key);
  return it == data.end() ? missing : *it;
}
// A string as is; another non-null value as its JSON text (a numeric size).
inline std::string data_string(const json& data, const char* key) {
  const json& v = data_field(data, key);
  if (v.is_string()) return v.get<std::string>();
  return v.is_null() ? std::string() : json_text(v);
}
inline double data_number(const json& data, const char* key, double fallback = 0) {
  const json& v = data_field(data, key);
  return v.is_number() ? v.get<double>() : fallback;
}
inline int64_t data_int(const json& data, const char* key, int64_t fallback = 0) {
  const json& v = data_field(data, key);
  if (v.is_number_integer()) return v.get<int64_t>();
  return v.is_number_float() ? static_cast<int64_t>(v.get<double>()) : fallback;
}

}  // namespace ktune::traces
