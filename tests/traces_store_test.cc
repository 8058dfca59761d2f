// The store on real SQLite files: schema and versions, refusing files that
// are not ours, a recorded session landing in the derived tables, events the
// tables cannot take being refused whole, and a writer SIGKILLed mid-session
// leaving a valid, consistent database.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <set>
#include <thread>

#include "base/clock.h"
#include "tests/traces_fixture.h"

using namespace ktune;
using namespace ktune::traces;
using namespace ktune::traces::testing;

TEST_CASE("open creates schema v1 in WAL mode, and reopens") {
  TempDir dir;
  std::string path = dir.file("k.sqlite"), err;
  {
    Store store;
    REQUIRE_MESSAGE(store.open(path, &err), err);
    CHECK(query_text(store, "SELECT value FROM meta WHERE key = 'schema_version'") == "1");
    CHECK(query_int(store, "PRAGMA user_version") == kSchemaVersion);
    CHECK(query_text(store, "PRAGMA journal_mode") == "wal");
    CHECK(query_int(store, "PRAGMA foreign_keys") == 1);
    for (const char* table : {"meta", "sessions", "variants", "attempts", "builds", "validations", "timings",
                              "profiles", "decisions", "llm_calls", "probes", "events"})
      CHECK_MESSAGE(
          query_int(store, std::string("SELECT COUNT(*) FROM sqlite_master WHERE name = '") + table + "'") == 1, table);
    int64_t id = 0;
    REQUIRE_MESSAGE(store.create_session({{"task", "kimi"}}, &id, &err), err);
  }
  Store again;
  REQUIRE_MESSAGE(again.open(path, &err), err);
  CHECK(query_text(again, "SELECT value FROM meta WHERE key = 'schema_version'") == "1");
  std::vector<SessionRow> sessions;
  REQUIRE(again.sessions(&sessions, &err));
  REQUIRE(sessions.size() == 1);
  CHECK(sessions[0].task == "kimi");
  CHECK(sessions[0].status == "running");
}

TEST_CASE("a database with a newer schema is refused, naming both versions") {
  TempDir dir;
  std::string path = dir.file("k.sqlite"), err;
  {
    Store store;
    REQUIRE_MESSAGE(store.open(path, &err), err);
    REQUIRE(sqlite3_exec(store.handle(),
                         "UPDATE meta SET value = '2' WHERE key = 'schema_version'; PRAGMA user_version = 2", nullptr,
                         nullptr, nullptr) == SQLITE_OK);
  }
  Store store;
  CHECK_FALSE(store.open(path, &err));
  CHECK_MESSAGE(err.find("schema version 2 is newer than this ktune's (1)") != std::string::npos, err);
  CHECK(store.handle() == nullptr);
}

TEST_CASE("a file that is not an SQLite database is refused") {
  TempDir dir;
  std::string path = dir.file("notes.txt"), err;
  REQUIRE(write_file_atomic(path, std::string(4096, 'x'), &err));
  Store store;
  CHECK_FALSE(store.open(path, &err));
  CHECK_MESSAGE(err.find("file is not a database") != std::string::npos, err);
  CHECK_MESSAGE(err.find(path) != std::string::npos, err);
}

TEST_CASE("an SQLite database that is not ktune's is refused and left untouched") {
  TempDir dir;
  std::string path = dir.file("other.sqlite"), err;
  sqlite3* other = nullptr;
  REQUIRE(sqlite3_open(path.c_str(), &other) == SQLITE_OK);
  REQUIRE(sqlite3_exec(other, "CREATE TABLE notes(text)", nullptr, nullptr, nullptr) == SQLITE_OK);
  sqlite3_close(other);

  Store store;
  CHECK_FALSE(store.open(path, &err));
  CHECK_MESSAGE(err.find("not a ktune database") != std::string::npos, err);
  CHECK_FALSE(file_exists(path + "-wal"));  // not switched to WAL, no meta added
}

TEST_CASE("a recorded session lands in the derived tables") {
  TempDir dir;
  Store store;
  std::string err;
  REQUIRE_MESSAGE(store.open(dir.file("k.sqlite"), &err), err);
  Synthetic s = record_synthetic_session(store);

  SessionRow row;
  REQUIRE_MESSAGE(store.session(s.session, &row, &err), err);
  CHECK(row.task == "kimi");
  CHECK(row.size == "tiny");
  CHECK(row.backend == "host");
  CHECK(row.designer == "search");
  CHECK(row.seed == 7);
  CHECK(row.budget_s == 600);
  CHECK(row.status == "completed");
  CHECK(row.end_reason == "budget spent");
  CHECK(row.started_at == s.start_wall);
  CHECK(row.ended_at == s.start_wall + 120);
  CHECK(row.last_event_at == s.start_wall + 120);
  CHECK(row.best_variant == s.fast);
  CHECK(row.best_score_us == s.best_us);
  CHECK(row.best_speedup == 1.25);
  VariantRow best;
  REQUIRE_MESSAGE(store.variant("best", &best, &err), err);  // what bench, show and export accept
  CHECK(best.id == s.fast);
  CHECK(row.baseline_variant == s.base);
  CHECK(row.baseline_score_us == s.baseline_us);
  CHECK(row.attempts == 5);
  CHECK(row.info["env"]["host"] == "testbox");
  CHECK(row.summary["best_speedup"] == 1.25);

  std::vector<AttemptRow> attempts;
  REQUIRE(store.attempts(s.session, &attempts, &err));
  REQUIRE(attempts.size() == 5);
  struct Expected {
    std::string variant, purpose, outcome, decision;
    double score_us;
    int launches;
  };
  std::vector<Expected> expected = {{s.base, "baseline", "ok", "accepted", 100, 12},
                                    {s.fast, "candidate", "ok", "accepted", 80, 1},
                                    {s.broken, "candidate", "compile_error", "", 0, -1},
                                    {s.slow, "candidate", "ok", "rolled_back", 90, 1},
                                    {s.wrong, "candidate", "wrong_answer", "", 0, -1}};
  for (size_t i = 0; i < expected.size(); ++i) {
    CAPTURE(i);
    CHECK(attempts[i].seq == int(i) + 1);
    CHECK(attempts[i].variant == expected[i].variant);
    CHECK(attempts[i].purpose == expected[i].purpose);
    CHECK(attempts[i].outcome == expected[i].outcome);
    CHECK(attempts[i].decision == expected[i].decision);
    CHECK(attempts[i].score_us == expected[i].score_us);
    CHECK(attempts[i].launches_per_step == expected[i].launches);
    CHECK(attempts[i].finished_at > attempts[i].started_at);
  }
  CHECK(attempts[2].error == "broken.cc:1: error: expected ';'");
  CHECK(attempts[3].reason == "slower than best (90.0 us vs 80.0 us)");
  CHECK(attempts[1].phase_s["time"] == 3.0);

  // Raw samples, per context, exactly as recorded.
  json timings;
  REQUIRE(store.timings(s.session, 2, &timings, &err));
  REQUIRE(timings.size() == 2);
  CHECK(timings[0]["context"] == 128);
  CHECK(timings[0]["samples_us"] == json({71.0, 72.0, 72.5, 74.0}));
  CHECK(timings[1]["median_us"] == 88.0);
  CHECK(timings[1]["steps"] == 16);

  CHECK(query_int(store, "SELECT COUNT(*) FROM builds") == 5);
  CHECK(query_int(store, "SELECT COUNT(*) FROM builds WHERE ok = 0") == 1);
  CHECK(query_int(store, "SELECT COUNT(*) FROM validations") == 7);  // 2 + 2 + 2 + 1 cases
  CHECK(query_int(store, "SELECT COUNT(*) FROM validations WHERE passed = 0 AND attempt = 5") == 1);
  CHECK(query_text(store, "SELECT json_extract(metrics, '$.output.cosine') FROM validations WHERE attempt = 5") ==
        "0.2");
  CHECK(query_int(store, "SELECT COUNT(*) FROM timings") == 6);
  CHECK(query_int(store, "SELECT COUNT(*) FROM profiles") == 1);
  CHECK(
      query_text(store, "SELECT group_concat(decision, ',') FROM (SELECT decision FROM decisions ORDER BY attempt)") ==
      "accepted,accepted,rolled_back");
  CHECK(query_text(store, "SELECT best_after FROM decisions WHERE attempt = 2") == s.fast);
  CHECK(query_text(store, "SELECT group_concat(name || '=' || value || ' ' || unit, ';') FROM probes") ==
        "bandwidth=1234.5 GB/s;grid_barrier=2.5 us");
  CHECK(query_int(store, "SELECT tokens_in + tokens_out FROM llm_calls") == 1200);
  CHECK(query_text(store, "SELECT attempt IS NULL FROM llm_calls") == "1");
  CHECK(query_int(store, "SELECT COUNT(*) FROM variants") == 5);
  CHECK(query_text(store, "SELECT parent IS NULL FROM variants WHERE origin = 'baseline'") == "1");

  std::vector<Event> events;
  REQUIRE(store.events(s.session, &events, &err));
  REQUIRE(int(events.size()) == s.events);
  for (size_t i = 0; i < events.size(); ++i) CHECK(events[i].seq == int64_t(i) + 1);
  CHECK(events[0].kind == "session_started");
  CHECK(events[0].t == 0);
  CHECK(events.back().kind == "session_ended");
  CHECK(events.back().t == 120);
  std::vector<Event> best_changes;
  REQUIRE(store.events(s.session, &best_changes, &err, "best_changed"));
  REQUIRE(best_changes.size() == 1);
  CHECK(best_changes[0].attempt == 2);  // taken from data.attempt

  VariantRow v;
  REQUIRE_MESSAGE(store.variant(s.slow.substr(0, 10), &v, &err), err);
  CHECK(v.id == s.slow);
  CHECK(v.parent == s.fast);
  CHECK(v.knobs == json({{"tile", 64}, {"stages", 4}}));
  CHECK(v.rationale == "deeper pipeline");
  CHECK_FALSE(store.variant("zzz", &v, &err));
  CHECK(err.find("no variant") != std::string::npos);

  std::vector<AttemptRow> judged;
  REQUIRE(store.judged_attempts("kimi", "host", "tiny", &judged, &err));
  std::set<std::string> measured;
  for (const AttemptRow& a : judged) measured.insert(a.variant);
  CHECK(measured == std::set<std::string>{s.base, s.fast, s.broken, s.slow, s.wrong});
  REQUIRE(store.judged_attempts("kimi", "cuda", "tiny", &judged, &err));
  CHECK(judged.empty());
}

TEST_CASE("best names nothing in a database without a session's best") {
  TempDir dir;
  Store store;
  std::string err;
  REQUIRE_MESSAGE(store.open(dir.file("k.sqlite"), &err), err);
  VariantRow v;
  CHECK_FALSE(store.variant("best", &v, &err));
  CHECK(err.find("no session in the database has a best variant yet") != std::string::npos);
}

TEST_CASE("a prefix that matches several variants is ambiguous; a full id never is") {
  TempDir dir;
  Store store;
  std::string err;
  REQUIRE_MESSAGE(store.open(dir.file("k.sqlite"), &err), err);
  int64_t id = 0;
  REQUIRE(store.create_session({{"task", "kimi"}}, &id, &err));
  for (const char* vid : {"abc1", "abc2", "abc"})
    REQUIRE_MESSAGE(store.record(id, "variant", 0, {{"id", vid}, {"template", "t"}}, &err), err);
  VariantRow v;
  CHECK_FALSE(store.variant("ab", &v, &err));
  CHECK_MESSAGE(err.find("ambiguous prefix 'ab'") != std::string::npos, err);
  REQUIRE(store.variant("abc", &v, &err));
  CHECK(v.id == "abc");
  REQUIRE(store.variant("abc2", &v, &err));
  CHECK(v.id == "abc2");
}

TEST_CASE("record refuses events the tables cannot take, leaving nothing of them") {
  TempDir dir;
  Store store;
  std::string err;
  REQUIRE_MESSAGE(store.open(dir.file("k.sqlite"), &err), err);
  int64_t id = 0;
  REQUIRE(store.create_session({{"task", "kimi"}}, &id, &err));
  REQUIRE(store.record(id, "variant", 0, {{"id", "v1"}, {"template", "t"}}, &err));
  REQUIRE(store.record(id, "attempt_started", 1, {{"variant", "v1"}, {"purpose", "candidate"}}, &err));
  int64_t events_before = query_int(store, "SELECT COUNT(*) FROM events");

  auto refused = [&](const std::string& kind, int attempt, const json& data, const std::string& why) {
    CAPTURE(kind);
    CHECK_FALSE(store.record(id, kind, attempt, data, &err));
    CHECK_MESSAGE(err.find(why) != std::string::npos, err);
  };
  refused("attempt_finished", 1, {{"outcome", "exploded"}}, "unknown outcome 'exploded'");
  refused("attempt_finished", 1, {{"outcome", "ok"}, {"decision", "maybe"}}, "unknown decision 'maybe'");
  refused("attempt_finished", 9, {{"outcome", "ok"}}, "attempt 9 finished but was never started");
  refused("attempt_started", 2, {{"variant", "nope"}}, "no variant event recorded before it");
  refused("attempt_started", 1, {{"variant", "v1"}}, "UNIQUE constraint failed");
  refused("session_started", 0, json::object(), "create_session");
  refused("probe", 0, json::array(), "data must be a JSON object");
  CHECK_FALSE(store.record(id + 1, "probe", 0, {{"name", "x"}}, &err));
  CHECK(err.find("no session") != std::string::npos);

  CHECK(query_int(store, "SELECT COUNT(*) FROM events") == events_before);
  CHECK(query_text(store, "SELECT outcome FROM attempts WHERE seq = 1").empty());
  // The session goes on afterwards.
  REQUIRE_MESSAGE(store.record(id, "attempt_finished", 1, {{"outcome", "timeout"}, {"reason", "hung"}}, &err), err);
  CHECK(query_text(store, "SELECT outcome FROM attempts WHERE seq = 1") == "timeout");
  CHECK(query_int(store, "SELECT MAX(seq) FROM events") == events_before + 1);
}

TEST_CASE("unknown kinds are kept as events; resuming reopens and extends the budget") {
  TempDir dir;
  Store store;
  std::string err;
  REQUIRE_MESSAGE(store.open(dir.file("k.sqlite"), &err), err);
  int64_t id = 0;
  REQUIRE(store.create_session({{"task", "kimi"}, {"budget_s", 60}}, &id, &err));
  REQUIRE_MESSAGE(store.record(id, "hologram", 0, {{"color", "blue"}}, &err), err);
  REQUIRE(store.record(id, "session_ended", 0, {{"status", "interrupted"}, {"reason", "ctrl-c"}}, &err));
  SessionRow row;
  REQUIRE(store.session(id, &row, &err));
  CHECK(row.status == "interrupted");
  CHECK(row.ended_at > 0);

  REQUIRE(store.record(id, "session_resumed", 0,
                       {{"budget_s", 30}, {"argv", json::array({"ktune", "run", "--resume"})}}, &err));
  REQUIRE(store.session(id, &row, &err));
  CHECK(row.status == "running");
  CHECK(row.ended_at == 0);
  CHECK(row.budget_s == 90);
  std::vector<Event> events;
  REQUIRE(store.events(id, &events, &err, "hologram"));
  REQUIRE(events.size() == 1);
  CHECK(events[0].data["color"] == "blue");
  CHECK(events[0].seq == 2);
  CHECK(events[0].t >= 0);
}

TEST_CASE("judged_attempts skips attempts in flight or interrupted, and other workloads") {
  TempDir dir;
  Store store;
  std::string err;
  REQUIRE_MESSAGE(store.open(dir.file("k.sqlite"), &err), err);
  int64_t tiny = 0, big = 0;
  REQUIRE(store.create_session({{"task", "kimi"}, {"size", "tiny"}, {"backend", "host"}}, &tiny, &err));
  REQUIRE(store.create_session({{"task", "kimi"}, {"size", "big"}, {"backend", "host"}}, &big, &err));
  for (const char* v : {"done", "flying", "cut", "elsewhere"})
    REQUIRE(store.record(tiny, "variant", 0, {{"id", v}, {"template", "t"}}, &err));
  auto attempt = [&](int64_t session, int seq, const char* variant, const char* outcome) {
    REQUIRE_MESSAGE(
        store.record(session, "attempt_started", seq, {{"variant", variant}, {"purpose", "candidate"}}, &err), err);
    if (*outcome) REQUIRE_MESSAGE(store.record(session, "attempt_finished", seq, {{"outcome", outcome}}, &err), err);
  };
  int64_t tiny_again = 0;
  REQUIRE(store.create_session({{"task", "kimi"}, {"size", "tiny"}, {"backend", "host"}}, &tiny_again, &err));
  attempt(tiny_again, 1, "done", "ok");
  attempt(tiny, 1, "done", "launch_error");
  attempt(tiny, 2, "flying", "");
  attempt(tiny, 3, "cut", "interrupted");
  attempt(big, 1, "elsewhere", "ok");
  std::vector<AttemptRow> judged;
  REQUIRE(store.judged_attempts("kimi", "host", "tiny", &judged, &err));
  REQUIRE(judged.size() == 2);  // by session, then seq
  CHECK(judged[0].session_id == tiny);
  CHECK(judged[0].variant == "done");
  CHECK(judged[0].outcome == "launch_error");
  CHECK(judged[1].session_id == tiny_again);
  CHECK(judged[1].outcome == "ok");
}

TEST_CASE("a session's device is its latest device probe's name; a damaged event does not hide the session") {
  TempDir dir;
  Store store;
  std::string err;
  REQUIRE_MESSAGE(store.open(dir.file("k.sqlite"), &err), err);
  int64_t id = 0;
  REQUIRE(store.create_session({{"task", "kimi"}, {"size", "tiny"}, {"backend", "cuda"}}, &id, &err));
  auto device_now = [&] {
    SessionRow row;
    REQUIRE_MESSAGE(store.session(id, &row, &err), err);
    return row.device;
  };
  auto probe = [&](const json& data) { REQUIRE_MESSAGE(store.record(id, "probe", 0, data, &err), err); };
  CHECK(device_now().empty());  // no probe yet
  probe({{"name", "bandwidth"}, {"value", 3000.0}, {"unit", "GB/s"}, {"detail", {{"device", "not this one"}}}});
  CHECK(device_now().empty());  // only the device probe names it
  probe({{"name", "device"}, {"value", 0}, {"unit", ""}, {"detail", {{"backend", "cuda"}, {"device", "GPU A"}}}});
  CHECK(device_now() == "GPU A");
  // Resumed on another machine: the latest probe is where it runs now.
  probe({{"name", "device"}, {"value", 0}, {"unit", ""}, {"detail", {{"backend", "cuda"}, {"device", "GPU B"}}}});
  CHECK(device_now() == "GPU B");
  std::vector<SessionRow> all;
  REQUIRE(store.sessions(&all, &err));
  REQUIRE(all.size() == 1);
  CHECK(all[0].device == "GPU B");
  json j = all[0];
  CHECK(j["device"] == "GPU B");

  // An event whose JSON was damaged by hand is skipped, not an SQL error.
  REQUIRE(sqlite3_exec(store.handle(),
                       "UPDATE events SET data = '{\"name\": \"device\", broken' WHERE seq = "
                       "(SELECT MAX(seq) FROM events WHERE kind = 'probe')",
                       nullptr, nullptr, nullptr) == SQLITE_OK);
  CHECK(device_now() == "GPU A");
  REQUIRE(store.sessions(&all, &err));
  CHECK(all.size() == 1);
}

// The child records attempts as fast as it can until it is killed; it tells
// the parent through a pipe once the first attempt is in.
[[noreturn]] void record_until_killed(const std::string& path, int ready_fd) {
  Store store;
  std::string err;
  int64_t id = 0;
  if (!store.open(path, &err) || !store.create_session({{"task", "kimi"}}, &id, &err)) _exit(2);
  double give_up = mono_seconds() + 10;  // should the parent never kill us
  for (int attempt = 1; mono_seconds() < give_up; ++attempt) {
    std::string variant = "v" + std::to_string(attempt);
    bool ok = store.record(id, "variant", 0, {{"id", variant}, {"template", "t"}, {"knobs", {{"n", attempt}}}}, &err) &&
              store.record(id, "attempt_started", attempt, {{"variant", variant}, {"purpose", "candidate"}}, &err) &&
              store.record(id, "build", attempt, {{"ok", attempt % 3 != 0}, {"log", std::string(2000, 'l')}}, &err) &&
              store.record(id, "attempt_finished", attempt,
                           attempt % 3 ? json{{"outcome", "ok"},
                                              {"decision", attempt % 2 ? "accepted" : "rolled_back"},
                                              {"score_us", 100.0 - attempt * 1e-3}}
                                       : json{{"outcome", "compile_error"}},
                           &err);
    if (!ok) _exit(3);
    if (attempt == 1 && write(ready_fd, "x", 1) != 1) _exit(4);
  }
  _exit(0);
}

TEST_CASE("a writer SIGKILLed mid-session leaves a valid, consistent database") {
  TempDir dir;
  std::string path = dir.file("k.sqlite"), err;
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(ready[0]);
    record_until_killed(path, ready[1]);
  }
  close(ready[1]);
  char byte = 0;
  REQUIRE(read(ready[0], &byte, 1) == 1);
  close(ready[0]);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  REQUIRE(kill(child, SIGKILL) == 0);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE_MESSAGE(WIFSIGNALED(status), "the child ended on its own with status ", status);

  Store store;
  REQUIRE_MESSAGE(store.open(path, &err), err);
  CHECK(query_text(store, "PRAGMA integrity_check") == "ok");
  CHECK(query_text(store, "PRAGMA foreign_key_check").empty());
  int64_t finished = query_int(store, "SELECT COUNT(*) FROM attempts WHERE outcome <> ''");
  MESSAGE(finished << " attempts recorded before the kill");
  CHECK(finished > 1);
  // Each attempt's row and its events agree: the derived tables never run
  // ahead of the event log, nor behind it.
  CHECK(query_int(store,
                  "SELECT COUNT(*) FROM attempts a WHERE (a.outcome <> '') <> EXISTS (SELECT 1 FROM events e WHERE "
                  "e.session_id = a.session_id AND e.kind = 'attempt_finished' AND e.attempt = a.seq)") == 0);
  CHECK(query_int(store,
                  "SELECT COUNT(*) FROM events e WHERE e.kind = 'attempt_finished' AND NOT EXISTS (SELECT 1 FROM "
                  "attempts a WHERE a.session_id = e.session_id AND a.seq = e.attempt AND a.outcome <> '')") == 0);
  CHECK(query_int(store, "SELECT COUNT(*) FROM attempts") ==
        query_int(store, "SELECT COUNT(*) FROM events WHERE kind = 'attempt_started'"));
  CHECK(query_int(store, "SELECT COUNT(*) FROM decisions") ==
        query_int(store, "SELECT COUNT(*) FROM attempts WHERE decision <> ''"));
  CHECK(query_int(store, "SELECT COUNT(*) FROM builds") ==
        query_int(store, "SELECT COUNT(*) FROM events WHERE kind = 'build'"));
  int64_t count = query_int(store, "SELECT COUNT(*) FROM events");
  CHECK(query_int(store, "SELECT MIN(seq) FROM events") == 1);
  CHECK(query_int(store, "SELECT MAX(seq) FROM events") == count);

  // The session can be resumed where it stopped.
  REQUIRE_MESSAGE(store.record(1, "session_resumed", 0, {{"budget_s", 60}}, &err), err);
  CHECK(query_int(store, "SELECT MAX(seq) FROM events") == count + 1);
}
