// Reports over the synthetic session: the text carries the numbers that were
// recorded (best speedup, counts by outcome, probes, lineage), the JSON form
// parses and carries the same values, and the replay plot is an SVG.
#include <doctest/doctest.h>

#include "base/text.h"
#include "tests/traces_fixture.h"
#include "traces/report.h"

using namespace ktune;
using namespace ktune::traces;
using namespace ktune::traces::testing;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A store holding the synthetic session, opened in a temporary directory.
struct Recorded {
  TempDir dir;
  Store store;
  Synthetic s;
  Recorded() {
    std::string err;
    REQUIRE_MESSAGE(store.open(dir.file("k.sqlite"), &err), err);
    s = record_synthetic_session(store);
  }
  TraceFile trace() {
    std::string jsonl, err;
    TraceFile t;
    REQUIRE_MESSAGE(export_trace(store, s.session, &jsonl, &err), err);
    REQUIRE_MESSAGE(parse_trace(jsonl, &t, &err), err);
    return t;
  }
};

json parsed(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  REQUIRE_MESSAGE(!j.is_discarded(), text);
  return j;
}

}  // namespace

TEST_CASE("lengths of time and printf text are written one way (base/text.h)") {
  CHECK(duration_text(4.24) == "4.2s");
  CHECK(duration_text(59.94) == "59.9s");
  CHECK(duration_text(83) == "1m23s");
  CHECK(duration_text(3599) == "59m59s");
  CHECK(duration_text(7500) == "2h05m");
  CHECK(formatted("%.2fx", 3.14159) == "3.14x");
  CHECK(formatted("%.1f us", 171.64) == "171.6 us");
  // Longer than any fixed buffer the helpers it replaced had: nothing is cut.
  const std::string name(200, 'k');
  CHECK(formatted("%s=%d", name.c_str(), 7) == name + "=7");
}

TEST_CASE("history lists sessions, and one session's attempts") {
  Recorded r;
  std::string out, err;
  REQUIRE_MESSAGE(history_report(r.store, std::nullopt, false, &out, &err), err);
  CHECK(contains(out, "designer"));
  CHECK(contains(out, "kimi"));
  CHECK(contains(out, "completed"));
  CHECK(contains(out, "80.0"));
  CHECK(contains(out, "1.25x"));
  CHECK(contains(out, "2m00s"));  // wall time
  REQUIRE(history_report(r.store, std::nullopt, true, &out, &err));
  json sessions = parsed(out)["sessions"];
  REQUIRE(sessions.size() == 1);
  CHECK(sessions[0]["best_speedup"] == 1.25);
  CHECK(sessions[0]["attempts"] == 5);
  CHECK(sessions[0]["wall_s"] == 120.0);
  CHECK(sessions[0]["device"] == "");  // the synthetic session has no device probe

  REQUIRE_MESSAGE(history_report(r.store, r.s.session, false, &out, &err), err);
  for (const char* part : {"compile_error", "wrong_answer", "rolled_back", "accepted", "slower than best", "baseline",
                           "90.0", "1.25x", "budget spent"})
    CHECK_MESSAGE(contains(out, part), part);
  CHECK(contains(out, r.s.slow.substr(0, 12)));
  CHECK_FALSE(contains(out, r.s.slow.substr(0, 13)));  // ids shortened to 12
  REQUIRE(history_report(r.store, r.s.session, true, &out, &err));
  json j = parsed(out);
  REQUIRE(j["attempts"].size() == 5);
  CHECK(j["attempts"][3]["decision"] == "rolled_back");
  CHECK(j["attempts"][2]["outcome"] == "compile_error");
  CHECK(j["session"]["best_variant"] == r.s.fast);

  CHECK_FALSE(history_report(r.store, 99, false, &out, &err));
  CHECK(contains(err, "no session 99"));
}

TEST_CASE("compare sets two sessions side by side") {
  Recorded r;
  std::string out, err;
  // A second session: an LLM designer that only got the baseline in.
  int64_t other = 0;
  REQUIRE(r.store.create_session({{"task", "kimi"}, {"size", "tiny"}, {"backend", "host"}, {"designer", "llm"}}, &other,
                                 &err, r.s.start_wall + 1000));
  auto rec = [&](double t, const std::string& kind, int attempt, const json& data) {
    REQUIRE_MESSAGE(r.store.record(other, kind, attempt, data, &err, t, r.s.start_wall + 1000 + t), err);
  };
  rec(1, "variant", 0, {{"id", r.s.base}, {"template", "megakernel"}});
  rec(1.5, "probe", 0, {{"name", "device"}, {"value", 0}, {"unit", ""}, {"detail", {{"device", "NVIDIA H100 80GB HBM3"}}}});
  rec(2, "attempt_started", 1, {{"variant", r.s.base}, {"purpose", "baseline"}});
  rec(60, "attempt_finished", 1, {{"outcome", "ok"}, {"decision", "accepted"}, {"score_us", 110.0}, {"speedup", 1.0}});
  rec(3600, "session_ended", 0, {{"status", "interrupted"}, {"reason", "ctrl-c"}});

  REQUIRE_MESSAGE(compare_report(r.store, r.s.session, other, false, &out, &err), err);
  for (const char* part : {"session 1", "session 2", "kimi/tiny/host", "search", "llm", "compile_error", "rolled back",
                           "1.25x", "1.00x", "110.0", "time to best", "17.2s", "2m00s", "1h00m", "150.0", "device",
                           "NVIDIA H100 80GB HBM3"})
    CHECK_MESSAGE(contains(out, part), part);

  REQUIRE(compare_report(r.store, r.s.session, other, true, &out, &err));
  json j = parsed(out);
  CHECK(j["a"]["attempts"] == 5);
  CHECK(j["a"]["by_outcome"]["ok"] == 3);
  CHECK(j["a"]["by_outcome"]["compile_error"] == 1);
  CHECK(j["a"]["accepted"] == 2);
  CHECK(j["a"]["rolled_back"] == 1);
  CHECK(j["a"]["best_speedup"] == 1.25);
  CHECK(j["a"]["time_to_best_s"] == r.s.best_changed_t);
  CHECK(j["a"]["attempts_per_hour"] == 150.0);
  CHECK(j["b"]["designer"] == "llm");
  CHECK(j["b"]["device"] == "NVIDIA H100 80GB HBM3");
  CHECK(j["a"]["device"] == "");
  REQUIRE_MESSAGE(history_report(r.store, std::nullopt, false, &out, &err), err);
  CHECK(contains(out, "NVIDIA H100 80GB HBM3"));  // the sessions' list names each one's device
  REQUIRE_MESSAGE(history_report(r.store, other, false, &out, &err), err);
  CHECK(contains(out, "kimi/tiny/host on NVIDIA H100 80GB HBM3"));
  CHECK(j["b"]["best_speedup"] == 1.0);  // the baseline is its best
  CHECK(j["b"]["best_us"] == 110.0);
  CHECK(j["b"]["time_to_best_s"].is_null());
}

TEST_CASE("show gives a variant's lineage, attempts and source") {
  Recorded r;
  std::string out, err;
  REQUIRE_MESSAGE(show_report(r.store, r.s.slow.substr(0, 8), false, &out, &err), err);
  for (const char* part : {"deeper pipeline", "megakernel", "knobs      stages=4 tile=64", "rolled_back", "128: 81.0",
                           "1024: 99.0", "// slow"})
    CHECK_MESSAGE(contains(out, part), part);
  CHECK(contains(out, r.s.slow));
  CHECK(contains(out, r.s.fast.substr(0, 12)));
  CHECK(contains(out, r.s.base.substr(0, 12)));

  REQUIRE(show_report(r.store, r.s.slow, true, &out, &err));
  json j = parsed(out);
  CHECK(j["variant"]["id"] == r.s.slow);
  REQUIRE(j["lineage"].size() == 3);
  CHECK(j["lineage"][0]["changes"] == json({{"stages", 4}}));
  CHECK(j["lineage"][1]["changes"] == json({{"tile", 64}}));
  CHECK(j["lineage"][2]["changes"] == json({{"tile", 32}, {"stages", 2}}));  // the root: all its knobs
  REQUIRE(j["attempts"].size() == 1);
  CHECK(j["attempts"][0]["score_us"] == 90.0);
  CHECK(j["attempts"][0]["launches_per_step"] == 1);
  CHECK(j["attempts"][0]["medians"][1]["median_us"].get<double>() == doctest::Approx(99.0));

  // A knob its parent had and it has not shows as -name.
  REQUIRE(r.store.record(r.s.session, "variant", 0,
                         {{"id", "trimmed"},
                          {"template", "megakernel"},
                          {"parent", r.s.broken},
                          {"knobs", {{"tile", 64}, {"stages", 2}}},
                          {"origin", "search"}},
                         &err));
  REQUIRE_MESSAGE(show_report(r.store, "trimmed", false, &out, &err), err);
  CHECK(contains(out, "-unroll"));
  CHECK(contains(out, "attempts\n  none"));
  CHECK_FALSE(show_report(r.store, "no-such-variant", false, &out, &err));
  CHECK(contains(err, "no variant"));
}

TEST_CASE("replay tells the session's story and plots the best speedup") {
  Recorded r;
  TraceFile trace = r.trace();
  std::string out, err;
  REQUIRE_MESSAGE(replay_report(trace, false, &out, &err), err);
  for (const char* part : {"kimi tiny on host",
                           "designer search",
                           "budget 10m00s",
                           "completed (budget spent)",
                           "measure (8.5s)",
                           "bandwidth",
                           "1234.5",
                           "GB/s",
                           "grid_barrier",
                           "baseline",
                           "(attempt 1)",
                           "00:17",
                           "tile=64",
                           "unroll=8",
                           "compile_error",
                           "rolled_back",
                           "wrong_answer",
                           "cosine 0.2",
                           "time per phase",
                           "build",
                           "validate",
                           "of it, the variant's runs",
                           "of it, waiting for the reference",
                           "of it, comparing",
                           "1.25x",
                           "█",
                           "02:00",
                           "ok 3, compile_error 1, wrong_answer 1"})
    CHECK_MESSAGE(contains(out, part), part);

  // validate's parts come right under it, in the order they happen, and
  // before the next phase.
  {
    const size_t table = out.find("time per phase");
    REQUIRE(table != std::string::npos);
    size_t at = table;
    for (const char* line : {"\n  validate ", "\n    of it, the variant's runs ", "\n    of it, waiting for the reference ",
                             "\n    of it, comparing ", "\n  time "}) {
      INFO(line);
      const size_t next = out.find(line, table);
      REQUIRE(next != std::string::npos);
      CHECK(next > at);
      at = next;
    }
  }

  REQUIRE(replay_report(trace, true, &out, &err));
  json j = parsed(out);
  REQUIRE(j["attempts"].size() == 5);
  CHECK(j["attempts"][0]["best_speedup"] == 1.0);
  CHECK(j["attempts"][1]["best_speedup"] == 1.25);  // its best_changed came after its attempt_finished
  CHECK(j["attempts"][3]["best_speedup"] == 1.25);
  CHECK(j["attempts"][1]["changes"] == json({{"tile", 64}}));
  CHECK(j["attempts"][1]["origin"] == "search");
  CHECK(j["best"]["speedup"] == 1.25);
  CHECK(j["best"]["variant"] == r.s.fast);
  CHECK(j["outcomes"]["ok"] == 3);
  CHECK(j["outcomes"]["wrong_answer"] == 1);
  CHECK(j["phase_s"]["build"] == 10.0);  // 2 + 2 + 2 + 2 + 2 over the attempts
  CHECK(j["phase_s"]["reference_wait"] == 2.25);  // three attempts validated
  CHECK(j["phase_s"]["variant_run"] == doctest::Approx(0.6));
  CHECK(j["phase_s"]["compare"] == doctest::Approx(0.15));
  CHECK(j["phase_s"]["measure"] == 8.5);
  CHECK(j["probes"][0]["value"] == 1234.5);
  CHECK(j["baseline"]["score_us"] == 100.0);
  CHECK(j["session"]["duration_s"] == 120.0);
  CHECK(j["best_series"].size() == 2);

  std::string svg;
  REQUIRE_MESSAGE(replay_svg(trace, &svg, &err), err);
  CHECK(svg.rfind("<svg", 0) == 0);
  CHECK(contains(svg, "<path d=\"M "));
  CHECK(contains(svg, "minutes since start"));
  CHECK(contains(svg, "speedup over baseline"));
  size_t dots = 0;
  for (size_t at = svg.find("<circle"); at != std::string::npos; at = svg.find("<circle", at + 1)) ++dots;
  CHECK(dots == 2);  // the accepted attempts
  CHECK(svg.size() > 500);
  CHECK(contains(svg.substr(svg.size() - 7), "</svg>"));
}
