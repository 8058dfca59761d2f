#include "agent/evaluator.h"

#include "base/clock.h"
#include "base/fs.h"
#include "base/sha256.h"
#include "kernels/kimi/templates.h"

namespace ktune::agent {

json Variant::to_event() const {
  return {{"id", id},         {"template", template_name}, {"backend", backend}, {"knobs", knobs},
          {"source", source}, {"parent", parent},          {"origin", origin},   {"rationale", rationale}};
}

bool render_variant(const kimi::KimiConfig& cfg, const BackendSpec& spec, const variants::Template& t,
                    const json& knobs, const std::string& body, Variant* out, std::string* err) {
  // Knobs that change nothing at this point are set to their defaults: the
  // same kernel is then the same variant.
  json point = t.space.canonical(t.space.complete(knobs));
  std::string why;
  if (!t.space.knobs.empty() && !t.space.valid(point, &why)) {
    *err = "invalid knobs: " + why;
    return false;
  }
  auto defines = kimi::config_defines(cfg);
  for (auto& [k, v] : variants::knob_defines(t.space, point)) defines[k] = v;
  const std::string* text = variants::embedded_file(t.file);
  std::string src = body.empty() ? (text ? *text : "") : body;
  if (spec.name == "cuda-emu") src = "#include \"kernels/emu/cuda_emu.h\"\n" + src;
  Variant v;
  if (!variants::render_source(defines, src, &v.source, err)) return false;
  v.id = sha256_hex(v.source);
  v.template_name = t.name;
  v.backend = spec.name;
  v.knobs = t.space.knobs.empty() ? json::object() : point;
  v.max_launches = t.max_launches;
  *out = std::move(v);
  return true;
}

bool Evaluator::failed(const measure::RunnerReply& r, Measurement* m) {
  if (r.ok) return false;
  m->outcome = r.outcome.empty() ? "launch_error" : r.outcome;
  m->error = r.error;
  return true;
}

bool Evaluator::load(const std::string& artifact, Measurement* m) {
  double t0 = mono_seconds();
  // After a crash the call first starts a fresh runner: that time counts as loading.
  measure::RunnerReply r = runner_.call({{"op", "load"}, {"artifact", artifact}}, step_timeout_s_);
  m->load_s = mono_seconds() - t0;
  if (failed(r, m)) return false;
  m->declared_launches = r.body.value("declared_launches", -1);
  return true;
}

bool Evaluator::validate(const std::vector<std::pair<int, int>>& cases, int max_launches, Measurement* m) {
  double t0 = mono_seconds();
  for (auto [seed, ctx] : cases) oracle_.prefetch(seed, ctx);
  json jc = json::array();
  for (auto [seed, ctx] : cases) jc.push_back({{"seed", seed}, {"context", ctx}});
  std::string dir = join_path(out_dir_, "outputs");
  measure::RunnerReply r =
      runner_.call({{"op", "validate"}, {"cases", jc}, {"out_dir", dir}}, step_timeout_s_ * double(cases.size()));
  m->variant_run_s = mono_seconds() - t0;
  if (failed(r, m)) {
    m->validate_s = mono_seconds() - t0;
    return false;
  }
  m->launches = r.body.value("launches_per_step", -1);
  m->runner_s = r.body.value("seconds", json::object());
  json files = r.body.value("files", json::array());
  for (size_t i = 0; i < cases.size(); ++i) {
    const double wait_from = mono_seconds();
    measure::OracleCase ref = keep_oracle_ ? oracle_.get(cases[i].first, cases[i].second)
                                           : oracle_.take(cases[i].first, cases[i].second);
    const double compare_from = mono_seconds();
    m->reference_wait_s += compare_from - wait_from;
    measure::CaseCheck check;
    std::string err;
    if (i >= files.size() || !measure::check_case(w_.cfg, ref, files[i].get<std::string>(), gate_, &check, &err) ||
        !measure::recheck_near_ties(w_, ref, files[i].get<std::string>(), gate_, &check, &err)) {
      check.passed = false;
      check.failure = "outputs missing: " + err;
    }
    m->compare_s += mono_seconds() - compare_from;
    m->cases.push_back(check);
    if (!check.passed && m->outcome == "ok") {
      m->outcome = "wrong_answer";
      m->error = "seed " + std::to_string(check.seed) + ", context " + std::to_string(check.context) + ": " +
                 check.failure;
    }
  }
  remove_tree(dir);
  if (m->outcome == "ok" && max_launches > 0 && m->launches > max_launches) {
    m->outcome = "too_many_launches";
    m->error = std::to_string(m->launches) + " launches per step, at most " + std::to_string(max_launches) +
               " allowed";
  }
  m->validate_s = mono_seconds() - t0;
  return m->outcome == "ok";
}

bool Evaluator::time(const std::vector<std::pair<int, int>>& contexts, int warmup, int samples, Measurement* m,
                     int back_to_back) {
  double t0 = mono_seconds();
  json jc = json::array();
  for (auto [ctx, steps] : contexts) jc.push_back({ctx, steps});
  const int steps_a_context = warmup + samples + kBackToBackBatches * std::max(0, back_to_back);
  double timeout = step_timeout_s_ * double(contexts.size()) * std::max(1.0, double(steps_a_context) / 10.0);
  json req = {{"op", "time"}, {"contexts", jc}, {"warmup", warmup}, {"samples", samples}};
  if (back_to_back > 0) {
    req["back_to_back"] = back_to_back;
    req["batches"] = kBackToBackBatches;
  }
  measure::RunnerReply r = runner_.call(req, timeout);
  m->time_s = mono_seconds() - t0;
  if (failed(r, m)) return false;
  std::vector<measure::SampleStats> per_context;
  for (const json& t : r.body.value("timings", json::array())) {
    measure::SampleStats s = measure::summarize(t.value("samples_us", std::vector<double>{}));
    per_context.push_back(s);
    json row = s.to_json();
    row["context"] = t.value("context", 0);
    row["steps"] = t.value("steps", 0);
    row["warmup"] = t.value("warmup", 0);
    row["samples_us"] = t.value("samples_us", json::array());
    if (t.contains("back_to_back_us")) {
      row["back_to_back_steps"] = t.value("back_to_back_steps", 0);
      row["back_to_back_us"] = t["back_to_back_us"];
      row["back_to_back_median_us"] = measure::summarize(t["back_to_back_us"].get<std::vector<double>>()).median;
    }
    m->timings.push_back(row);
  }
  m->score = measure::combine(per_context);
  return true;
}

}  // namespace ktune::agent
