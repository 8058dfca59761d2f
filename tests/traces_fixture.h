// Shared by the traces tests: a temporary directory, and a small synthetic
// session recorded through Store::record the way the orchestrator records
// one (measure, a baseline, candidates that are accepted, rolled back, fail
// to build and give wrong answers, an LLM call, the end).
#pragma once
#include <doctest/doctest.h>
#include <sqlite3.h>

#include <filesystem>
#include <string>

#include "base/fs.h"
#include "base/sha256.h"
#include "traces/store.h"

namespace ktune::traces::testing {

// A fresh directory under the system temp dir, removed afterwards.
struct TempDir {
  std::string path;
  TempDir() {
    std::string err;
    REQUIRE_MESSAGE(make_temp_dir(std::filesystem::temp_directory_path().string(), "ktune-traces-", &path, &err), err);
  }
  ~TempDir() { remove_tree(path); }
  std::string file(const std::string& name) const { return join_path(path, name); }
};

// The first column of the first row of a query, as text ("" when no row).
inline std::string query_text(Store& store, const std::string& sql) {
  sqlite3_stmt* stmt = nullptr;
  REQUIRE_MESSAGE(sqlite3_prepare_v2(store.handle(), sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK,
                  sqlite3_errmsg(store.handle()));
  std::string value;
  if (sqlite3_step(stmt) == SQLITE_ROW && sqlite3_column_text(stmt, 0))
    value = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
  sqlite3_finalize(stmt);
  return value;
}
inline int64_t query_int(Store& store, const std::string& sql) { return std::stoll("0" + query_text(store, sql)); }

// The numbers the synthetic session was built from, to check results against.
struct Synthetic {
  int64_t session = 0;
  double start_wall = 1.7e9;
  std::string base, fast, broken, slow, wrong;  // variant ids, one per attempt 1..5
  double baseline_us = 100, best_us = 80, slow_us = 90;
  double best_changed_t = 0;  // when attempt 2 became the best
  int events = 0;             // how many were recorded, session_started included
};

inline json timing_data(int attempt, double score_us, int launches) {
  json contexts = json::array();
  for (int context : {128, 1024}) {
    double median = score_us * (context == 128 ? 0.9 : 1.1);
    contexts.push_back({{"context", context},
                        {"steps", 16},
                        {"warmup", 3},
                        {"samples_us", {median - 1, median, median + 0.5, median + 2}},
                        {"median_us", median},
                        {"p10_us", median - 1},
                        {"p90_us", median + 2},
                        {"mad_us", 0.5}});
  }
  return {{"attempt", attempt},
          {"seconds", 1.5},
          {"launches_per_step", launches},
          {"score_us", score_us},
          {"contexts", contexts}};
}

inline Synthetic record_synthetic_session(Store& store, const std::string& designer = "search") {
  Synthetic s;
  json started = {{"task", "kimi"},
                  {"size", "tiny"},
                  {"backend", "host"},
                  {"designer", designer},
                  {"budget_s", 600},
                  {"seed", 7},
                  {"weights_seed", 11},
                  {"config", {{"layers", 2}}},
                  {"env", {{"host", "testbox"}, {"compiler", "g++ 12"}}},
                  {"argv", json::array({"ktune", "run"})},
                  {"options", json::object()}};
  std::string err;
  REQUIRE_MESSAGE(store.create_session(started, &s.session, &err, s.start_wall), err);
  s.events = 1;
  // Attempt numbers travel in data.attempt, as the orchestrator sends them.
  auto rec = [&](double t, const std::string& kind, const json& data) {
    std::string e;
    REQUIRE_MESSAGE(store.record(s.session, kind, 0, data, &e, t, s.start_wall + t), e);
    ++s.events;
  };
  auto variant = [&](double t, const std::string& name, const std::string& parent, const json& knobs,
                     const std::string& origin, const std::string& rationale) {
    std::string id = sha256_hex("variant " + name);
    rec(t, "variant",
        {{"id", id},
         {"template", "megakernel"},
         {"backend", "host"},
         {"knobs", knobs},
         {"source", "// " + name + "\nint main() {}\n"},
         {"parent", parent},
         {"origin", origin},
         {"rationale", rationale}});
    return id;
  };
  json phases = {{"build", 2.0}, {"load", 0.5}, {"validate", 1.0},
                 {"variant_run", 0.2}, {"reference_wait", 0.75}, {"compare", 0.05}, {"time", 3.0}};
  json passing_cases =
      json::array({{{"seed", 1},
                    {"context", 128},
                    {"passed", true},
                    {"metrics", {{"output", {{"cosine", 0.99999}, {"rel_l2", 1e-4}, {"nonfinite", 0}, {"n", 64}}}}},
                    {"experts_match", true}},
                   {{"seed", 2},
                    {"context", 1024},
                    {"passed", true},
                    {"metrics", {{"output", {{"cosine", 0.99998}, {"rel_l2", 2e-4}, {"nonfinite", 0}, {"n", 64}}}}},
                    {"experts_match", true}}});

  rec(0.5, "phase", {{"name", "measure"}, {"state", "begin"}});
  rec(1, "probe", {{"name", "bandwidth"}, {"value", 1234.5}, {"unit", "GB/s"}, {"detail", {{"bytes", 1 << 30}}}});
  rec(1.5, "probe", {{"name", "grid_barrier"}, {"value", 2.5}, {"unit", "us"}});

  // 1: the baseline, 100 us.
  s.base = variant(2, "base", "", {{"tile", 32}, {"stages", 2}}, "baseline", "the reference schedule");
  rec(2, "attempt_started", {{"attempt", 1}, {"variant", s.base}, {"purpose", "baseline"}});
  rec(4, "build",
      {{"attempt", 1},
       {"ok", true},
       {"cached", false},
       {"seconds", 2.0},
       {"command", "g++ -O2"},
       {"log", ""},
       {"resources", {{"registers", 64}}},
       {"timed_out", false}});
  rec(5, "validation", {{"attempt", 1}, {"ok", true}, {"seconds", 1.0}, {"gate", 0.9999}, {"cases", passing_cases}});
  rec(8, "timing", timing_data(1, s.baseline_us, 12));
  rec(8.5, "attempt_finished",
      {{"attempt", 1},
       {"outcome", "ok"},
       {"decision", "accepted"},
       {"reason", "baseline"},
       {"score_us", s.baseline_us},
       {"speedup", 1.0},
       {"phase_s", phases}});
  rec(9, "phase", {{"name", "measure"}, {"state", "end"}, {"seconds", 8.5}});

  // 2: bigger tiles, 80 us: accepted, the new best.
  s.fast = variant(10, "fast", s.base, {{"tile", 64}, {"stages", 2}}, "search", "bigger tiles");
  rec(10, "attempt_started", {{"attempt", 2}, {"variant", s.fast}, {"purpose", "candidate"}});
  rec(12, "build",
      {{"attempt", 2},
       {"ok", true},
       {"cached", true},
       {"seconds", 0.1},
       {"command", "g++ -O2"},
       {"log", ""},
       {"timed_out", false}});
  rec(13, "validation", {{"attempt", 2}, {"ok", true}, {"seconds", 1.0}, {"gate", 0.9999}, {"cases", passing_cases}});
  rec(16, "timing", timing_data(2, s.best_us, 1));
  rec(16.5, "profile", {{"attempt", 2}, {"launches_per_step", 1}, {"resources", {{"registers", 96}, {"spills", 0}}}});
  rec(17, "attempt_finished",
      {{"attempt", 2},
       {"outcome", "ok"},
       {"decision", "accepted"},
       {"reason", "faster than best beyond noise (80.0 us vs 100.0 us)"},
       {"score_us", s.best_us},
       {"speedup", 1.25},
       {"best_before", s.base},
       {"best_after", s.fast},
       {"phase_s", phases}});
  s.best_changed_t = 17.2;
  rec(s.best_changed_t, "best_changed",
      {{"variant", s.fast}, {"attempt", 2}, {"score_us", s.best_us}, {"speedup", 1.25}});

  // 3: does not compile.
  s.broken =
      variant(20, "broken", s.fast, {{"tile", 64}, {"stages", 2}, {"unroll", 8}}, "llm", "unroll the inner loop");
  rec(20, "attempt_started", {{"attempt", 3}, {"variant", s.broken}, {"purpose", "candidate"}});
  rec(22, "build",
      {{"attempt", 3},
       {"ok", false},
       {"cached", false},
       {"seconds", 2.0},
       {"command", "g++ -O2"},
       {"log", "broken.cc:1: error: expected ';'"},
       {"timed_out", false}});
  rec(22.5, "attempt_finished",
      {{"attempt", 3},
       {"outcome", "compile_error"},
       {"reason", "build failed"},
       {"error", "broken.cc:1: error: expected ';'"},
       {"phase_s", {{"build", 2.0}}}});

  // 4: slower than the best: rolled back.
  s.slow = variant(30, "slow", s.fast, {{"tile", 64}, {"stages", 4}}, "search", "deeper pipeline");
  rec(30, "attempt_started", {{"attempt", 4}, {"variant", s.slow}, {"purpose", "candidate"}});
  rec(32, "build",
      {{"attempt", 4},
       {"ok", true},
       {"cached", false},
       {"seconds", 2.0},
       {"command", "g++ -O2"},
       {"log", ""},
       {"timed_out", false}});
  rec(33, "validation", {{"attempt", 4}, {"ok", true}, {"seconds", 1.0}, {"gate", 0.9999}, {"cases", passing_cases}});
  rec(36, "timing", timing_data(4, s.slow_us, 1));
  rec(36.5, "attempt_finished",
      {{"attempt", 4},
       {"outcome", "ok"},
       {"decision", "rolled_back"},
       {"reason", "slower than best (90.0 us vs 80.0 us)"},
       {"score_us", s.slow_us},
       {"speedup", 100.0 / 90.0},
       {"best_before", s.fast},
       {"best_after", s.fast},
       {"phase_s", phases}});

  // 5: wrong answers.
  s.wrong = variant(40, "wrong", s.fast, {{"tile", 128}, {"stages", 2}}, "llm", "even bigger tiles");
  rec(40, "attempt_started", {{"attempt", 5}, {"variant", s.wrong}, {"purpose", "candidate"}});
  rec(42, "build",
      {{"attempt", 5},
       {"ok", true},
       {"cached", false},
       {"seconds", 2.0},
       {"command", "g++ -O2"},
       {"log", ""},
       {"timed_out", false}});
  rec(43, "validation",
      {{"attempt", 5},
       {"ok", false},
       {"seconds", 1.0},
       {"gate", 0.9999},
       {"cases", json::array({json{{"seed", 1},
                                   {"context", 128},
                                   {"passed", false},
                                   {"metrics", {{"output", {{"cosine", 0.2}, {"rel_l2", 0.9}}}}},
                                   {"experts_match", false}}})}});
  rec(43.5, "attempt_finished",
      {{"attempt", 5},
       {"outcome", "wrong_answer"},
       {"reason", "cosine 0.2 below 0.9999"},
       {"phase_s", {{"build", 2.0}, {"validate", 1.0}}}});

  rec(50, "llm_call",
      {{"provider", "openai"},
       {"model", "some-model"},
       {"url", "https://example.invalid/v1"},
       {"prompt", "make it faster"},
       {"reply", "unroll"},
       {"status", "ok"},
       {"http_status", 200},
       {"tokens_in", 1000},
       {"tokens_out", 200},
       {"latency_s", 1.5},
       {"retries", 0}});
  rec(120, "session_ended",
      {{"status", "completed"},
       {"reason", "budget spent"},
       {"summary", {{"best_variant", s.fast}, {"best_speedup", 1.25}}}});
  return s;
}

}  // namespace ktune::traces::testing
