// Trace files: exporting a session's events as JSONL, checking a trace line
// by line, and importing it as a new session through Store::record, all of
// it or nothing.
#include "traces/trace_file.h"

namespace ktune::traces {
namespace {

bool fail_at(std::string* err, size_t line, const std::string& message) {
  *err = "line " + std::to_string(line) + ": " + message;
  return false;
}

// The header's checks; `why` says what is wrong.
bool check_header(const json& header, std::string* why) {
  if (!header.is_object() || data_string(header, "format") != kTraceFormat) {
    *why = std::string("expected the header {\"format\": \"") + kTraceFormat + "\", ...}";
    return false;
  }
  const json& version = data_field(header, "schema_version");
  if (!version.is_number_integer() || version.get<int64_t>() < 1) {
    *why = "the header has no valid schema_version";
    return false;
  }
  // Traces of older schema versions would be upgraded here, event by event,
  // once a version changes what an event carries.
  if (version.get<int64_t>() > kSchemaVersion) {
    *why = "trace schema version " + std::to_string(version.get<int64_t>()) +
           " is newer than this ktune understands (" + std::to_string(kSchemaVersion) + ")";
    return false;
  }
  return true;
}

// One event line's fields and their types.
bool event_from_json(const json& j, Event* e, std::string* why) {
  auto bad = [&](const char* message) {
    *why = message;
    return false;
  };
  if (!j.is_object()) return bad("expected a JSON object");
  const json &seq = data_field(j, "seq"), &t = data_field(j, "t"), &wall = data_field(j, "wall");
  const json &kind = data_field(j, "kind"), &attempt = data_field(j, "attempt"), &data = data_field(j, "data");
  if (!seq.is_number_integer()) return bad("\"seq\" must be an integer");
  if (!t.is_number() || !wall.is_number()) return bad("\"t\" and \"wall\" must be numbers");
  if (!kind.is_string() || kind.get_ref<const std::string&>().empty())
    return bad("\"kind\" must be a non-empty string");
  if (!attempt.is_number_integer() || attempt.get<int64_t>() < 0) return bad("\"attempt\" must be an integer >= 0");
  if (!data.is_object()) return bad("\"data\" must be a JSON object");
  *e = Event{.seq = seq.get<int64_t>(),
             .t = t.get<double>(),
             .wall = wall.get<double>(),
             .kind = kind.get<std::string>(),
             .attempt = attempt.get<int>(),
             .data = data};
  return true;
}

}  // namespace

bool export_trace(Store& store, int64_t session, std::string* jsonl, std::string* err) {
  SessionRow row;
  std::vector<Event> events;
  if (!store.session(session, &row, err) || !store.events(session, &events, err)) return false;
  json header = {
      {"format", kTraceFormat},
      {"schema_version", kSchemaVersion},
      {"task", row.task},
      {"size", row.size},
      {"backend", row.backend},
      {"env", data_field(row.info, "env")},
      {"session", row},
  };
  *jsonl = json_text(header) + "\n";
  for (const Event& e : events) *jsonl += json_text(json(e)) + "\n";
  return true;
}

bool parse_trace(const std::string& jsonl, TraceFile* out, std::string* err) {
  TraceFile trace;
  size_t line_no = 0;
  bool have_header = false;
  for (size_t start = 0; start < jsonl.size();) {
    size_t newline = jsonl.find('\n', start);
    bool complete = newline != std::string::npos;  // a killed export leaves a last line without its newline
    std::string line = jsonl.substr(start, complete ? newline - start : std::string::npos);
    start = complete ? newline + 1 : jsonl.size();
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;

    json j = json::parse(line, nullptr, false);
    if (j.is_discarded())
      return fail_at(err, line_no,
                     complete ? "not valid JSON" : "truncated (the file ends mid-line; was the export cut short?)");
    std::string why;
    if (!have_header) {
      if (!check_header(j, &why)) return fail_at(err, line_no, why);
      trace.header = std::move(j);
      have_header = true;
      continue;
    }
    Event e;
    if (!event_from_json(j, &e, &why)) return fail_at(err, line_no, why);
    if (!trace.events.empty() && e.seq <= trace.events.back().seq)
      return fail_at(
          err, line_no,
          "seq " + std::to_string(e.seq) + " does not follow seq " + std::to_string(trace.events.back().seq));
    if (trace.events.empty() != (e.kind == "session_started"))
      return fail_at(err, line_no,
                     trace.events.empty() ? "the first event must be session_started, not " + e.kind
                                          : "session_started may only be the first event");
    trace.events.push_back(std::move(e));
  }
  if (!have_header) return fail_at(err, 1, "empty trace (no header)");
  if (trace.events.empty()) return fail_at(err, line_no + 1, "the trace has no events");
  *out = std::move(trace);
  return true;
}

bool import_trace(Store& store, const TraceFile& trace, int64_t* new_session, std::string* err) {
  if (trace.events.empty() || trace.events.front().kind != "session_started") {
    *err = "import: the trace does not start with a session_started event";
    return false;
  }
  int64_t id = 0;
  // One transaction: a trace that fails halfway leaves nothing behind.
  bool ok = store.transaction(
      [&](std::string* terr) {
        const Event& started = trace.events.front();
        if (!store.create_session(started.data, &id, terr, started.wall)) return false;
        for (size_t i = 1; i < trace.events.size(); ++i) {
          const Event& e = trace.events[i];
          if (!store.record(id, e.kind, e.attempt, e.data, terr, e.t, e.wall)) {
            *terr = "event seq " + std::to_string(e.seq) + ": " + *terr;
            return false;
          }
        }
        return true;
      },
      err);
  if (ok) *new_session = id;
  return ok;
}

}  // namespace ktune::traces
