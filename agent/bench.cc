#include "agent/bench.h"

#include <algorithm>
#include <cstdio>
#include <future>
#include <map>
#include <set>

#include "agent/backend.h"
#include "agent/evaluator.h"
#include "base/clock.h"
#include "base/fs.h"
#include "base/sha256.h"
#include "kernels/kimi/templates.h"
#include "measure/stats.h"
#include "traces/store.h"

namespace ktune::agent {

namespace {

// Everything a probe or bench run holds: config, weights, runner, oracle.
struct Bench {
  kimi::KimiConfig cfg;
  BackendSpec spec;
  kimi::KimiWeights weights;
  measure::RunnerClient runner;
  std::unique_ptr<measure::OraclePool> oracle;
  std::string workdir;

  bool start(const std::string& backend, const std::string& size, uint64_t weights_seed, const std::string& runner_path,
             std::string* err) {
    if (!kimi::KimiConfig::preset(size, &cfg, err) || !backend_spec(backend, &spec, err)) return false;
    double t0 = mono_seconds();
    bool generated = false;
    if (!kimi::load_weights(cfg, weights_seed, &weights, err, &generated)) return false;
    std::printf("weights: %s %.0f MB (%s in %.1f s)\n", size.c_str(), weights.total_bytes() / 1e6,
                generated ? "generated" : "loaded", mono_seconds() - t0);
    if (!make_temp_dir(join_path(cache_dir(), "work"), "bench-", &workdir, err)) return false;
    measure::RunnerOptions ro;
    ro.runner = runner_path.empty() ? join_path(self_dir(), "ktune-runner") : runner_path;
    ro.backend = backend;
    ro.size = size;
    ro.weights_seed = weights_seed;
    ro.workdir = join_path(workdir, "runner");
    ro.log_path = join_path(workdir, "runner.log");
    ro.memory_bytes = spec.runner_memory_bytes;
    t0 = mono_seconds();
    if (!runner.start(ro, err)) return false;
    std::printf("runner: started in %.1f s on %s\n", mono_seconds() - t0, runner.facts().dump().c_str());
    oracle = std::make_unique<measure::OraclePool>(weights);
    return true;
  }

  // Probes, printed; returns the bandwidth the floor is computed from.
  double probe(json* out) {
    measure::RunnerReply r = runner.call({{"op", "probe"}}, 600);
    if (!r.ok) {
      std::printf("probe failed: %s\n", r.error.c_str());
      return 0;
    }
    *out = r.body.value("probes", json::array());
    double bw = 0;
    std::printf("\n%-28s %12s  %s\n", "probe", "value", "detail");
    for (const json& p : *out) {
      std::string n = p.value("name", "");
      if (n == "d2d_bandwidth" || n == "memory_bandwidth") bw = p.value("value", 0.0);
      std::string d = p.contains("detail") ? (p["detail"].is_string() ? p["detail"].get<std::string>() : p["detail"].dump()) : "";
      std::printf("%-28s %9.3f %-3s %s\n", n.c_str(), p.value("value", 0.0), p.value("unit", "").c_str(), d.c_str());
    }
    std::printf("\n%-10s %12s %12s\n", "context", "bytes (MB)", "floor (us)");
    for (auto [ctx, steps] : cfg.timed_contexts)
      std::printf("%-10d %12.1f %12.2f\n", ctx, cfg.bytes_per_step(ctx) / 1e6,
                  bw > 0 ? cfg.bytes_per_step(ctx) / (bw * 1e9) * 1e6 : 0.0);
    return bw;
  }
};

struct Row {
  std::string name;
  Variant v;
  Measurement m;
  bool ok = false;
  std::string artifact;  // the built variant, loaded again for each round
};

const json* timing_at(const Measurement& m, int ctx) {
  for (const json& t : m.timings)
    if (t.value("context", -1) == ctx) return &t;
  return nullptr;
}

// The worst value of a metric per kind of output over the validation cases
// (both are gated): the lowest of a similarity (cosine), the highest of an
// error (relative L2). A case without the metric counts as the worst.
enum class Worst { Lowest, Highest };
json worst_of(const Measurement& m, const char* metric, Worst worst) {
  const bool lowest = worst == Worst::Lowest;
  json w = json::object();
  for (const auto& c : m.cases)
    for (auto& [name, s] : c.metrics.items()) {
      std::string kind = name.find('.') == std::string::npos ? name : name.substr(name.find('.') + 1);
      const double v = s.value(metric, lowest ? 0.0 : 1e9);
      if (!w.contains(kind) || (lowest ? v < w[kind].get<double>() : v > w[kind].get<double>())) w[kind] = v;
    }
  return w;
}

// Phases 0-8 start a phase; 9-13 are points inside the phase above them
// (megakernel.cu, kPhase*): a row's time runs from its point to the next.
const char* kPhaseNames[] = {"qkvg / q,kv_a",
                             "kda / q_abs",
                             "attention",
                             "w_uv",
                             "o_proj",
                             "moe gate/up: router, shared, top-k, routed",
                             "moe fix: routed gate/up again (predict on, a missed prediction)",
                             "down",
                             "end",
                             "  . first item: loads + compute (warp 0)",
                             "  . first item: reduce, hand-off, epilogue",
                             "  . the block's other items",
                             "  . waiting at the grid barrier",
                             "  . L2 prefetch of the next phase"};
constexpr int kLastPhase = 13;
// The MoE routing's events, which every block records (megakernel.cu,
// kEvent*), by point; points 6-8 are block 0's router-row item and its first
// w_uv item's staging.
struct EventPoint {
  int point;
  const char* name;
};
const EventPoint kEvents[] = {{2, "  . input staged"},
                              {3, "  . router rows published"},
                              {4, "  . all logits seen"},
                              {5, "  . experts selected"},
                              {14, "  . first routed item reached"},  // done with the block's items before it
                              {15, "  . first routed item computed"}};  // warp 0 has its sums
const char* event_name(int point) {
  for (const EventPoint& e : kEvents)
    if (e.point == point) return e.name;
  return nullptr;
}
bool is_event(int point) { return event_name(point) != nullptr; }
const char* point_name(int phase, int point) {
  if (point == 0) return "  . start, input staging";
  if (phase == 2 && point >= 6 && point <= 8) {  // the attention's tiles (megakernel.cu, kPointTile*)
    static const char* tile[] = {"  . tiles: waiting to land", "  . tiles: mma (values, next scores)",
                                 "  . tiles: barrier, softmax"};
    return tile[point - 6];
  }
  if (point == 6) return "  . block 0's router rows";
  if (point == 7) return "  . first item: input staged";
  if (point == 8) return "  . first item: chunk weights done";
  return is_event(point) ? event_name(point) : kPhaseNames[std::min(point, kLastPhase)];
}

// "0 K", "3 M": a layer and its attention; "-" past the last layer (the end).
std::string layer_label(const kimi::KimiConfig& cfg, int layer) {
  return layer < cfg.layers() ? std::to_string(layer) + (cfg.is_kda(layer) ? " K" : " M") : std::string("-");
}

// A stamp's tag (megakernel.cu, stamp): a phase start is layer * 16 + phase;
// a point inside it is 1024 + (layer * 16 + phase) * 16 + point. The
// phase's key and the point (0 for the phase start).
struct StampTag {
  int key, point;
  bool is_point;
};
StampTag split_tag(int tag) {
  return tag >= 1024 ? StampTag{(tag - 1024) / 16, (tag - 1024) % 16, true} : StampTag{tag, 0, false};
}

// Mean time per phase over the profiled steps, per context.
void print_profile(const json& profiles, const kimi::KimiConfig& cfg) {
  std::printf("\nper-phase time (us, mean over profiled steps; phase start to next phase start):\n");
  std::map<int, std::vector<double>> per_tag;  // tag -> mean us per context
  std::map<int, std::vector<int>> point_order;  // layer * 16 + phase -> its points in the order block 0 stamped them
  std::vector<double> totals;
  for (const json& p : profiles) {
    std::map<int, double> sum;
    int runs = 0;
    for (const json& r : p["runs"]) {
      const json& st = r["stamps"];
      for (size_t i = 0; i + 1 < st.size(); ++i)
        sum[st[i][0].get<int>()] += double(st[i + 1][1].get<uint64_t>() - st[i][1].get<uint64_t>()) / 1000.0;
      for (const json& s : st) {
        const StampTag t = split_tag(s[0].get<int>());
        std::vector<int>& order = point_order[t.key];
        if (std::find(order.begin(), order.end(), t.point) == order.end()) order.push_back(t.point);
      }
      ++runs;
    }
    double total = 0;
    for (auto& [tag, us] : sum) {
      per_tag[tag].resize(profiles.size(), 0.0);
      per_tag[tag][totals.size()] = us / std::max(1, runs);
      total += us / std::max(1, runs);
    }
    totals.push_back(total);
  }
  // A phase's row is its whole time; below it, when it stamped points, the
  // part up to the first point and each point's part, in the order they
  // happened.
  std::map<int, std::vector<double>> phase_total;          // layer * 16 + phase -> us per context
  std::map<int, std::map<int, std::vector<double>>> parts;  // same key -> point -> us per context
  for (auto& [tag, v] : per_tag) {
    const StampTag st = split_tag(tag);
    auto& t = phase_total[st.key];
    t.resize(v.size(), 0.0);
    for (size_t i = 0; i < v.size(); ++i) t[i] += v[i];
    parts[st.key][st.point] = v;
  }
  std::printf("%-6s %-26s", "layer", "phase");
  for (const json& p : profiles) std::printf(" %10d", p.value("context", 0));
  std::printf("\n");
  auto row = [](const std::string& layer, const char* name, const std::vector<double>& v) {
    std::printf("%-6s %-26s", layer.c_str(), name);
    for (double us : v) std::printf(" %10.2f", us);
    std::printf("\n");
  };
  std::map<int, std::vector<double>> by_phase;
  for (auto& [key, v] : phase_total) {
    const int ph = key % 16;
    row(layer_label(cfg, key / 16), kPhaseNames[std::min(ph, kLastPhase)], v);
    if (parts[key].size() > 1)
      for (int point : point_order[key])
        if (parts[key].count(point)) row("", point_name(key % 16, point), parts[key][point]);
    auto& acc = by_phase[ph];
    acc.resize(v.size(), 0.0);
    for (size_t i = 0; i < v.size(); ++i) acc[i] += v[i];
  }
  std::printf("%-6s %-26s", "all", "(sum of stamped phases)");
  for (double t : totals) std::printf(" %10.2f", t);
  std::printf("\nby phase over all layers:\n");
  for (auto& [ph, v] : by_phase) {
    std::printf("%-6s %-26s", "", kPhaseNames[std::min(ph, kLastPhase)]);
    for (size_t i = 0; i < v.size(); ++i) std::printf(" %9.2f%%", totals[i] > 0 ? 100.0 * v[i] / totals[i] : 0.0);
    std::printf("\n");
  }
}

// Which blocks a phase waits for: per grid barrier (named by block 0's
// barrier point before it), the mean over profiled steps of how long the
// median block and the first block waited for the last one, and the block
// that was last most often. A wide spread with one block always last is a
// slow item; a wide spread with the last block changing is the memory
// system's noise, which only smaller or dynamically taken items absorb.
// The same records hold the MoE routing's events (is_event): when the
// median, the 90th-percentile and the last block reached each, from block
// 0's start of the phase.
void print_arrivals(const json& profiles, const kimi::KimiConfig& cfg) {
  struct Record {
    int key = 0, point = 0;
    double median = 0, spread = 0, p90 = 0, last = 0;  // barrier: waits; event: times since the phase start
    std::map<int, int> last_block;  // block -> steps it was last
    int runs = 0;
  };
  auto most_last = [](const Record& r) {
    return *std::max_element(r.last_block.begin(), r.last_block.end(),
                             [](const auto& x, const auto& y) { return x.second < y.second; });
  };
  bool any = false;
  for (const json& p : profiles) {
    std::vector<Record> recs;
    for (const json& r : p["runs"]) {
      const json& st = r["stamps"];
      const json arr = r.value("arrivals", json::array());
      struct Key {
        int key, point;
        double phase_start;
      };
      std::vector<Key> keys;  // block 0's barrier and event points, in order
      std::map<int, double> phase_start;
      for (const json& s : st) {
        const StampTag t = split_tag(s[0].get<int>());
        const double ns = double(s[1].get<uint64_t>());
        if (!t.is_point) {
          phase_start[t.key] = ns;
          continue;
        }
        if (t.point == 12 || is_event(t.point)) keys.push_back({t.key, t.point, phase_start[t.key]});
      }
      for (size_t k = 0; k < arr.size() && k < keys.size(); ++k) {
        if (recs.size() <= k) recs.resize(k + 1);
        Record& b = recs[k];
        const json& a = arr[k];
        const double first = double(a[0].get<uint64_t>()), median = double(a[1].get<uint64_t>()),
                     last = double(a[2].get<uint64_t>()), p90 = a.size() > 4 ? double(a[4].get<uint64_t>()) : last;
        b.key = keys[k].key;
        b.point = keys[k].point;
        if (b.point == 12) {
          b.median += (last - median) / 1000.0;
          b.spread += (last - first) / 1000.0;
        } else {
          const double t0 = keys[k].phase_start;
          b.median += (median - t0) / 1000.0;
          b.p90 += (p90 - t0) / 1000.0;
          b.last += (last - t0) / 1000.0;
        }
        b.last_block[a[3].get<int>()]++;
        b.runs++;
      }
    }
    if (recs.empty()) continue;
    if (!any)
      std::printf("\nblocks' arrival at each grid barrier (us, mean over profiled steps): how long the median and the\n"
                  "first block waited for the last one, and the block most often last (of how many steps)\n");
    any = true;
    std::printf("context %d\n%-6s %-42s %12s %12s %14s\n", p.value("context", 0), "layer", "phase before the barrier",
                "median wait", "first wait", "last block");
    double sum_median = 0, sum_spread = 0;
    for (const Record& b : recs) {
      if (b.runs == 0 || b.point != 12) continue;
      const auto most = most_last(b);
      std::printf("%-6s %-42s %12.2f %12.2f %8d (%d/%d)\n", layer_label(cfg, b.key / 16).c_str(),
                  kPhaseNames[std::min(b.key % 16, kLastPhase)], b.median / b.runs, b.spread / b.runs, most.first,
                  most.second, b.runs);
      sum_median += b.median / b.runs;
      sum_spread += b.spread / b.runs;
    }
    std::printf("%-6s %-42s %12.2f %12.2f\n", "all", "(sum over the barriers)", sum_median, sum_spread);
    bool events = false;
    for (const Record& b : recs) {
      if (b.runs == 0 || b.point == 12) continue;
      if (!events)
        std::printf("the MoE routing, every block (us since block 0 started the phase; the blocks that record it)\n"
                    "%-6s %-42s %12s %12s %12s %14s\n",
                    "layer", "event", "median", "90%", "last", "last block");
      events = true;
      const auto most = most_last(b);
      std::printf("%-6s %-42s %12.2f %12.2f %12.2f %8d (%d/%d)\n", layer_label(cfg, b.key / 16).c_str(),
                  event_name(b.point) + 4 /* without the indent */, b.median / b.runs, b.p90 / b.runs, b.last / b.runs,
                  most.first, most.second, b.runs);
    }
  }
}

// Besides each step timed alone (the score's samples), every variant is
// timed back to back, in batches of this many steps, as a decode loop runs
// them: there each launch overlaps the step before it (RESULTS, runs 267
// and 275).
constexpr int kBackToBackSteps = 32;

// --rounds: after validation, every variant that passed is timed `rounds`
// times, each round loading them in turn, so that a slow drift of the
// machine (seen at 2-5 us between device calls) falls on all of them alike.
// Each context's median_us becomes the median of the rounds' medians;
// rounds_us keeps them in order; likewise back_to_back_rounds_us.
void time_in_rounds(Evaluator& ev, const kimi::KimiConfig& cfg, const BackendSpec& spec, int rounds,
                    std::vector<Row>* rows) {
  for (int round = 0; round < rounds; ++round)
    for (Row& r : *rows) {
      if (!r.ok) continue;
      Measurement t;
      if (!ev.load(r.artifact, &t) || !ev.time(cfg.timed_contexts, spec.warmup, spec.samples, &t, kBackToBackSteps)) {
        r.ok = false;
        r.m.outcome = t.outcome;
        r.m.error = "round " + std::to_string(round + 1) + ": " + t.error;
        continue;
      }
      if (round == 0) r.m.timings = t.timings;
      r.m.time_s += t.time_s;
      for (json& row : r.m.timings) {
        const json* now = timing_at(t, row.value("context", -1));
        if (!row.contains("rounds_us")) row["rounds_us"] = json::array();
        row["rounds_us"].push_back(now ? now->value("median_us", 0.0) : 0.0);
        if (!row.contains("back_to_back_rounds_us")) row["back_to_back_rounds_us"] = json::array();
        row["back_to_back_rounds_us"].push_back(now ? now->value("back_to_back_median_us", 0.0) : 0.0);
      }
    }
  auto median_of = [](const json& v) { return measure::summarize(v.get<std::vector<double>>()).median; };
  for (Row& r : *rows)
    for (json& row : r.m.timings) {
      if (row.contains("rounds_us")) row["median_us"] = median_of(row["rounds_us"]);
      if (row.contains("back_to_back_rounds_us")) row["back_to_back_median_us"] = median_of(row["back_to_back_rounds_us"]);
    }
}

// Every variant's steps timed back to back beside the same steps timed
// alone (the tables above), and what the launch's overlap saves.
void print_back_to_back(const std::vector<Row>& rows, const kimi::KimiConfig& cfg, int rounds) {
  std::printf("\nback to back (us per step: batches of %d steps launched one after another, as a decode loop runs "
              "them; the median of %d batches%s), and alone - back to back:\n%-14s",
              kBackToBackSteps, Evaluator::kBackToBackBatches, rounds > 1 ? ", then of the rounds" : "", "variant");
  for (auto [ctx, steps] : cfg.timed_contexts) std::printf(" %10d %7s", ctx, "saved");
  std::printf("\n");
  for (const Row& r : rows) {
    if (!r.ok) continue;
    std::printf("%-14s", r.name.c_str());
    for (auto [ctx, steps] : cfg.timed_contexts) {
      const json* t = timing_at(r.m, ctx);
      const double b2b = t ? t->value("back_to_back_median_us", 0.0) : 0.0, alone = t ? t->value("median_us", 0.0) : 0.0;
      std::printf(" %10.1f %7.1f", b2b, alone - b2b);
    }
    std::printf("\n");
  }
}

void print_rounds(const std::vector<Row>& rows, const kimi::KimiConfig& cfg) {
  std::printf("\neach round's median (us), in the order timed:\n");
  for (const Row& r : rows) {
    if (!r.ok) continue;
    std::printf("%-14s", r.name.c_str());
    for (auto [ctx, steps] : cfg.timed_contexts) {
      const json* t = timing_at(r.m, ctx);
      std::printf("  %d:", ctx);
      if (t)
        for (double us : t->value("rounds_us", std::vector<double>{})) std::printf(" %.1f", us);
    }
    std::printf("\n");
  }
}

}  // namespace

int run_probe(const std::string& backend, const std::string& size, const std::string& runner) {
  Bench b;
  std::string err;
  if (!b.start(backend, size, 0, runner, &err)) {
    std::fprintf(stderr, "ktune probe: %s\n", err.c_str());
    return 1;
  }
  json probes;
  b.probe(&probes);
  b.runner.stop();
  return 0;
}

bool bench_cases(const BenchOptions& o, const kimi::KimiConfig& cfg, std::vector<std::pair<int, int>>* out,
                 std::string* err) {
  std::vector<std::pair<int, int>> once = o.cases;
  if (once.empty()) {
    // By default at every context a session validates at and every timed one.
    std::set<int> at(o.contexts.begin(), o.contexts.end());
    if (at.empty()) {
      at.insert(cfg.validate_contexts.begin(), cfg.validate_contexts.end());
      for (auto [ctx, steps] : cfg.timed_contexts) at.insert(ctx);
    }
    for (int s = 1; s <= o.seeds; ++s)
      for (int ctx : at) once.push_back({1000 + s, ctx});
  }
  for (auto [seed, ctx] : once)
    if (ctx < 0 || ctx >= cfg.max_context()) {
      *err = "context " + std::to_string(ctx) + " is outside the " + cfg.name + " config's cache (0.." +
             std::to_string(cfg.max_context() - 1) + ")";
      return false;
    }
  if (once.empty() || o.repeat < 1) {
    *err = "no validation cases (--seeds, --case or --repeat below 1)";
    return false;
  }
  out->clear();
  for (int k = 0; k < o.repeat; ++k) out->insert(out->end(), once.begin(), once.end());
  return true;
}

namespace {

// How many cases failed and which: every failing case when there are few,
// and how often each (seed, context) failed, so an intermittent answer (some
// repeats of a case pass) reads apart from a steady one.
void print_case_summary(const Measurement& m) {
  int mism = 0, failed = 0;
  std::map<std::pair<int, int>, std::pair<int, int>> tally;  // (seed, context) -> (failed, runs)
  for (const measure::CaseCheck& c : m.cases) {
    mism += !c.experts_match;
    failed += !c.passed;
    auto& t = tally[{c.seed, c.context}];
    t.first += !c.passed;
    ++t.second;
  }
  std::printf("  cases with other experts than the oracle: %d; failed: %d of %zu\n", mism, failed, m.cases.size());
  int shown = 0;
  for (const measure::CaseCheck& c : m.cases) {
    if (c.passed && c.experts_match) continue;
    if (++shown > 12) {
      std::printf("  ...\n");
      break;
    }
    // A failure that a routing note explains already ends with the note.
    const bool noted = c.routing_note.empty() || c.failure.find(c.routing_note) != std::string::npos;
    std::printf("  seed %d context %d: %s%s%s\n", c.seed, c.context, c.passed ? "passed" : c.failure.c_str(),
                noted ? "" : "; ", noted ? "" : c.routing_note.c_str());
  }
  for (const auto& [key, t] : tally)
    if (t.second > 1 && t.first > 0)
      std::printf("  seed %d context %d failed %d of %d runs\n", key.first, key.second, t.first, t.second);
}

}  // namespace

int run_bench(const BenchOptions& o) {
  Bench b;
  std::string err;
  if (o.task != "kimi-linear") {
    std::fprintf(stderr, "ktune bench: unknown task '%s'\n", o.task.c_str());
    return 1;
  }
  if (!b.start(o.backend, o.size, o.weights_seed, o.runner, &err)) {
    std::fprintf(stderr, "ktune bench: %s\n", err.c_str());
    return 1;
  }
  json probes;
  double bw = b.probe(&probes);
  if (o.samples > 0) b.spec.samples = o.samples;
  if (o.warmup >= 0) b.spec.warmup = o.warmup;

  // The variants: the baseline and the megakernel (default knobs, the given
  // knobs, or a recorded variant's exact source).
  std::vector<Row> rows;
  const variants::Template* mega = kimi::megakernel_template(b.spec.templates);
  if (o.with_baseline) {
    Row r;
    r.name = "baseline";
    if (!render_variant(b.cfg, b.spec, *kimi::baseline_template(b.spec.templates), {}, "", &r.v, &err)) {
      std::fprintf(stderr, "ktune bench: %s\n", err.c_str());
      return 1;
    }
    rows.push_back(r);
  }
  std::vector<json> knob_sets = o.knob_sets.empty() ? std::vector<json>{json::object()} : o.knob_sets;
  if (!o.variant.empty()) {
    Row mk;
    mk.name = "megakernel";
    traces::Store store;
    traces::VariantRow vr;
    if (!store.open(o.db, &err) || !store.variant(o.variant, &vr, &err)) {
      std::fprintf(stderr, "ktune bench: %s\n", err.c_str());
      return 1;
    }
    mk.v.source = vr.source;
    mk.v.id = sha256_hex(vr.source);
    mk.v.template_name = vr.template_name;
    mk.v.knobs = vr.knobs;
    const variants::Template* t = kimi::find_template(vr.template_name);
    mk.v.max_launches = t ? t->max_launches : 1;
    rows.push_back(mk);
  } else {
    for (size_t k = 0; k < knob_sets.size(); ++k) {
      Row mk;
      mk.name = k == 0 ? "megakernel" : "megakernel#" + std::to_string(k);
      if (!render_variant(b.cfg, b.spec, *mega, knob_sets[k], "", &mk.v, &err)) {
        std::fprintf(stderr, "ktune bench: knob set %zu: %s\n", k, err.c_str());
        return 1;
      }
      for (const std::string& inert : mega->space.inert_moved(mega->space.complete(knob_sets[k])))
        std::printf("note: knob set %zu: %s changes nothing at this point (measured at its default)\n", k,
                    inert.c_str());
      rows.push_back(mk);
    }
  }

  sandbox::BuildCache cache(join_path(cache_dir(), "builds"));
  std::vector<std::future<sandbox::BuildResult>> builds;
  for (Row& r : rows)
    builds.push_back(std::async(std::launch::async, [&cache, &b, &r] { return cache.build(b.spec.build_request(r.v.source)); }));
  measure::Gate gate;
  Evaluator ev(b.weights, b.spec, b.runner, *b.oracle, join_path(b.workdir, "runner"), gate, b.spec.step_timeout_s);
  ev.keep_oracle_answers(true);
  std::vector<std::pair<int, int>> cases;
  if (!bench_cases(o, b.cfg, &cases, &err)) {
    std::fprintf(stderr, "ktune bench: %s\n", err.c_str());
    return 1;
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    Row& r = rows[i];
    sandbox::BuildResult br = builds[i].get();
    std::printf("\n%s %s: build %s (%.1f s%s) %s\n", r.name.c_str(), r.v.id.substr(0, 12).c_str(),
                br.ok ? "ok" : "FAILED", br.seconds, br.cached ? ", cached" : "", br.resources.dump().c_str());
    if (!br.ok) {
      // The head holds the compiler's first errors, the tail ktune's own note.
      const size_t n = br.log.size();
      std::printf("%s\n", n <= 4600 ? br.log.c_str() : (br.log.substr(0, 4000) + "\n...\n" + br.log.substr(n - 600)).c_str());
      continue;
    }
    r.artifact = br.artifact;
    r.ok = ev.load(br.artifact, &r.m) && ev.validate(cases, r.v.max_launches, &r.m) &&
           (o.rounds > 1 || !o.timing || ev.time(b.cfg.timed_contexts, b.spec.warmup, b.spec.samples, &r.m, kBackToBackSteps));
    std::printf("  %s%s%s; launches/step %d (declared %d); validate %.1f s, ", r.m.outcome.c_str(),
                r.m.error.empty() ? "" : ": ", r.m.error.c_str(), r.m.launches, r.m.declared_launches, r.m.validate_s);
    if (!o.timing)
      std::printf("not timed (--validate-only)\n");
    else if (o.rounds > 1)
      std::printf("timed in rounds once every variant is validated\n");
    else
      std::printf("time %.1f s\n", r.m.time_s);
    std::printf("  worst cosine over %zu cases: %s\n", r.m.cases.size(),
                worst_of(r.m, "cosine", Worst::Lowest).dump().c_str());
    std::printf("  worst relative L2 error: %s\n", worst_of(r.m, "rel_l2", Worst::Highest).dump().c_str());
    print_case_summary(r.m);
  }

  if (o.timing && o.rounds > 1) time_in_rounds(ev, b.cfg, b.spec, o.rounds, &rows);

  // The table: one row per context, everything from this run.
  json results = {{"probes", probes}, {"facts", b.runner.facts()}, {"bandwidth_gb_s", bw}, {"rows", json::array()},
                  {"variants", json::array()}};
  for (const Row& r : rows)
    results["variants"].push_back({{"name", r.name}, {"id", r.v.id}, {"knobs", r.v.knobs}, {"outcome", r.m.outcome},
                                   {"error", r.m.error}, {"launches_per_step", r.m.launches},
                                   {"worst_cosine", worst_of(r.m, "cosine", Worst::Lowest)},
                                   {"worst_rel_l2", worst_of(r.m, "rel_l2", Worst::Highest)},
                                   {"timings", r.m.timings}});
  if (!o.timing) {  // --validate-only: each case's check instead of the table
    bool all_ok = true;
    for (size_t i = 0; i < rows.size(); ++i) {
      json cases = json::array();
      for (const measure::CaseCheck& c : rows[i].m.cases) cases.push_back(c.to_json());
      results["variants"][i]["cases"] = cases;
      all_ok = all_ok && rows[i].ok;
    }
    std::string e;
    if (!o.json_out.empty() && !write_file_atomic(o.json_out, results.dump(2), &e))
      std::fprintf(stderr, "ktune bench: %s\n", e.c_str());
    b.runner.stop();
    return all_ok ? 0 : 2;
  }
  const Row* base = o.with_baseline ? &rows[0] : nullptr;
  const Row& m = rows[o.with_baseline ? 1 : 0];
  std::printf("\n%-8s %14s %14s %10s %9s %9s %14s\n", "context", "baseline us", "megakernel us", "floor us",
              "speedup", "of floor", "launches b/m");
  for (auto [ctx, steps] : b.cfg.timed_contexts) {
    const json* bt = base && base->ok ? timing_at(base->m, ctx) : nullptr;
    const json* mt = m.ok ? timing_at(m.m, ctx) : nullptr;
    double bu = bt ? bt->value("median_us", 0.0) : 0, mu = mt ? mt->value("median_us", 0.0) : 0;
    double floor = bw > 0 ? b.cfg.bytes_per_step(ctx) / (bw * 1e9) * 1e6 : 0;
    std::printf("%-8d %14.1f %14.1f %10.1f %8.2fx %8.1f%% %7d/%d\n", ctx, bu, mu, floor, mu > 0 ? bu / mu : 0.0,
                mu > 0 ? 100.0 * floor / mu : 0.0, base ? base->m.launches : -1, m.m.launches);
    results["rows"].push_back({{"context", ctx}, {"steps", steps}, {"baseline_us", bu}, {"megakernel_us", mu},
                               {"floor_us", floor}, {"speedup", mu > 0 ? bu / mu : 0.0},
                               {"fraction_of_floor", mu > 0 ? floor / mu : 0.0},
                               {"baseline_p10_p90", bt ? json{bt->value("p10_us", 0.0), bt->value("p90_us", 0.0)} : json()},
                               {"megakernel_p10_p90", mt ? json{mt->value("p10_us", 0.0), mt->value("p90_us", 0.0)} : json()},
                               {"baseline_back_to_back_us", bt ? bt->value("back_to_back_median_us", 0.0) : 0.0},
                               {"megakernel_back_to_back_us", mt ? mt->value("back_to_back_median_us", 0.0) : 0.0},
                               {"launches_baseline", base ? base->m.launches : -1},
                               {"launches_megakernel", m.m.launches}});
  }
  std::printf("(medians over %d samples per context after %d warm-up steps%s; floor = bytes per step / %.0f GB/s; "
              "launches counted per step by %s)\n",
              b.spec.samples, b.spec.warmup,
              o.rounds > 1 ? (", the median of " + std::to_string(o.rounds) + " rounds' medians").c_str() : "", bw,
              b.spec.name == "cuda" ? ("CUPTI: " + b.runner.facts().value("cupti", std::string("?"))).c_str()
                                    : "the runner");
  // Every megakernel variant side by side (the levers), same run, same method.
  if (rows.size() > size_t(o.with_baseline ? 2 : 1)) {
    std::printf("\nmegakernel variants (median us per step; all from this run):\n%-14s", "variant");
    for (auto [ctx, steps] : b.cfg.timed_contexts) std::printf(" %10d", ctx);
    std::printf("  launches  knobs\n");
    for (const Row& r : rows) {
      if (&r == base) continue;
      std::printf("%-14s", r.name.c_str());
      for (auto [ctx, steps] : b.cfg.timed_contexts) {
        const json* t = r.ok ? timing_at(r.m, ctx) : nullptr;
        std::printf(" %10.1f", t ? t->value("median_us", 0.0) : 0.0);
      }
      std::printf("  %8d  %s%s\n", r.m.launches, r.v.knobs.dump().c_str(),
                  r.ok ? "" : ("  [" + r.m.outcome + ": " + r.m.error.substr(0, 80) + "]").c_str());
    }
  }
  if (o.rounds > 1) print_rounds(rows, b.cfg);
  print_back_to_back(rows, b.cfg, o.rounds);
  // Where a step's time goes: each megakernel variant rebuilt with profile
  // stamps, stepped at each context; a phase's time runs from its start to
  // the next phase's start (its barrier wait included).
  results["profiles"] = json::array();
  for (const Row& r : rows) {
    if (&r == base || !r.ok || !o.variant.empty() || !mega->space.find("profile")) continue;
    json pk = mega->space.complete(r.v.knobs);
    pk["profile"] = 1;
    Variant pv;
    sandbox::BuildResult pb;
    if (!render_variant(b.cfg, b.spec, *mega, pk, "", &pv, &err) || !(pb = cache.build(b.spec.build_request(pv.source))).ok)
      continue;
    json ctxs = json::array();
    for (auto [ctx, steps] : b.cfg.timed_contexts) ctxs.push_back({ctx, steps});
    measure::RunnerReply lr = b.runner.call({{"op", "load"}, {"artifact", pb.artifact}}, 60);
    measure::RunnerReply pr =
        lr.ok ? b.runner.call({{"op", "profile"}, {"contexts", ctxs}, {"warmup", 5}, {"samples", 20}}, 300) : lr;
    if (!pr.ok) {
      std::printf("profile of %s failed: %s\n", r.name.c_str(), pr.error.c_str());
      continue;
    }
    results["profiles"].push_back({{"variant", r.name}, {"knobs", r.v.knobs}, {"profiles", pr.body["profiles"]}});
    std::printf("\n%s %s", r.name.c_str(), r.v.knobs.dump().c_str());
    print_profile(pr.body["profiles"], b.cfg);
    print_arrivals(pr.body["profiles"], b.cfg);
  }
  if (!o.json_out.empty()) {
    std::string e;
    if (!write_file_atomic(o.json_out, results.dump(2), &e)) std::fprintf(stderr, "ktune bench: %s\n", e.c_str());
  }
  b.runner.stop();
  bool all_ok = m.ok && (!base || base->ok);
  return all_ok ? 0 : 2;
}

}  // namespace ktune::agent
