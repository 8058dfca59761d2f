// Trace files: export -> parse -> import reproduces a session, malformed
// traces are refused with the line that is wrong, and an import that fails
// halfway leaves nothing behind.
#include <doctest/doctest.h>

#include <sstream>

#include "tests/traces_fixture.h"
#include "traces/trace_file.h"

using namespace ktune;
using namespace ktune::traces;
using namespace ktune::traces::testing;

namespace {

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += line + "\n";
  return text;
}

std::string exported(Store& store, int64_t session) {
  std::string jsonl, err;
  REQUIRE_MESSAGE(export_trace(store, session, &jsonl, &err), err);
  return jsonl;
}

}  // namespace

TEST_CASE("export, parse and import reproduce a session") {
  TempDir dir;
  Store original, copy;
  std::string err;
  REQUIRE_MESSAGE(original.open(dir.file("a.sqlite"), &err), err);
  REQUIRE_MESSAGE(copy.open(dir.file("b.sqlite"), &err), err);
  Synthetic s = record_synthetic_session(original);
  std::string jsonl = exported(original, s.session);

  std::vector<std::string> lines = split_lines(jsonl);
  REQUIRE(int(lines.size()) == s.events + 1);
  json header = json::parse(lines[0]);
  CHECK(header["format"] == "ktune-trace");
  CHECK(header["schema_version"] == 1);
  CHECK(header["task"] == "kimi");
  CHECK(header["env"]["host"] == "testbox");
  CHECK(header["session"]["best_variant"] == s.fast);
  json first = json::parse(lines[1]);
  CHECK(first["kind"] == "session_started");
  CHECK(first["seq"] == 1);

  TraceFile trace;
  REQUIRE_MESSAGE(parse_trace(jsonl, &trace, &err), err);
  REQUIRE(int(trace.events.size()) == s.events);
  int64_t imported = 0;
  REQUIRE_MESSAGE(import_trace(copy, trace, &imported, &err), err);

  std::vector<AttemptRow> want, got;
  REQUIRE(original.attempts(s.session, &want, &err));
  REQUIRE(copy.attempts(imported, &got, &err));
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i].seq == want[i].seq);
    CHECK(got[i].variant == want[i].variant);
    CHECK(got[i].outcome == want[i].outcome);
    CHECK(got[i].decision == want[i].decision);
    CHECK(got[i].reason == want[i].reason);
    CHECK(got[i].score_us == want[i].score_us);
    CHECK(got[i].started_at == want[i].started_at);
  }
  std::vector<Event> events;
  REQUIRE(copy.events(imported, &events, &err));
  CHECK(int(events.size()) == s.events);
  SessionRow row;
  REQUIRE(copy.session(imported, &row, &err));
  CHECK(row.best_variant == s.fast);
  CHECK(row.started_at == s.start_wall);

  // Exporting the copy gives the same file, but for the session's id.
  std::vector<std::string> again = split_lines(exported(copy, imported));
  REQUIRE(again.size() == lines.size());
  json header_again = json::parse(again[0]);
  header["session"].erase("id");
  header_again["session"].erase("id");
  CHECK(header_again == header);
  for (size_t i = 1; i < lines.size(); ++i) CHECK(again[i] == lines[i]);

  // Importing into the database it came from adds a second, equal session.
  int64_t second = 0;
  REQUIRE_MESSAGE(import_trace(original, trace, &second, &err), err);
  CHECK(second != s.session);
  REQUIRE(original.attempts(second, &got, &err));
  CHECK(got.size() == want.size());
}

TEST_CASE("malformed traces are refused with the line that is wrong") {
  TempDir dir;
  Store store;
  std::string err;
  REQUIRE_MESSAGE(store.open(dir.file("a.sqlite"), &err), err);
  Synthetic s = record_synthetic_session(store);
  const std::string good = exported(store, s.session);
  const std::vector<std::string> lines = split_lines(good);

  auto refused = [&](const std::string& what, const std::string& text, const std::string& expected) {
    CAPTURE(what);
    TraceFile trace;
    std::string why;
    CHECK_FALSE(parse_trace(text, &trace, &why));
    CHECK_MESSAGE(why.find(expected) != std::string::npos, why);
  };
  auto with_line = [&](size_t index, const std::string& replacement) {
    std::vector<std::string> changed = lines;
    changed[index] = replacement;
    return join_lines(changed);
  };
  auto with_event = [&](size_t index, const char* key, const json& value) {
    json e = json::parse(lines[index]);
    e[key] = value;
    return with_line(index, e.dump());
  };

  refused("bad header", with_line(0, R"({"format":"csv","schema_version":1})"), "line 1: expected the header");
  refused("newer trace", with_line(0, R"({"format":"ktune-trace","schema_version":2})"),
          "line 1: trace schema version 2 is newer than this ktune understands (1)");
  refused("not JSON on line 3", with_line(2, "this is not json"), "line 3: not valid JSON");
  refused("not an object", with_line(3, "[1, 2]"), "line 4: expected a JSON object");
  refused("seq out of order", with_event(4, "seq", 2), "line 5: seq 2 does not follow seq 3");
  refused("missing data", with_event(4, "data", "text"), "line 5: \"data\" must be a JSON object");
  refused("first event", with_event(1, "kind", "probe"), "line 2: the first event must be session_started");
  refused("second start", with_event(3, "kind", "session_started"), "line 4: session_started may only be the first");
  refused("no events", lines[0] + "\n", "line 2: the trace has no events");
  // A killed export: the last line stops short of its end and its newline.
  std::string truncated = good.substr(0, good.size() - 25);
  refused("truncated", truncated, "line " + std::to_string(lines.size()) + ": truncated");

  // A trace that parses stays whole: blank lines and CRLF are fine.
  TraceFile trace;
  std::string crlf = lines[0] + "\r\n\n";
  for (size_t i = 1; i < lines.size(); ++i) crlf += lines[i] + "\r\n";
  REQUIRE_MESSAGE(parse_trace(crlf, &trace, &err), err);
  CHECK(int(trace.events.size()) == s.events);
}

TEST_CASE("an import that fails halfway leaves nothing behind") {
  TempDir dir;
  Store source, target;
  std::string err;
  REQUIRE_MESSAGE(source.open(dir.file("a.sqlite"), &err), err);
  REQUIRE_MESSAGE(target.open(dir.file("b.sqlite"), &err), err);
  Synthetic s = record_synthetic_session(source);
  TraceFile trace;
  REQUIRE_MESSAGE(parse_trace(exported(source, s.session), &trace, &err), err);

  // Well-formed as a file, but the store refuses its fourth attempt_finished.
  int finished = 0;
  int64_t bad_seq = 0;
  for (Event& e : trace.events)
    if (e.kind == "attempt_finished" && ++finished == 4) {
      e.data["outcome"] = "exploded";
      bad_seq = e.seq;
    }
  REQUIRE(bad_seq > 0);
  int64_t imported = -1;
  CHECK_FALSE(import_trace(target, trace, &imported, &err));
  CHECK_MESSAGE(err.find("event seq " + std::to_string(bad_seq) + ": record attempt_finished: unknown outcome") !=
                    std::string::npos,
                err);
  CHECK(imported == -1);
  for (const char* table : {"sessions", "events", "variants", "attempts", "builds", "timings", "probes"})
    CHECK_MESSAGE(query_int(target, std::string("SELECT COUNT(*) FROM ") + table) == 0, table);

  // The same store imports the intact trace afterwards.
  REQUIRE_MESSAGE(parse_trace(exported(source, s.session), &trace, &err), err);
  REQUIRE_MESSAGE(import_trace(target, trace, &imported, &err), err);
  CHECK(query_int(target, "SELECT COUNT(*) FROM attempts") == 5);
}
