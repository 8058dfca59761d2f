#include "agent/session.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <condition_variable>
#include <optional>
#include <set>
#include <thread>
#include <csignal>
#include <cstdio>
#include <future>
#include <map>
#include <mutex>

#include "agent/designers.h"
#include "agent/evaluator.h"
#include "agent/progress.h"
#include "base/clock.h"
#include "base/text.h"
#include "base/fs.h"
#include "base/rng.h"
#include "base/sha256.h"
#include "kernels/kimi/templates.h"
#include "measure/stats.h"
#include "sandbox/build_cache.h"
#include "traces/store.h"

namespace ktune::agent {

namespace {

// How many attempts ahead the oracle computes validation cases.
constexpr int kOracleAhead = 2;

std::atomic<int> g_interrupts{0};

void on_sigint(int) {
  if (++g_interrupts >= 2) _exit(130);  // a second Ctrl-C: stop now (the database is consistent)
}

// The fresh validation cases of an attempt: seeds derived from the session
// seed and the attempt's number, at every validation context.
std::vector<std::pair<int, int>> validation_cases(const kimi::KimiConfig& cfg, uint64_t seed, int attempt) {
  std::vector<std::pair<int, int>> out;
  for (int i = 0; i < 3; ++i) {
    int s = int(splitmix64(seed * 1000003ull + uint64_t(attempt) * 7919ull + uint64_t(i)) & 0x3fffffff);
    for (int ctx : cfg.validate_contexts) out.push_back({s, ctx});
  }
  return out;
}

std::string short_id(const std::string& id) { return id.substr(0, 12); }

struct PhaseTotals {
  double measure = 0, design = 0, build = 0, load = 0, validate = 0, variant_run = 0, reference_wait = 0,
         compare = 0, time = 0;
  json to_json() const {
    return {{"measure", measure},
            {"design", design},
            {"build", build},
            {"load", load},
            {"validate", validate},
            {"variant_run", variant_run},
            {"reference_wait", reference_wait},
            {"compare", compare},
            {"time", time}};
  }
};

class Session {
 public:
  explicit Session(SessionOptions o) : opts_(std::move(o)) {}

  int run() {
    std::string err;
    if (!setup(&err)) {
      std::fprintf(stderr, "ktune: %s\n", err.c_str());
      if (session_ > 0) end("failed", err);
      return 1;
    }
    std::signal(SIGINT, on_sigint);
    std::signal(SIGTERM, on_sigint);
    if (!baseline_ok_ && !measure_phase(&err)) {
      end("failed", err);
      std::fprintf(stderr, "ktune: %s\n", err.c_str());
      return 1;
    }
    loop();
    std::string status = g_interrupts ? "interrupted" : "completed";
    std::string reason = g_interrupts ? "Ctrl-C" : stop_reason_;
    end(status, reason);
    runner_.stop();
    return 0;
  }

 private:
  // ---- setup ------------------------------------------------------------------
  bool setup(std::string* err) {
    if (!store_.open(opts_.db, err)) return false;
    if (opts_.resume && !load_resumed(err)) return false;
    if (opts_.task != "kimi-linear") {
      *err = "unknown task '" + opts_.task + "' (available: kimi-linear)";
      return false;
    }
    if (!kimi::KimiConfig::preset(opts_.size, &cfg_, err) || !backend_spec(opts_.backend, &spec_, err)) return false;
    if (opts_.samples > 0) spec_.samples = opts_.samples;
    if (opts_.warmup >= 0) spec_.warmup = opts_.warmup;
    if (opts_.step_timeout_s > 0) spec_.step_timeout_s = opts_.step_timeout_s;
    baseline_t_ = kimi::baseline_template(spec_.templates);
    mega_t_ = kimi::megakernel_template(spec_.templates);
    designer_ = make_designer(opts_.designer, opts_.designer_options, err);
    if (!designer_) return false;
    t0_ = mono_seconds();
    deadline_ = t0_ + opts_.budget_s;
    if (opts_.resume) {
      const json resumed = {{"budget_s", opts_.budget_s}, {"max_attempts", opts_.max_attempts}, {"argv", opts_.argv}};
      if (!emit("session_resumed", 0, resumed, err)) return false;
    } else {
      json started = {{"task", opts_.task},       {"size", opts_.size},     {"backend", opts_.backend},
                      {"designer", opts_.designer}, {"budget_s", opts_.budget_s},
                      {"max_attempts", opts_.max_attempts}, {"seed", opts_.seed},
                      {"weights_seed", opts_.weights_seed}, {"config", cfg_.to_json()},
                      {"env", environment()},     {"argv", opts_.argv},
                      {"options", {{"min_gain", opts_.min_gain}, {"min_cosine", opts_.min_cosine},
                                   {"samples", spec_.samples}, {"warmup", spec_.warmup},
                                   {"step_timeout_s", spec_.step_timeout_s},
                                   {"designer_options", redacted(opts_.designer_options)}}}};
      if (!store_.create_session(started, &session_, err)) return false;
    }
    progress_.header(session_, opts_, opts_.resume != 0);
    // Weights first (generated once per machine and cached), then the runner.
    double tw = mono_seconds();
    bool generated = false;
    if (!kimi::load_weights(cfg_, opts_.weights_seed, &weights_, err, &generated)) return false;
    if (generated) progress_.note("generated the task's weights in " + duration_text(mono_seconds() - tw));
    std::string root = opts_.workdir.empty() ? join_path(cache_dir(), "work") : opts_.workdir;
    if (!make_temp_dir(root, "s" + std::to_string(session_) + "-", &workdir_, err)) return false;
    builds_ = std::make_unique<sandbox::BuildCache>(join_path(cache_dir(), "builds"));
    oracle_ = std::make_unique<measure::OraclePool>(weights_);
    measure::RunnerOptions ro;
    ro.runner = opts_.runner.empty() ? join_path(self_dir(), "ktune-runner") : opts_.runner;
    ro.backend = spec_.name;
    ro.size = opts_.size;
    ro.weights_seed = opts_.weights_seed;
    ro.workdir = join_path(workdir_, "runner");
    ro.log_path = join_path(workdir_, "runner.log");
    ro.memory_bytes = spec_.runner_memory_bytes;
    if (!runner_.start(ro, err)) return false;
    measure::Gate gate;
    gate.min_cosine = opts_.min_cosine;
    evaluator_ = std::make_unique<Evaluator>(weights_, spec_, runner_, *oracle_, join_path(workdir_, "runner"), gate,
                                             spec_.step_timeout_s);
    return true;
  }

  json environment() const {
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    return {{"host", host}, {"cores", int(std::thread::hardware_concurrency())}, {"ktune", "0.1"}};
  }

  // Secrets never reach the database: any designer option that looks like
  // one (api_key, auth_token, ...) is dropped before it is recorded. Token
  // counts (max_tokens, token_budget) are not secrets and are kept, so a
  // resumed session has them.
  static json redacted(const json& j) {
    json out = json::object();
    for (auto& [k, v] : j.items()) {
      std::string lk = k;
      std::transform(lk.begin(), lk.end(), lk.begin(), ::tolower);
      bool names_token = lk.size() >= 5 && lk.compare(lk.size() - 5, 5, "token") == 0;
      if (lk.find("key") != std::string::npos || names_token || lk.find("secret") != std::string::npos)
        continue;
      out[k] = v;
    }
    return out;
  }

  // ---- resume ----------------------------------------------------------------
  bool load_resumed(std::string* err) {
    traces::SessionRow row;
    if (!store_.session(opts_.resume, &row, err)) return false;
    session_ = row.id;
    json info = row.info;
    opts_.task = row.task;
    opts_.size = row.size;
    opts_.backend = row.backend;
    opts_.designer = row.designer;
    opts_.seed = uint64_t(info.value("seed", 1ll));
    opts_.weights_seed = uint64_t(info.value("weights_seed", 0ll));
    json o = info.value("options", json::object());
    opts_.min_gain = o.value("min_gain", opts_.min_gain);
    opts_.min_cosine = o.value("min_cosine", opts_.min_cosine);
    if (opts_.samples <= 0) opts_.samples = o.value("samples", 0);
    if (opts_.warmup < 0) opts_.warmup = o.value("warmup", -1);
    if (opts_.step_timeout_s <= 0) opts_.step_timeout_s = o.value("step_timeout_s", 0.0);
    json dopts = o.value("designer_options", json::object());
    for (auto& [k, v] : dopts.items())
      if (!opts_.designer_options.contains(k)) opts_.designer_options[k] = v;
    std::vector<traces::AttemptRow> rows;
    if (!store_.attempts(session_, &rows, err)) return false;
    for (const traces::AttemptRow& a : rows) {
      next_seq_ = std::max(next_seq_, a.seq + 1);
      if (a.outcome.empty()) {
        interrupted_.push_back(a.seq);  // in flight when the session was killed
        continue;
      }
      AttemptView v = view_of(a);
      history_.push_back(v);
      if (a.purpose == "baseline" && a.outcome == "ok") {
        baseline_ok_ = true;
        baseline_us_ = a.score_us;
      }
      if (a.decision == "accepted") best_ = v;
      measured_.insert(a.variant);
    }
    if (best_) {
      // The best's score with its noise, from its recorded samples.
      json t;
      std::vector<measure::SampleStats> per_context;
      if (store_.timings(session_, best_->seq, &t, err))
        for (const json& c : t) per_context.push_back(measure::summarize(c.value("samples_us", std::vector<double>{})));
      best_score_ = measure::combine(per_context);
      if (best_score_.us <= 0) best_score_.us = best_->score_us;
    }
    return true;
  }

  // The attempts of earlier sessions in `judged` whose knobs render to
  // their own variant today: what the search learns from before it has
  // measured anything. Worked out once a session (a render per variant).
  std::vector<AttemptView> still_current(const std::vector<traces::AttemptRow>& judged,
                                         const std::function<std::string(const json&, const std::string&)>& variant_id) {
    std::vector<AttemptView> out;
    std::map<std::string, bool> current;  // variant id -> renders to itself today
    for (const traces::AttemptRow& a : judged) {
      if (a.session_id == session_) continue;
      AttemptView v = view_of(a);
      if (v.template_name != mega_t_->name || !v.knobs.is_object()) continue;
      auto it = current.find(v.variant);
      if (it == current.end()) it = current.emplace(v.variant, variant_id(v.knobs, "") == v.variant).first;
      if (it->second) out.push_back(v);
    }
    if (!out.empty())
      progress_.note("the search learns from " + std::to_string(out.size()) +
                     " attempts of earlier sessions on the same code and device");
    return out;
  }

  // Whether a session of this database ran on the device this one runs on
  // (SessionRow::device): what was measured on another GPU is
  // neither learned from nor taken as measured here, since the fastest
  // point of one GPU need not be another's. This session always counts.
  bool same_device(int64_t session) {
    if (session == session_) return true;
    auto it = same_device_.find(session);
    if (it != same_device_.end()) return it->second;
    traces::SessionRow earlier;
    std::string err;
    const bool same = store_.session(session, &earlier, &err) && !earlier.device.empty() &&
                      earlier.device == runner_.facts().value("device", "");
    same_device_[session] = same;
    return same;
  }

  AttemptView view_of(const traces::AttemptRow& a) {
    AttemptView v;
    v.seq = a.seq;
    v.variant = a.variant;
    v.outcome = a.outcome;
    v.decision = a.decision;
    v.reason = a.reason;
    v.error = a.error;
    v.score_us = a.score_us;
    v.speedup = a.speedup;
    traces::VariantRow vr;
    std::string err;
    if (store_.variant(a.variant, &vr, &err)) {
      v.template_name = vr.template_name;
      v.knobs = vr.knobs;
      v.origin = vr.origin;
      v.parent = vr.parent;
    }
    return v;
  }

  // ---- events ------------------------------------------------------------------
  bool emit(const std::string& kind, int attempt, json data, std::string* err) {
    if (attempt) data["attempt"] = attempt;
    return store_.record(session_, kind, attempt, data, err);
  }
  // Recording must not fail silently: a session that cannot write stops.
  void emit_or_die(const std::string& kind, int attempt, json data) {
    std::string err;
    if (!emit(kind, attempt, std::move(data), &err)) {
      std::fprintf(stderr, "ktune: cannot record %s: %s\n", kind.c_str(), err.c_str());
      std::exit(1);
    }
  }

  double left() const { return deadline_ - mono_seconds(); }
  double elapsed() const { return mono_seconds() - t0_; }
  bool stopping() const { return g_interrupts > 0 || left() <= 0 || attempts_left() <= 0; }
  // Attempts this run may still begin (--max-attempts; the budget applies as well).
  int attempts_left() const { return opts_.max_attempts > 0 ? opts_.max_attempts - attempts_run_ : 1 << 30; }

  // ---- the measure phase --------------------------------------------------------
  bool measure_phase(std::string* err) {
    double t0 = mono_seconds();
    emit_or_die("phase", 0, {{"name", "measure"}, {"state", "begin"}});
    emit_or_die("probe", 0, {{"name", "device"}, {"value", 0}, {"unit", ""}, {"detail", runner_.facts()}});
    measure::RunnerReply pr = runner_.call({{"op", "probe"}}, 600);
    double bandwidth = 0;
    for (const json& p : pr.body.value("probes", json::array())) {
      emit_or_die("probe", 0, p);
      probes_.push_back(p);
      std::string n = p.value("name", "");
      if (n == "d2d_bandwidth" || n == "memory_bandwidth") bandwidth = p.value("value", 0.0);
    }
    // The floor per timed context: bytes one step must move over the
    // measured bandwidth.
    for (auto [ctx, steps] : cfg_.timed_contexts) {
      if (bandwidth <= 0) break;
      double bytes = cfg_.bytes_per_step(ctx);
      json p = {{"name", "floor_us@" + std::to_string(ctx)}, {"value", bytes / (bandwidth * 1e9) * 1e6},
                {"unit", "us"},
                {"detail", {{"bytes", bytes}, {"bandwidth_gb_s", bandwidth}, {"context", ctx}}}};
      emit_or_die("probe", 0, p);
      probes_.push_back(p);
    }
    // The oracle's own time for one step (the reference, on the CPU).
    double to = mono_seconds();
    measure::OracleCase oc = measure::compute_oracle_case(weights_, 7, cfg_.validate_contexts.front());
    emit_or_die("probe", 0, {{"name", "oracle_step"}, {"value", mono_seconds() - to}, {"unit", "s"},
                             {"detail", "CPU double-precision reference, context " +
                                            std::to_string(cfg_.validate_contexts.front())}});
    progress_.probes(probes_);
    Proposal base;
    base.template_name = baseline_t_->name;
    base.origin = "baseline";
    base.rationale = baseline_t_->summary;
    totals_.measure += mono_seconds() - t0;
    std::vector<Job> jobs = prepare({base});
    if (jobs.empty()) {
      *err = "cannot render the baseline";
      return false;
    }
    attempt(jobs[0], "baseline");
    emit_or_die("phase", 0, {{"name", "measure"}, {"state", "end"}, {"seconds", mono_seconds() - t0}});
    if (!baseline_ok_) {
      *err = "the baseline did not run: " + history_.back().outcome + ": " + history_.back().error;
      return false;
    }
    return true;
  }

  // ---- building -------------------------------------------------------------------
  struct Job {
    Variant variant;
    std::shared_future<sandbox::BuildResult> build;
    std::shared_ptr<std::atomic<bool>> attempted;  // set as its attempt begins: the build is then needed
  };

  std::vector<Job> prepare(const std::vector<Proposal>& proposals) {
    std::vector<Job> jobs;
    for (const Proposal& p : proposals) {
      const variants::Template* t = p.template_name.empty() ? mega_t_ : kimi::find_template(p.template_name);
      Variant v;
      std::string err;
      if (t && !p.rendered.empty()) {
        v.source = p.rendered;
        v.id = sha256_hex(v.source);
        v.template_name = t->name;
        v.backend = spec_.name;
        v.knobs = p.knobs;
        v.max_launches = t->max_launches;
      } else if (!t || !render_variant(cfg_, spec_, *t, p.knobs, p.source, &v, &err)) {
        progress_.note("skipped a proposal that does not render: " + (t ? err : "unknown template " + p.template_name));
        continue;
      }
      if (p.origin != "baseline" && measured_.count(v.id)) continue;
      measured_.insert(v.id);
      v.origin = p.origin;
      v.rationale = p.rationale;
      // The designer's own parent where it names one (a neighbour of the
      // template's defaults while the baseline is the best), so a variant's
      // knob changes read from what it was derived from.
      v.parent = !p.parent.empty() ? p.parent : best_ ? best_->variant : "";
      sandbox::BuildRequest req = spec_.build_request(v.source);
      sandbox::BuildCache* cache = builds_.get();
      auto attempted = std::make_shared<std::atomic<bool>>(false);
      jobs.push_back({v, std::async(std::launch::async, [this, cache, req, attempted] {
                            std::unique_lock<std::mutex> lock(build_slots_mu_);
                            build_slots_cv_.wait(lock, [&] { return build_slots_ < spec_.build_workers; });
                            // A build that gets its slot after the session stopped, for
                            // an attempt not begun, would only hold the session past its
                            // budget: no attempt begins once the session is stopping.
                            if (stopping() && !*attempted) {
                              sandbox::BuildResult skipped;
                              skipped.log = "not built: the session stopped before this build began";
                              build_slots_cv_.notify_one();  // the free slot passes on (the next one skips too)
                              return skipped;
                            }
                            ++build_slots_;
                            lock.unlock();
                            sandbox::BuildResult r = cache->build(req);
                            lock.lock();
                            --build_slots_;
                            build_slots_cv_.notify_one();
                            return r;
                          }).share(),
                       attempted});
    }
    return jobs;
  }

  // ---- one attempt ------------------------------------------------------------------
  void attempt(Job& job, const std::string& purpose) {
    const Variant& v = job.variant;
    *job.attempted = true;  // first: its build is needed, whatever stopping() now says
    const int seq = next_seq_++;
    ++attempts_run_;
    emit_or_die("variant", 0, v.to_event());
    emit_or_die("attempt_started", seq, {{"variant", v.id}, {"purpose", purpose}});
    // The next attempts' oracle cases, computed while this one runs. Two
    // attempts ahead, not one: an attempt that ends quickly left the next
    // one waiting for most of its reference (RESULTS, run 340).
    for (int ahead = 1; ahead <= kOracleAhead; ++ahead)
      for (auto [s, c] : validation_cases(cfg_, opts_.seed, seq + ahead)) oracle_->prefetch(s, c);
    Measurement m;
    double tb = mono_seconds();
    sandbox::BuildResult b = job.build.get();
    double build_wait = mono_seconds() - tb;
    emit_or_die("build", seq, {{"ok", b.ok}, {"cached", b.cached}, {"seconds", b.seconds}, {"command", b.command_line},
                               {"log", b.log.size() > 20000 ? b.log.substr(b.log.size() - 20000) : b.log},
                               {"resources", b.resources}, {"timed_out", b.timed_out}, {"key", b.key}});
    json phase = {{"build", b.seconds}, {"build_wait", build_wait}, {"load", 0}, {"validate", 0}, {"time", 0}};
    totals_.build += build_wait;
    if (!b.ok) {
      m.outcome = "compile_error";
      m.error = b.timed_out ? "the build timed out" : first_error_line(b.log);
    } else if (evaluator_->load(b.artifact, &m)) {
      auto cases = validation_cases(cfg_, opts_.seed, seq);
      bool valid = evaluator_->validate(cases, v.max_launches, &m);
      json cj = json::array();
      for (auto& c : m.cases) cj.push_back(c.to_json());
      emit_or_die("validation", seq, {{"ok", valid}, {"seconds", m.validate_s}, {"variant_run_s", m.variant_run_s},
                                      {"runner_s", m.runner_s}, {"reference_wait_s", m.reference_wait_s},
                                      {"compare_s", m.compare_s}, {"gate", evaluator_->gate().to_json()},
                                      {"cases", cj}, {"launches_per_step", m.launches}, {"error", m.error}});
      if (valid && evaluator_->time(cfg_.timed_contexts, spec_.warmup, spec_.samples, &m)) {
        emit_or_die("timing", seq, {{"seconds", m.time_s}, {"launches_per_step", m.launches},
                                    {"score_us", m.score.us}, {"contexts", m.timings}});
        emit_or_die("profile", seq, {{"launches_per_step", m.launches}, {"resources", b.resources},
                                     {"extra", {{"declared_launches", m.declared_launches},
                                                {"score_rel_se", m.score.rel_se}}}});
        if (purpose != "baseline") retime_best_if_beaten(seq, m);
      }
    }
    phase["load"] = m.load_s;
    phase["validate"] = m.validate_s;
    phase["variant_run"] = m.variant_run_s;
    phase["reference_wait"] = m.reference_wait_s;
    phase["compare"] = m.compare_s;
    phase["time"] = m.time_s;
    totals_.load += m.load_s;
    totals_.validate += m.validate_s;
    totals_.variant_run += m.variant_run_s;
    totals_.reference_wait += m.reference_wait_s;
    totals_.compare += m.compare_s;
    totals_.time += m.time_s;
    decide(seq, v, purpose, m, phase);
    if (history_.back().decision == "accepted") best_artifact_ = b.artifact;
  }

  // A candidate that beats the best's recorded score is compared with the
  // best timed again, now: scores drift between attempts (clocks, heat) by
  // more than the noise inside one, and a run of the GPU session accepted a
  // change that compiles to the same code (RESULTS.md, run 13). The best's
  // fresh score replaces its recorded one. Without the best's binary (a
  // resumed session) the recorded score stands.
  void retime_best_if_beaten(int seq, const Measurement& candidate) {
    if (!best_ || best_artifact_.empty() || !measure::judge(candidate.score, best_score_, opts_.min_gain).faster)
      return;
    Measurement again;
    const bool ok = evaluator_->load(best_artifact_, &again) &&
                    evaluator_->time(cfg_.timed_contexts, spec_.warmup, spec_.samples, &again);
    totals_.load += again.load_s;
    totals_.time += again.time_s;
    emit_or_die("best_retimed", seq, {{"variant", best_->variant}, {"ok", ok}, {"recorded_us", best_score_.us},
                                      {"score_us", ok ? again.score.us : 0.0}, {"seconds", again.time_s},
                                      {"error", ok ? "" : again.error}});
    if (ok) best_score_ = again.score;
  }

  // ktune's own reason when the log has one (a refused build), else the
  // compiler's first line that says "error".
  static std::string first_error_line(const std::string& log) {
    size_t p = log.find("[ktune: error:");
    if (p == std::string::npos) p = log.find("error");
    if (p == std::string::npos) return log.substr(0, 300);
    size_t start = log.rfind('\n', p);
    start = start == std::string::npos ? 0 : start + 1;
    size_t end = log.find('\n', p);
    return log.substr(start, std::min<size_t>(end - start, 400));
  }

  // ---- decide ---------------------------------------------------------------------------
  void decide(int seq, const Variant& v, const std::string& purpose, const Measurement& m, const json& phase) {
    AttemptView a;
    a.seq = seq;
    a.variant = v.id;
    a.template_name = v.template_name;
    a.knobs = v.knobs;
    a.origin = v.origin;
    a.parent = v.parent;
    a.outcome = m.outcome;
    a.error = m.error;
    json fin = {{"outcome", m.outcome}, {"phase_s", phase}, {"error", m.error}};
    if (m.outcome == "ok") {
      a.score_us = m.score.us;
      fin["score_us"] = m.score.us;
      fin["launches_per_step"] = m.launches;
      if (purpose == "baseline") {
        baseline_us_ = m.score.us;
        baseline_ok_ = true;
      }
      a.speedup = baseline_us_ > 0 ? baseline_us_ / m.score.us : 0;
      fin["speedup"] = a.speedup;
      fin["best_before"] = best_ ? best_->variant : "";
      bool accept;
      if (!best_) {
        accept = true;
        a.reason = purpose == "baseline" ? "baseline: the first best" : "the first measured variant";
      } else {
        measure::Verdict vd = measure::judge(m.score, best_score_, opts_.min_gain);
        accept = vd.faster;
        a.reason = vd.reason;
      }
      a.decision = accept ? "accepted" : "rolled_back";
      if (!accept) a.reason += "; rolled back to " + short_id(best_->variant);
      fin["decision"] = a.decision;
      fin["best_after"] = accept ? v.id : best_->variant;
      if (accept) {
        best_ = a;
        best_score_ = m.score;
      }
    } else {
      a.reason = m.outcome + ": " + m.error;
    }
    fin["reason"] = a.reason;
    emit_or_die("attempt_finished", seq, fin);
    if (a.decision == "accepted")
      emit_or_die("best_changed", seq, {{"variant", v.id}, {"score_us", a.score_us}, {"speedup", a.speedup}});
    history_.push_back(a);
    progress_.attempt(elapsed(), a, m, baseline_us_);
  }

  // ---- the loop -----------------------------------------------------------------------------
  void loop() {
    // Attempts in flight when an earlier run of this session was killed.
    for (int seq : interrupted_)
      emit_or_die("attempt_finished", seq, {{"outcome", "interrupted"},
                                            {"reason", "the session was killed during this attempt"}});
    const int batch = opts_.batch > 0 ? opts_.batch : (spec_.builds_overlap_timing ? 2 * spec_.build_workers : 2);
    std::vector<Job> next;
    bool exhausted = false;
    int empty_rounds = 0;
    while (!stopping()) {
      // No more proposals than the attempts left to begin.
      std::vector<Job> jobs = next.empty() ? design(std::min(batch, attempts_left()), &exhausted) : std::move(next);
      next.clear();
      if (exhausted) {
        stop_reason_ = "the designer has nothing left to propose";
        break;
      }
      if (jobs.empty()) {
        // Every proposal was already measured or did not render; a designer
        // that keeps doing that is done.
        if (++empty_rounds >= 20) {
          stop_reason_ = "the designer proposes nothing new";
          break;
        }
        continue;
      }
      empty_rounds = 0;
      // On a GPU, the next batch builds while this one is measured; on the
      // host the CPU is the device, so every build finishes first.
      const int after = std::min(batch, attempts_left() - int(jobs.size()));
      if (spec_.builds_overlap_timing && !stopping() && after > 0) next = design(after, &exhausted, int(jobs.size()));
      if (!spec_.builds_overlap_timing) {
        // Waited for here, not in attempt(): the summary's build time.
        const double t0 = mono_seconds();
        for (Job& j : jobs) j.build.wait();
        totals_.build += mono_seconds() - t0;
      }
      for (Job& j : jobs) {
        if (stopping()) break;
        attempt(j, "candidate");
      }
    }
    if (stop_reason_.empty())
      stop_reason_ = attempts_left() <= 0 ? "the attempt limit was reached" : "the budget ran out";
  }

  // `queued`: attempts already designed but not started (their numbers come first).
  std::vector<Job> design(int batch, bool* exhausted, int queued = 0) {
    double t0 = mono_seconds();
    DesignContext ctx;
    ctx.task = opts_.task;
    ctx.size = opts_.size;
    ctx.backend = opts_.backend;
    ctx.megakernel = mega_t_;
    ctx.megakernel_source = *variants::embedded_file(mega_t_->file);
    ctx.facts = runner_.facts();
    ctx.probes = probes_;
    ctx.history = history_;
    ctx.best = best_ ? &*best_ : nullptr;
    ctx.baseline_us = baseline_us_;
    ctx.budget_left_s = left();
    ctx.seed = opts_.seed;
    std::string err;
    std::vector<traces::AttemptRow> judged;
    if (store_.judged_attempts(opts_.task, opts_.backend, opts_.size, &judged, &err)) {
      std::erase_if(judged, [this](const traces::AttemptRow& a) { return !same_device(a.session_id); });
      for (const traces::AttemptRow& a : judged) ctx.measured.insert(a.variant);
    }
    ctx.measured.insert(measured_.begin(), measured_.end());
    ctx.next_attempt = next_seq_ + queued;
    ctx.record = [this](const std::string& kind, const json& data) { emit_or_die(kind, 0, data); };
    ctx.variant_id = [this](const json& knobs, const std::string& source) {
      Variant v;
      std::string e;
      return render_variant(cfg_, spec_, *mega_t_, knobs, source, &v, &e) ? v.id : std::string();
    };
    if (!earlier_) earlier_ = still_current(judged, ctx.variant_id);
    ctx.earlier = *earlier_;
    std::vector<Proposal> proposals;
    bool ok = designer_->propose(ctx, batch, &proposals, &err);
    totals_.design += mono_seconds() - t0;
    if (!ok) {
      progress_.note("the designer failed: " + err);
      emit_or_die("phase", 0, {{"name", "design"}, {"state", "failed"}, {"error", err}});
    }
    *exhausted = ok && proposals.empty();
    return prepare(proposals);
  }

  // ---- the end ----------------------------------------------------------------------------
  void end(const std::string& status, const std::string& reason) {
    json by_outcome = json::object();
    int accepted = 0, rolled_back = 0;
    for (const AttemptView& a : history_) {
      by_outcome[a.outcome] = by_outcome.value(a.outcome, 0) + 1;
      accepted += a.decision == "accepted";
      rolled_back += a.decision == "rolled_back";
    }
    json summary = {{"attempts", history_.size()},
                    {"by_outcome", by_outcome},
                    {"accepted", accepted},
                    {"rolled_back", rolled_back},
                    {"wall_s", elapsed()},
                    {"phase_s", totals_.to_json()},
                    {"baseline_us", baseline_us_},
                    {"designer", designer_ ? designer_->usage() : json::object()}};
    if (best_) {
      summary["best_variant"] = best_->variant;
      summary["best_us"] = best_->score_us;
      summary["best_speedup"] = best_->speedup;
      summary["best_knobs"] = best_->knobs;
      summary["best_template"] = best_->template_name;
    }
    std::string err;
    emit("session_ended", 0, {{"status", status}, {"reason", reason}, {"summary", summary}}, &err);
    progress_.summary(session_, status, reason, summary);
  }

  SessionOptions opts_;
  traces::Store store_;
  int64_t session_ = 0;
  kimi::KimiConfig cfg_;
  kimi::KimiWeights weights_;
  BackendSpec spec_;
  const variants::Template* baseline_t_ = nullptr;
  const variants::Template* mega_t_ = nullptr;
  std::unique_ptr<Designer> designer_;
  std::unique_ptr<sandbox::BuildCache> builds_;
  std::unique_ptr<measure::OraclePool> oracle_;
  measure::RunnerClient runner_;
  std::unique_ptr<Evaluator> evaluator_;
  std::string workdir_;
  double t0_ = 0, deadline_ = 0;
  int next_seq_ = 1;
  std::atomic<int> attempts_run_{0};  // attempts this run began (the builds' threads read it through stopping())
  std::vector<int> interrupted_;
  std::vector<AttemptView> history_;
  std::set<std::string> measured_;
  std::optional<std::vector<AttemptView>> earlier_;  // still_current(), once the first design step needs it
  std::map<int64_t, bool> same_device_;              // session id -> same_device()
  std::optional<AttemptView> best_;
  measure::Score best_score_;
  std::string best_artifact_;  // the best's build, when this run of the session built it
  double baseline_us_ = 0;
  bool baseline_ok_ = false;
  json probes_ = json::array();
  PhaseTotals totals_;
  std::string stop_reason_;
  Progress progress_;
  std::mutex build_slots_mu_;
  std::condition_variable build_slots_cv_;
  int build_slots_ = 0;
};

}  // namespace

int run_session(const SessionOptions& opts) {
  Session s(opts);
  return s.run();
}

}  // namespace ktune::agent
