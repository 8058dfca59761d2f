// Whole sessions on the host backend, through the real `ktune` binary: a
// two-minute session that accepts and rolls back; broken variants of every
// kind classified while the session goes on; Ctrl-C while a batch builds;
// SIGKILL in the middle of a session, then resume; and export -> import ->
// replay of a session.
#include <doctest/doctest.h>

#include <csignal>
#include <cstdio>
#include <fcntl.h>
#include <filesystem>
#include <map>
#include <set>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include "base/clock.h"
#include "base/fs.h"
#include "sandbox/process.h"
#include "traces/store.h"

#include <sqlite3.h>

#include <algorithm>

using namespace ktune;

namespace {

const std::string kKtune = std::string(KTUNE_BINARY_DIR) + "/ktune";

struct Run {
  int exit_code = -1;
  std::string out;
};

// Runs ktune with the shared weight and build cache (so tests reuse them).
Run run_ktune(std::vector<std::string> args, double timeout_s, const std::string& workdir) {
  sandbox::ProcessSpec spec;
  spec.argv = {kKtune};
  spec.argv.insert(spec.argv.end(), args.begin(), args.end());
  spec.workdir = workdir;
  spec.env = sandbox::clean_env(workdir, {{"KTUNE_CACHE_DIR", cache_dir()}});
  spec.limits.timeout_s = timeout_s;
  spec.capture_bytes = 1 << 20;
  sandbox::ProcessResult r;
  std::string err;
  REQUIRE_MESSAGE(sandbox::run_process(spec, &r, &err), err);
  INFO(r.out << r.err);
  CHECK_FALSE(r.timed_out);
  return {r.exit_code, r.out + r.err};
}

struct AttemptRow {
  int seq;
  std::string variant, outcome, decision, purpose, error;
};

std::vector<AttemptRow> attempts(const std::string& db, int64_t session = 1) {
  traces::Store store;
  std::string err;
  REQUIRE_MESSAGE(store.open(db, &err), err);
  std::vector<traces::AttemptRow> rows;
  REQUIRE_MESSAGE(store.attempts(session, &rows, &err), err);
  std::vector<AttemptRow> out;
  for (auto& r : rows) out.push_back({r.seq, r.variant, r.outcome, r.decision, r.purpose, r.error});
  return out;
}

std::string session_status(const std::string& db, int64_t session = 1) {
  traces::Store store;
  traces::SessionRow row;
  std::string err;
  REQUIRE(store.open(db, &err));
  REQUIRE_MESSAGE(store.session(session, &row, &err), err);
  return row.status;
}

std::string read_data(const std::string& name) {
  std::string text, err;
  REQUIRE(read_file(std::string(KTUNE_SOURCE_DIR) + "/tests/data/" + name, &text, &err));
  return text;
}

struct TempDir {
  std::string path;
  TempDir() {
    std::string err;
    REQUIRE(make_temp_dir("/tmp", "ktune-session-test-", &path, &err));
  }
  ~TempDir() { remove_tree(path); }
};

}  // namespace

TEST_CASE("a two-minute host session accepts and rolls back, and round-trips through a trace") {
  TempDir dir;
  const std::string db = dir.path + "/runs.sqlite";
  Run r = run_ktune({"run", "--task", "kimi-linear", "--size", "small", "--backend", "host", "--budget", "2m", "--db", db,
                 "--seed", "3"},
                400, dir.path);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("session 1 completed") != std::string::npos);
  CHECK(r.out.find("best ") != std::string::npos);
  {  // the summary gives validate's parts beside it, in the order they happen
    const size_t validate = r.out.find(" validate "), runs = r.out.find(" (the variant's runs ", validate),
                 wait = r.out.find(", waiting for the reference ", runs), compare = r.out.find(", comparing ", wait);
    CHECK(validate != std::string::npos);
    CHECK(runs != std::string::npos);
    CHECK(wait != std::string::npos);
    CHECK(compare != std::string::npos);
  }
  {  // the phases account for the session's time: on the host every build
     // is waited for before its attempts, and that wait is the build phase
    traces::Store store;
    std::string err;
    REQUIRE(store.open(db, &err));
    traces::SessionRow s;
    REQUIRE_MESSAGE(store.session(1, &s, &err), err);
    const double wall = s.summary.value("wall_s", 0.0);
    double phases = 0;
    for (auto& [name, seconds] : s.summary["phase_s"].items())
      if (!traces::phase_part(name)) phases += seconds.get<double>();
    INFO("phases " << phases << " s of " << wall << " s: " << s.summary["phase_s"].dump());
    CHECK(wall >= 120);
    CHECK(phases <= wall);
    CHECK(phases >= 0.9 * wall);
  }
  std::vector<AttemptRow> rows = attempts(db);
  int accepted = 0, rolled_back = 0;
  for (auto& a : rows) {
    accepted += a.decision == "accepted" && a.purpose == "candidate";
    rolled_back += a.decision == "rolled_back";
  }
  std::printf("2-minute host session: %zu attempts, %d candidates accepted, %d rolled back\n", rows.size(), accepted,
              rolled_back);
  CHECK(rows.size() >= 10);
  CHECK(accepted >= 1);
  CHECK(rolled_back >= 1);
  CHECK(session_status(db) == "completed");

  // Every accepted candidate was compared with the best timed again in its
  // own attempt (a best_retimed event of that attempt, a fresh score).
  {
    traces::Store store;
    std::string err;
    REQUIRE(store.open(db, &err));
    std::vector<traces::Event> retimed;
    REQUIRE_MESSAGE(store.events(1, &retimed, &err, "best_retimed"), err);
    std::set<int> retimed_in;
    for (const traces::Event& e : retimed) {
      CHECK(e.data.value("ok", false));
      CHECK(e.data.value("score_us", 0.0) > 0);
      retimed_in.insert(e.attempt);
    }
    for (auto& a : rows)
      if (a.decision == "accepted" && a.purpose == "candidate") CHECK_MESSAGE(retimed_in.count(a.seq), "attempt " << a.seq);
  }

  // Each validation says where its time went: the variant's runs (and,
  // inside them, the runner's own account), waiting for the CPU reference,
  // comparing. Parts of it, together never more than it.
  {
    traces::Store store;
    std::string err;
    REQUIRE(store.open(db, &err));
    std::vector<traces::Event> validations;
    REQUIRE_MESSAGE(store.events(1, &validations, &err, "validation"), err);
    CHECK(validations.size() >= 10);
    for (const traces::Event& e : validations) {
      INFO("attempt " << e.attempt);
      for (const char* part : {"variant_run_s", "reference_wait_s", "compare_s"}) {
        INFO(part);
        REQUIRE(e.data.contains(part));
        CHECK(e.data[part].get<double>() >= 0);
      }
      const double run = e.data["variant_run_s"].get<double>(), wait = e.data["reference_wait_s"].get<double>(),
                   compare = e.data["compare_s"].get<double>(), all = e.data.value("seconds", -1.0);
      CHECK(run > 0);      // nine cases were run and written
      CHECK(compare > 0);  // and nine files read back and compared
      CHECK(run + wait + compare <= all);
      // The runner's account covers its five steps and fits in the call.
      const json& runner = e.data["runner_s"];
      double inside = 0;
      for (const char* step : {"state", "upload", "step", "download", "write"}) {
        INFO(step);
        REQUIRE(runner.contains(step));
        CHECK(runner[step].get<double>() >= 0);
        inside += runner[step].get<double>();
      }
      CHECK(runner["step"].get<double>() > 0);
      CHECK(inside <= run);
    }
  }

  // Each neighbour names the variant it was moved from as its parent: the
  // same template, one knob apart (the defaults while the baseline was the
  // best, not the baseline, so `show` and `replay` list the one knob moved).
  {
    traces::Store store;
    std::string err;
    REQUIRE(store.open(db, &err));
    int neighbours = 0, of_defaults = 0;
    for (auto& a : rows) {
      traces::VariantRow v, parent;
      REQUIRE_MESSAGE(store.variant(a.variant, &v, &err), err);
      if (v.rationale.rfind("neighbour of ", 0) != 0) continue;
      ++neighbours;
      INFO("attempt " << a.seq << ": " << v.rationale);
      REQUIRE_MESSAGE(store.variant(v.parent, &parent, &err), err);
      CHECK(parent.template_name == v.template_name);
      int moved = 0;
      for (auto& [k, value] : v.knobs.items()) moved += parent.knobs.value(k, json()) != value;
      CHECK(moved == 1);
      of_defaults += parent.rationale.rfind("the template's default knobs", 0) == 0;
    }
    CHECK(neighbours >= 1);
    CHECK(of_defaults >= 1);
  }

  // history, show, compare answer from the same database.
  CHECK(run_ktune({"history", "--db", db}, 30, dir.path).out.find("kimi-linear") != std::string::npos);
  CHECK(run_ktune({"show", "--db", db, rows.back().variant.substr(0, 10)}, 30, dir.path).exit_code == 0);

  // export -> import -> the same attempts and decisions; replay shows them.
  const std::string trace = dir.path + "/s.jsonl", db2 = dir.path + "/copy.sqlite";
  CHECK(run_ktune({"trace", "export", "--db", db, "1", "--out", trace}, 60, dir.path).exit_code == 0);
  Run imp = run_ktune({"trace", "import", "--db", db2, trace}, 60, dir.path);
  CHECK(imp.out.find("imported as session 1") != std::string::npos);
  std::vector<AttemptRow> copy = attempts(db2);
  REQUIRE(copy.size() == rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    CHECK(copy[i].seq == rows[i].seq);
    CHECK(copy[i].variant == rows[i].variant);
    CHECK(copy[i].outcome == rows[i].outcome);
    CHECK(copy[i].decision == rows[i].decision);
  }
  CHECK(run_ktune({"compare", "--db", db2, "1", "1"}, 30, dir.path).exit_code == 0);
  Run rep = run_ktune({"replay", trace, "--svg", dir.path + "/s.svg"}, 60, dir.path);
  CHECK(rep.exit_code == 0);
  CHECK(rep.out.find("rolled_back") != std::string::npos);
  CHECK(rep.out.find("of it, waiting for the reference") != std::string::npos);
  CHECK(file_exists(dir.path + "/s.svg"));
  // The re-exported copy carries the same events.
  const std::string trace2 = dir.path + "/s2.jsonl";
  CHECK(run_ktune({"trace", "export", "--db", db2, "1", "--out", trace2}, 60, dir.path).exit_code == 0);
  std::string a, b, err;
  REQUIRE(read_file(trace, &a, &err));
  REQUIRE(read_file(trace2, &b, &err));
  CHECK(std::count(a.begin(), a.end(), '\n') == std::count(b.begin(), b.end(), '\n'));
}

TEST_CASE("a later session on the same database and device starts from the defaults and the fastest point measured before") {
  TempDir dir;
  const std::string db = dir.path + "/runs.sqlite";
  // Each session makes a set number of attempts (the budget is far off), so
  // a loaded machine changes how long it takes, not what it records.
  auto session = [&](const char* seed, const char* max_attempts) {
    Run r = run_ktune({"run", "--size", "tiny", "--backend", "host", "--budget", "10m", "--max-attempts", max_attempts,
                       "--db", db, "--seed", seed},
                      600, dir.path);
    REQUIRE(r.exit_code == 0);
    return r.out;
  };
  // The variant event that proposed each attempt of a session: its rationale.
  auto rationales = [&](int64_t id) {
    traces::Store store;
    std::string err;
    REQUIRE(store.open(db, &err));
    std::vector<traces::Event> events;
    REQUIRE_MESSAGE(store.events(id, &events, &err), err);
    std::map<int, std::string> by_attempt;
    std::string last;
    for (const traces::Event& e : events) {
      if (e.kind == "variant") last = e.data.value("rationale", "");
      if (e.kind == "attempt_started") by_attempt[e.attempt] = last;
    }
    return by_attempt;
  };
  const std::string first_out = session("1", "8");
  CHECK(first_out.find("learns from") == std::string::npos);  // nothing earlier
  CHECK(first_out.find("completed (the attempt limit was reached)") != std::string::npos);
  const std::vector<AttemptRow> first = attempts(db, 1);
  REQUIRE(first.size() == 8);  // the baseline and 7 candidates
  // The defaults are proposed first; the fastest ok attempt is what a
  // later session starts from (by its speedup over its own baseline).
  traces::Store store;
  std::string err;
  REQUIRE(store.open(db, &err));
  std::vector<traces::AttemptRow> rows;
  REQUIRE(store.attempts(1, &rows, &err));
  const traces::AttemptRow* fastest = nullptr;
  for (const traces::AttemptRow& a : rows)
    if (a.purpose == "candidate" && a.outcome == "ok" && (!fastest || a.speedup > fastest->speedup)) fastest = &a;
  REQUIRE(fastest);
  const std::string defaults = first[1].variant, best_before = fastest->variant;
  CHECK(rationales(1)[2].rfind("the template's default knobs", 0) == 0);

  const std::string second_out = session("2", "5");
  CHECK(second_out.find("the search learns from ") != std::string::npos);
  const std::vector<AttemptRow> second = attempts(db, 2);
  REQUIRE(second.size() == 5);
  CHECK(second[0].purpose == "baseline");
  CHECK(second[1].variant == defaults);  // measured again, though session 1 measured it
  if (best_before != defaults) {
    CHECK(second[2].variant == best_before);
    CHECK(rationales(2)[3].rfind("the fastest point of earlier sessions on this code (", 0) == 0);
  }
  // Every other proposal is a point neither session had measured before.
  std::set<std::string> before;
  for (const AttemptRow& a : first) before.insert(a.variant);
  for (size_t i = 3; i < second.size(); ++i) CHECK_MESSAGE(!before.count(second[i].variant), "attempt " << second[i].seq);

  // A point whose stored knobs no longer render to its code (an older
  // template, here: knobs edited in the database) is not learned from, and
  // not started from.
  if (best_before != defaults) {
    sqlite3* h = store.handle();
    const std::string edit = "UPDATE variants SET knobs = '{\"tile\": 16}' WHERE id = '" + best_before + "'";
    REQUIRE(sqlite3_exec(h, edit.c_str(), nullptr, nullptr, nullptr) == SQLITE_OK);
    store.close();
    session("3", "3");
    const std::vector<AttemptRow> third = attempts(db, 3);
    for (const AttemptRow& a : third) CHECK(a.variant != best_before);
    for (const auto& [seq, why] : rationales(3))
      if (why.rfind("the fastest point of earlier sessions", 0) == 0) CHECK(third[size_t(seq - 1)].variant != best_before);
  }

  // Sessions recorded on another device are not learned from: a session
  // here starts as the first one did.
  traces::Store again;
  REQUIRE(again.open(db, &err));
  const char* elsewhere =
      "UPDATE events SET data = json_set(data, '$.detail.device', 'Another GPU') "
      "WHERE kind = 'probe' AND json_extract(data, '$.name') = 'device'";
  REQUIRE(sqlite3_exec(again.handle(), elsewhere, nullptr, nullptr, nullptr) == SQLITE_OK);
  CHECK(sqlite3_changes(again.handle()) >= 2);
  again.close();
  const std::string fourth_out = session("4", "3");
  CHECK(fourth_out.find("learns from") == std::string::npos);
  const int64_t fourth_id = best_before != defaults ? 4 : 3;
  const std::map<int, std::string> fourth_why = rationales(fourth_id);
  REQUIRE(fourth_why.count(2));
  CHECK(fourth_why.at(2).rfind("the template's default knobs", 0) == 0);
  for (const auto& [seq, why] : fourth_why) CHECK(why.rfind("the fastest point of earlier sessions", 0) != 0);
}

TEST_CASE("broken variants of every kind are classified and the session goes on") {
  TempDir dir;
  const std::string db = dir.path + "/runs.sqlite";
  json proposals = json::array();
  for (const char* f : {"host_compile_error.cc", "host_crash.cc", "host_hang.cc", "host_wrong.cc"})
    proposals.push_back({{"template", "kimi-mega-host"}, {"source", read_data(f)}, {"rationale", f}});
  proposals.push_back({{"template", "kimi-mega-host"}, {"knobs", json::object()}, {"rationale", "a good one"}});
  std::string err;
  REQUIRE(write_file_atomic(dir.path + "/proposals.json", proposals.dump(), &err));
  Run r = run_ktune({"run", "--size", "small", "--backend", "host", "--budget", "5m", "--db", db, "--designer", "replay",
                 "--proposals", dir.path + "/proposals.json", "--step-timeout", "3", "--samples", "5"},
                400, dir.path);
  CHECK(r.exit_code == 0);
  std::vector<AttemptRow> rows = attempts(db);
  REQUIRE(rows.size() == 6);  // the baseline and the five proposals
  CHECK(rows[1].outcome == "compile_error");
  CHECK(rows[1].error.find("no_such_field") != std::string::npos);
  CHECK(rows[2].outcome == "device_fault");
  CHECK(rows[2].error.find("SIGSEGV") != std::string::npos);
  CHECK(rows[3].outcome == "timeout");
  CHECK(rows[4].outcome == "wrong_answer");
  CHECK(rows[4].error.find("cosine") != std::string::npos);
  CHECK(rows[5].outcome == "ok");
  CHECK(session_status(db) == "completed");
}

TEST_CASE("a negative --max-attempts is refused before any session starts") {
  TempDir dir;
  const std::string db = dir.path + "/runs.sqlite";
  Run r = run_ktune({"run", "--size", "tiny", "--backend", "host", "--max-attempts", "-1", "--db", db}, 30, dir.path);
  CHECK(r.exit_code != 0);
  CHECK(r.out.find("--max-attempts: Value -1 not in range 0 to 1000000") != std::string::npos);
  CHECK_FALSE(file_exists(db));
}

TEST_CASE("Ctrl-C while a batch builds: the builds not begun are skipped, and the session ends interrupted") {
  // A fresh build cache (every build compiles) and a batch of 32 proposals
  // on the host, whose builds all finish before any of them is timed. Once
  // a few have compiled, SIGINT: the builds then in flight finish, the rest
  // get their slot after the session stopped and must not compile (each
  // would only hold the session past its stop). Counted from the cache,
  // not timed: a slow machine compiles fewer before the signal, not more after.
  TempDir dir;
  const std::string db = dir.path + "/runs.sqlite", cache = dir.path + "/cache";
  auto compiled = [&] {  // builds with a result (the cache writes it last)
    int n = 0;
    std::error_code ec;
    for (const auto& key : std::filesystem::directory_iterator(join_path(cache, "builds"), ec))
      n += file_exists(join_path(key.path().string(), "result.json"));
    return n;
  };
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int fd = open((dir.path + "/out.txt").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    setenv("KTUNE_CACHE_DIR", cache.c_str(), 1);
    execl(kKtune.c_str(), kKtune.c_str(), "run", "--size", "tiny", "--backend", "host", "--budget", "10m", "--batch",
          "32", "--db", db.c_str(), "--seed", "9", (char*)nullptr);
    _exit(127);
  }
  // The baseline's build and two candidates'.
  const double deadline = mono_seconds() + 300;
  int before = 0;
  while (mono_seconds() < deadline && (before = compiled()) < 3)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  kill(pid, SIGINT);
  int status = 0;
  waitpid(pid, &status, 0);
  REQUIRE(before >= 3);
  std::string out, err;
  REQUIRE(read_file(dir.path + "/out.txt", &out, &err));
  INFO(out);
  CHECK(WIFEXITED(status));
  CHECK(session_status(db) == "interrupted");
  // At most the builds in flight at the signal (4 workers at most) finished after it.
  const int after = compiled();
  MESSAGE(before << " builds compiled before Ctrl-C, " << after << " in all (of the batch's 32 and the baseline's)");
  CHECK(after <= before + 2 * 4);
  // No attempt began after the signal, and each attempt recorded had its build.
  for (const AttemptRow& a : attempts(db)) CHECK(a.error.find("not built") == std::string::npos);
}

TEST_CASE("a session killed with SIGKILL leaves a valid database and resumes") {
  TempDir dir;
  const std::string db = dir.path + "/runs.sqlite";
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    setsid();
    int fd = open((dir.path + "/out.txt").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    setenv("KTUNE_CACHE_DIR", cache_dir().c_str(), 1);
    execl(kKtune.c_str(), kKtune.c_str(), "run", "--size", "small", "--backend", "host", "--budget", "2m", "--db",
          db.c_str(), "--seed", "5", "--samples", "5", (char*)nullptr);
    _exit(127);
  }
  // Kill it once a few attempts are recorded, whatever it is doing then.
  double deadline = mono_seconds() + 240;
  size_t finished = 0;
  while (mono_seconds() < deadline && finished < 4) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    if (!file_exists(db)) continue;
    traces::Store store;
    std::vector<traces::AttemptRow> rows;
    std::string err;
    if (store.open(db, &err) && store.attempts(1, &rows, &err)) {
      finished = 0;
      for (auto& a : rows) finished += !a.outcome.empty();
    }
  }
  kill(-pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  REQUIRE(finished >= 4);

  // A valid database with every attempt recorded before the kill.
  {
    traces::Store store;
    std::string err;
    REQUIRE_MESSAGE(store.open(db, &err), err);
    sqlite3_stmt* st = nullptr;
    REQUIRE(sqlite3_prepare_v2(store.handle(), "PRAGMA integrity_check", -1, &st, nullptr) == SQLITE_OK);
    REQUIRE(sqlite3_step(st) == SQLITE_ROW);
    CHECK(std::string(reinterpret_cast<const char*>(sqlite3_column_text(st, 0))) == "ok");
    sqlite3_finalize(st);
  }
  std::vector<AttemptRow> before = attempts(db);
  CHECK(session_status(db) == "running");

  Run r = run_ktune({"run", "--resume", "1", "--db", db, "--budget", "30s"}, 300, dir.path);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("(resumed)") != std::string::npos);
  std::vector<AttemptRow> after = attempts(db);
  CHECK(after.size() > before.size());
  for (size_t i = 0; i < before.size(); ++i) {
    CHECK(after[i].seq == before[i].seq);
    CHECK(after[i].variant == before[i].variant);
    if (before[i].outcome.empty()) {
      CHECK(after[i].outcome == "interrupted");  // it was in flight when killed
    } else {
      CHECK(after[i].outcome == before[i].outcome);
      CHECK(after[i].decision == before[i].decision);
    }
  }
  // The resumed run measures no variant twice.
  std::set<std::string> seen;
  for (auto& a : after)
    if (a.outcome != "interrupted" && !a.outcome.empty()) CHECK(seen.insert(a.variant).second);
  CHECK(session_status(db) == "completed");
}
