// Store: the SQLite database of sessions. WAL mode, one writer (the
// orchestrator), a versioned schema (docs/schema.md) that users can query
// with the sqlite3 shell. Every event is committed as it is recorded, so a
// session killed at any point leaves a valid database and can be resumed.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/json.h"
#include "traces/events.h"

struct sqlite3;

namespace ktune::traces {

struct Event {
  int64_t seq = 0;      // order within the session, from 1
  double t = 0;         // seconds since the session started
  double wall = 0;      // Unix time
  std::string kind;
  int attempt = 0;      // the attempt it belongs to, 0 for none
  json data = json::object();
};

struct SessionRow {
  int64_t id = 0;
  std::string task, size, backend, designer, status;  // status: running|completed|interrupted|failed
  std::string end_reason;                             // the session_ended reason
  double started_at = 0, ended_at = 0, budget_s = 0;  // ended_at 0 while running; budget_s includes resumes
  int64_t seed = 0;
  std::string best_variant, baseline_variant;
  double best_score_us = 0, baseline_score_us = 0;
  double best_speedup = 0;   // over the baseline; 0 while there is no best
  double last_event_at = 0;  // wall time of its latest event (how far a killed session got)
  int attempts = 0;
  std::string device;             // its "device" probe's name (the GPU's, or "CPU"); "" before that probe
  json info = json::object();     // the session_started data
  json summary = json::object();  // the session_ended summary
};

struct VariantRow {
  std::string id, template_name, backend, source, parent, origin, rationale;  // parent "" for a root
  json knobs = json::object();
  double created_at = 0;
};

struct AttemptRow {
  int64_t session_id = 0;
  int seq = 0;
  std::string variant, purpose, outcome, decision, reason, error;  // outcome "" while in flight
  double started_at = 0, finished_at = 0;
  double score_us = 0, speedup = 0;  // 0 when not measured
  int launches_per_step = -1;        // -1 when not measured
  json phase_s = json::object();
};

class Store {
 public:
  Store() = default;
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Opens or creates the database and brings its schema to kSchemaVersion.
  // A database with a newer schema is refused (with the versions in `err`).
  bool open(const std::string& path, std::string* err);
  void close();

  // Starts a session from its session_started data and records that event
  // as seq 1 (t = 0); returns its id. `wall` is its start time, 0 for now.
  bool create_session(const json& started, int64_t* id, std::string* err, double wall = 0);
  // Appends an event to a session and applies it to the derived tables, in
  // one transaction. `t`/`wall` default to now (import passes the recorded
  // ones); t is seconds since the session's started_at. The event's seq is
  // assigned here. `attempt` 0 takes data.attempt. An event the derived
  // tables cannot take (an unknown outcome, an attempt finished that never
  // started, ...) is refused whole, with the reason in `err`.
  // The baseline: when an attempt with purpose "baseline" finishes ok, its
  // variant and score become the session's baseline, and its best too
  // (speedup 1) until a best_changed event says otherwise.
  bool record(int64_t session, const std::string& kind, int attempt, const json& data, std::string* err,
              std::optional<double> t = std::nullopt, std::optional<double> wall = std::nullopt);
  // Runs `body` in one transaction: all that it records is committed, or,
  // when it returns false (or throws), none of it. Nests (record and
  // create_session inside it become savepoints); import uses it so that a
  // trace lands whole or not at all.
  bool transaction(const std::function<bool(std::string* err)>& body, std::string* err);

  bool sessions(std::vector<SessionRow>* out, std::string* err);
  bool session(int64_t id, SessionRow* out, std::string* err);
  bool attempts(int64_t session, std::vector<AttemptRow>* out, std::string* err);
  // Every attempt of one variant (full id), in any session, oldest first.
  bool variant_attempts(const std::string& variant_id, std::vector<AttemptRow>* out, std::string* err);
  // Full or unique-prefix id (a prefix matching several is an error), or
  // "best": the best variant of the latest session that has one.
  bool variant(const std::string& id_or_prefix, VariantRow* out, std::string* err);
  // In seq order; only those of one kind when `kind` is given.
  bool events(int64_t session, std::vector<Event>* out, std::string* err, const std::string& kind = "");
  // Every timing sample of one attempt: [{context, samples_us: [...]}, ...],
  // each entry also carrying steps, warmup, median_us, p10_us, p90_us, mad_us.
  bool timings(int64_t session, int attempt, json* out, std::string* err);
  // Every ok or failed attempt in any session of this task/backend/size,
  // by session and seq: what a designer knows of the workload already.
  // Attempts in flight or interrupted are left out: their variant was not
  // judged.
  bool judged_attempts(const std::string& task, const std::string& backend, const std::string& size,
                       std::vector<AttemptRow>* out, std::string* err);

  sqlite3* handle() { return db_; }

 private:
  sqlite3* db_ = nullptr;
  bool apply(int64_t session, const Event& e, std::string* err);
};

// The rows as JSON objects, field for field (`json j = row;` works too).
void to_json(json& j, const Event& e);
void to_json(json& j, const SessionRow& r);
void to_json(json& j, const VariantRow& r);
void to_json(json& j, const AttemptRow& r);

}  // namespace ktune::traces
