// ktune: the command line. Each subcommand parses its flags and calls one
// function of the libraries; the work itself lives there.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>

#include "agent/backend.h"
#include "agent/bench.h"
#include "agent/commands.h"
#include "agent/session.h"
#include "base/fs.h"
#include "traces/report.h"
#include "traces/trace_file.h"

using namespace ktune;

namespace {

// "90", "90s", "2m", "1h30m", "3h" -> seconds.
bool parse_duration(const std::string& text, double* out) {
  double total = 0, num = 0;
  bool have = false, frac = false;
  double scale = 0.1;
  for (char c : text) {
    if (c >= '0' && c <= '9') {
      if (frac) {
        num += (c - '0') * scale;
        scale /= 10;
      } else {
        num = num * 10 + (c - '0');
      }
      have = true;
    } else if (c == '.') {
      frac = true;
    } else if (c == 'h' || c == 'm' || c == 's') {
      if (!have) return false;
      total += num * (c == 'h' ? 3600 : c == 'm' ? 60 : 1);
      num = 0;
      have = frac = false;
      scale = 0.1;
    } else {
      return false;
    }
  }
  total += num;
  *out = total;
  return total > 0;
}

// The GPU is used when there is one and nvcc to build for it.
std::string default_backend() {
  return (file_exists("/dev/nvidiactl") || file_exists("/dev/nvidia0")) && !agent::find_nvcc().empty() ? "cuda"
                                                                                                        : "host";
}

int print_or_fail(bool ok, const std::string& out, const std::string& err) {
  if (!ok) {
    std::fprintf(stderr, "ktune: %s\n", err.c_str());
    return 1;
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  if (!out.empty() && out.back() != '\n') std::fputc('\n', stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ktune: autonomous GPU-kernel tuning sessions"};
  app.require_subcommand(1);
  std::vector<std::string> all_args(argv, argv + argc);
  int rc = 0;

  // ---- run --------------------------------------------------------------------------
  agent::SessionOptions so;
  std::string budget = "2m", backend = "auto", replay_trace;
  auto* run = app.add_subcommand("run", "run (or resume) a tuning session");
  run->add_option("--task", so.task, "the workload")->default_val("kimi-linear");
  run->add_option("--size", so.size, "full (the real task), small (tests), tiny")->default_val("small");
  run->add_option("--backend", backend, "host, cuda or cuda-emu (auto: cuda when a GPU is present)")->default_val("auto");
  run->add_option("--budget", budget, "wall-clock budget: 90s, 2m, 1h30m")->default_val("2m");
  run->add_option("--max-attempts", so.max_attempts,
                  "stop after this many attempts (the baseline's included), or at the budget if sooner")
      ->check(CLI::Range(0, 1000000));
  run->add_option("--db", so.db, "SQLite database of sessions")->default_val("ktune.sqlite");
  run->add_option("--designer", so.designer, "search, llm or replay")->default_val("search");
  run->add_option("--seed", so.seed, "seed of the designer and of the validation inputs")->default_val(1);
  run->add_option("--weights-seed", so.weights_seed, "seed of the task's weights")->default_val(0);
  run->add_option("--resume", so.resume, "continue this session (its settings are reused)");
  run->add_option("--min-gain", so.min_gain, "smallest relative speedup that makes a new best")->default_val(0.01);
  run->add_option("--min-cosine", so.min_cosine, "validation gate on every output")->default_val(0.99);
  run->add_option("--batch", so.batch, "proposals per design step (0: automatic)");
  run->add_option("--samples", so.samples, "timing samples per context (0: backend default)");
  run->add_option("--step-timeout", so.step_timeout_s, "seconds a validate or time request may take (0: default)");
  run->add_option("--replay-trace", replay_trace, "with --designer replay: the trace whose proposals to replay");
  std::string proposals_path;
  run->add_option("--proposals", proposals_path,
                  "with --designer replay: a JSON list of proposals [{template?, knobs?, source?, rationale?}]");
  run->add_option("--runner", so.runner, "path of ktune-runner (default: beside ktune)");
  run->add_flag("--quiet", so.quiet, "print only the summary");
  agent::add_llm_options(run, &so.designer_options);
  run->callback([&] {
    if (!parse_duration(budget, &so.budget_s)) throw CLI::ValidationError("--budget", "not a duration: " + budget);
    so.backend = backend == "auto" ? default_backend() : backend;
    if (!replay_trace.empty()) so.designer_options["trace"] = replay_trace;
    if (!proposals_path.empty()) {
      std::string text, err;
      if (!read_file(proposals_path, &text, &err)) throw CLI::ValidationError("--proposals", err);
      json list = json::parse(text, nullptr, false);
      if (list.is_discarded() || !list.is_array())
        throw CLI::ValidationError("--proposals", proposals_path + " is not a JSON list");
      so.designer_options["proposals"] = list;
    }
    so.argv = all_args;
    rc = agent::run_session(so);
  });

  // ---- history / show / compare -------------------------------------------------------
  std::string db = "ktune.sqlite";
  bool as_json = false;
  int64_t session_id = 0;
  auto* history = app.add_subcommand("history", "sessions, or one session's attempts");
  history->add_option("--db", db)->default_val("ktune.sqlite");
  history->add_option("--session", session_id, "list this session's attempts");
  history->add_flag("--json", as_json);
  history->callback([&] {
    traces::Store store;
    std::string out, err;
    bool ok = store.open(db, &err) &&
              traces::history_report(store, session_id ? std::optional<int64_t>(session_id) : std::nullopt, as_json,
                                     &out, &err);
    rc = print_or_fail(ok, out, err);
  });

  std::string variant;
  auto* show = app.add_subcommand("show", "a variant: knobs, source, parent chain, measurements");
  show->add_option("--db", db)->default_val("ktune.sqlite");
  show->add_option("variant", variant, "variant id, a unique prefix, or best (the latest session's best)")->required();
  show->add_flag("--json", as_json);
  show->callback([&] {
    traces::Store store;
    std::string out, err;
    bool ok = store.open(db, &err) && traces::show_report(store, variant, as_json, &out, &err);
    rc = print_or_fail(ok, out, err);
  });

  int64_t sa = 0, sb = 0;
  auto* compare = app.add_subcommand("compare", "two sessions side by side");
  compare->add_option("--db", db)->default_val("ktune.sqlite");
  compare->add_option("a", sa)->required();
  compare->add_option("b", sb)->required();
  compare->add_flag("--json", as_json);
  compare->callback([&] {
    traces::Store store;
    std::string out, err;
    bool ok = store.open(db, &err) && traces::compare_report(store, sa, sb, as_json, &out, &err);
    rc = print_or_fail(ok, out, err);
  });

  // ---- traces -----------------------------------------------------------------------------
  auto* trace = app.add_subcommand("trace", "export or import a session trace (JSONL)");
  trace->require_subcommand(1);
  std::string out_path, in_path;
  auto* texport = trace->add_subcommand("export", "a session as JSONL on stdout (or --out)");
  texport->add_option("--db", db)->default_val("ktune.sqlite");
  texport->add_option("session", session_id)->required();
  texport->add_option("--out", out_path);
  texport->callback([&] {
    traces::Store store;
    std::string text, err;
    bool ok = store.open(db, &err) && traces::export_trace(store, session_id, &text, &err);
    if (ok && !out_path.empty()) ok = write_file_atomic(out_path, text, &err), text.clear();
    rc = print_or_fail(ok, text, err);
  });
  auto* timport = trace->add_subcommand("import", "a JSONL trace into the database as a new session");
  timport->add_option("--db", db)->default_val("ktune.sqlite");
  timport->add_option("file", in_path)->required();
  timport->callback([&] {
    traces::Store store;
    traces::TraceFile t;
    std::string text, err;
    int64_t id = 0;
    bool ok = read_file(in_path, &text, &err) && traces::parse_trace(text, &t, &err) && store.open(db, &err) &&
              traces::import_trace(store, t, &id, &err);
    rc = print_or_fail(ok, ok ? "imported as session " + std::to_string(id) : "", err);
  });

  // ---- replay -------------------------------------------------------------------------------
  std::string svg_path;
  auto* replay = app.add_subcommand("replay", "a recorded session's timeline (or --serve its LLM replies)");
  replay->add_option("file", in_path, "trace file (JSONL)")->required();
  replay->add_flag("--json", as_json);
  replay->add_option("--svg", svg_path, "also write the best-so-far speedup plot here");
  agent::add_replay_serve_options(replay);
  replay->callback([&] {
    if (agent::replay_serve_requested(replay)) {
      rc = agent::run_replay_serve(replay, in_path);
      return;
    }
    traces::TraceFile t;
    std::string text, out, err;
    bool ok = read_file(in_path, &text, &err) && traces::parse_trace(text, &t, &err) &&
              traces::replay_report(t, as_json, &out, &err);
    if (ok && !svg_path.empty()) {
      std::string svg;
      ok = traces::replay_svg(t, &svg, &err) && write_file_atomic(svg_path, svg, &err);
    }
    rc = print_or_fail(ok, out, err);
  });

  // ---- probe / bench --------------------------------------------------------------------------
  std::string size = "full", runner_path;
  auto* probe = app.add_subcommand("probe", "the measure phase: device facts, bandwidth, launch and barrier cost, floors");
  probe->add_option("--backend", backend)->default_val("auto");
  probe->add_option("--size", size)->default_val("full");
  probe->add_option("--runner", runner_path);
  probe->callback([&] { rc = agent::run_probe(backend == "auto" ? default_backend() : backend, size, runner_path); });

  agent::BenchOptions bo;
  std::vector<std::string> knobs_texts;
  auto* bench = app.add_subcommand("bench", "baseline vs megakernel vs floor at every decode shape, in one run");
  bench->add_option("--task", bo.task)->default_val("kimi-linear");
  bench->add_option("--backend", backend)->default_val("auto");
  bench->add_option("--size", bo.size)->default_val("full");
  bench->add_option("--knobs", knobs_texts, "megakernel knobs as JSON (defaults where absent); repeat to compare several");
  bench->add_option("--db", bo.db, "with --variant: the database holding it");
  bench->add_option("--variant", bo.variant, "benchmark this recorded variant (id, prefix, or best)");
  bench->add_option("--samples", bo.samples, "timing samples per context");
  bench->add_option("--seeds", bo.seeds, "validation seeds per context")->default_val(3);
  std::vector<std::string> case_texts;
  bench->add_option("--case", case_texts,
                    "validate at exactly this case, SEED:CONTEXT (repeatable; instead of --seeds and --contexts)");
  bench->add_option("--contexts", bo.contexts, "validate at these contexts (default: the session's and the timed ones)")
      ->delimiter(',');
  bench->add_option("--repeat", bo.repeat, "validate each case this many times (an intermittent answer shows)")
      ->default_val(1)
      ->check(CLI::Range(1, 1000));
  bench->add_flag("!--validate-only", bo.timing, "validate, then stop (no timing, table or profiles)");
  bench->add_option("--json", bo.json_out, "also write the results as JSON");
  bench->add_flag("!--no-baseline", bo.with_baseline, "skip the baseline");
  bench->add_option("--rounds", bo.rounds,
                    "time the variants this many times in turn (A B A B ...); each one's figure is the median of "
                    "its rounds' medians, so a drift of the machine falls on all of them alike")
      ->default_val(1)
      ->check(CLI::Range(1, 100));
  bench->add_option("--runner", bo.runner);
  bench->callback([&] {
    bo.backend = backend == "auto" ? default_backend() : backend;
    for (const std::string& text : knobs_texts) {
      json k = json::parse(text, nullptr, false);
      if (k.is_discarded() || !k.is_object()) throw CLI::ValidationError("--knobs", "not a JSON object: " + text);
      bo.knob_sets.push_back(k);
    }
    for (const std::string& text : case_texts) {
      int seed = 0, context = 0;
      char tail = 0;
      if (std::sscanf(text.c_str(), "%d:%d%c", &seed, &context, &tail) != 2)
        throw CLI::ValidationError("--case", "expected SEED:CONTEXT, got '" + text + "'");
      bo.cases.push_back({seed, context});
    }
    rc = agent::run_bench(bo);
  });

  agent::add_export_command(&app, &rc);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return rc;
}
