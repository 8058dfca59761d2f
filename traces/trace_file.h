// Trace files: a session as JSONL. Line 1 is a header {format, schema_version,
// task, size, backend, env, session}; every further line is one event
// {seq, t, wall, kind, attempt, data}. Import feeds the events through
// Store::record into a new session, so the same tables come out.
#pragma once
#include <string>
#include <vector>

#include "traces/store.h"

namespace ktune::traces {

struct TraceFile {
  json header = json::object();
  std::vector<Event> events;
};

bool export_trace(Store& store, int64_t session, std::string* jsonl, std::string* err);
// Parses and checks a trace (format, version, event order, kinds); a
// malformed line is an error naming its line number, and nothing is written.
bool parse_trace(const std::string& jsonl, TraceFile* out, std::string* err);
bool import_trace(Store& store, const TraceFile& trace, int64_t* new_session, std::string* err);

}  // namespace ktune::traces
