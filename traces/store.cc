// The SQLite store: schema v1 and how a database is brought to it, recording
// events (each in its own transaction, applied to the derived tables), and
// the queries behind the reports and the orchestrator. Data reaches SQL only
// through bound parameters. docs/schema.md documents every table.
#include "traces/store.h"

#include <sqlite3.h>

#include <charconv>
#include <iterator>
#include <map>
#include <string_view>

#include "base/clock.h"

namespace ktune::traces {
namespace {

// Schema v1. Columns holding JSON are TEXT (a JSON type name would get
// NUMERIC affinity, which turns the text "5" into the number 5). Times are
// Unix seconds (REAL), durations seconds, scores microseconds per step.
// Derived rows name their session with ON DELETE CASCADE, so deleting a
// session row removes all of it; attempts.variant must name a known variant.
constexpr const char* kSchemaV1 = R"sql(
CREATE TABLE meta (
  key   TEXT PRIMARY KEY,
  value TEXT NOT NULL
);
CREATE TABLE sessions (
  id                INTEGER PRIMARY KEY,
  task              TEXT NOT NULL,
  size              TEXT NOT NULL,
  backend           TEXT NOT NULL,
  designer          TEXT NOT NULL,
  status            TEXT NOT NULL,
  started_at        REAL NOT NULL,
  ended_at          REAL,
  end_reason        TEXT,
  budget_s          REAL NOT NULL,
  seed              INTEGER NOT NULL,
  info              TEXT NOT NULL,
  summary           TEXT NOT NULL DEFAULT '{}',
  best_variant      TEXT,
  best_score_us     REAL,
  best_speedup      REAL,
  baseline_variant  TEXT,
  baseline_score_us REAL
);
CREATE INDEX sessions_by_workload ON sessions(task, backend, size);

CREATE TABLE variants (
  id         TEXT PRIMARY KEY,
  template   TEXT NOT NULL,
  backend    TEXT NOT NULL,
  knobs      TEXT NOT NULL,
  source     TEXT NOT NULL,
  parent     TEXT,
  origin     TEXT NOT NULL,
  rationale  TEXT NOT NULL,
  created_at REAL NOT NULL
);

CREATE TABLE attempts (
  session_id        INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  seq               INTEGER NOT NULL,
  variant           TEXT NOT NULL REFERENCES variants(id),
  purpose           TEXT NOT NULL,
  outcome           TEXT NOT NULL DEFAULT '',
  decision          TEXT NOT NULL DEFAULT '',
  reason            TEXT NOT NULL DEFAULT '',
  error             TEXT NOT NULL DEFAULT '',
  started_at        REAL NOT NULL,
  finished_at       REAL,
  score_us          REAL,
  speedup           REAL,
  launches_per_step INTEGER,
  phase_s           TEXT NOT NULL DEFAULT '{}',
  PRIMARY KEY (session_id, seq)
);
CREATE INDEX attempts_by_variant ON attempts(variant);

CREATE TABLE builds (
  session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  attempt    INTEGER NOT NULL,
  ok         INTEGER NOT NULL,
  cached     INTEGER NOT NULL,
  seconds    REAL,
  command    TEXT,
  log        TEXT,
  resources  TEXT,
  timed_out  INTEGER NOT NULL
);
CREATE INDEX builds_by_attempt ON builds(session_id, attempt);

CREATE TABLE validations (
  session_id    INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  attempt       INTEGER NOT NULL,
  seed          INTEGER,
  context,
  passed        INTEGER NOT NULL,
  metrics       TEXT,
  experts_match INTEGER
);
CREATE INDEX validations_by_attempt ON validations(session_id, attempt);

CREATE TABLE timings (
  session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  attempt    INTEGER NOT NULL,
  context,
  steps      INTEGER,
  warmup     INTEGER,
  samples_us TEXT NOT NULL,
  median_us  REAL,
  p10_us     REAL,
  p90_us     REAL,
  mad_us     REAL
);
CREATE INDEX timings_by_attempt ON timings(session_id, attempt);

CREATE TABLE profiles (
  session_id        INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  attempt           INTEGER NOT NULL,
  launches_per_step INTEGER,
  resources         TEXT,
  extra             TEXT
);
CREATE INDEX profiles_by_attempt ON profiles(session_id, attempt);

CREATE TABLE decisions (
  session_id  INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  attempt     INTEGER NOT NULL,
  decision    TEXT NOT NULL,
  reason      TEXT NOT NULL,
  best_before,
  best_after
);
CREATE INDEX decisions_by_attempt ON decisions(session_id, attempt);

CREATE TABLE llm_calls (
  id          INTEGER PRIMARY KEY,
  session_id  INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  attempt     INTEGER,
  provider    TEXT,
  model       TEXT,
  url         TEXT,
  prompt      TEXT,
  reply       TEXT,
  status      TEXT,
  http_status INTEGER,
  tokens_in   INTEGER,
  tokens_out  INTEGER,
  latency_s   REAL,
  retries     INTEGER,
  error       TEXT,
  created_at  REAL NOT NULL
);
CREATE INDEX llm_calls_by_session ON llm_calls(session_id);

CREATE TABLE probes (
  session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  name       TEXT NOT NULL,
  value      REAL,
  unit       TEXT,
  detail     TEXT
);
CREATE INDEX probes_by_session ON probes(session_id);

CREATE TABLE events (
  session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  seq        INTEGER NOT NULL,
  t          REAL NOT NULL,
  wall       REAL NOT NULL,
  kind       TEXT NOT NULL,
  attempt    INTEGER NOT NULL,
  data       TEXT NOT NULL,
  PRIMARY KEY (session_id, seq)
);
CREATE INDEX events_by_kind ON events(session_id, kind);
)sql";

// One step per schema version: `sql` brings a database from version - 1 to
// `version`. Schema v2 appends {2, kSchemaV2} holding its ALTER TABLEs (and
// any data rewrite); open() runs the steps a database is missing.
struct Migration {
  int version;
  const char* sql;
};
constexpr Migration kMigrations[] = {{1, kSchemaV1}};
static_assert(std::size(kMigrations) == kSchemaVersion, "one migration step per schema version");

const json kEmptyObject = json::object();
const json kEmptyArray = json::array();

bool fail(std::string* err, const std::string& message) {
  *err = message;
  return false;
}

// A JSON value bound as its JSON text (NULL for a JSON null): for the JSON
// columns. Lives only as long as the statement that binds it.
struct JsonText {
  const json& value;
};

// A prepared statement. Errors (preparing, binding, stepping) are kept and
// reported once by done()/run(), so call sites read as one chain:
//   Stmt(db, "INSERT ... VALUES (?1, ?2)").bind(a, b).run(err)
//   Stmt s(db, "SELECT ..."); s.bind(x); while (s.next()) {...}; if (!s.done(err)) ...
class Stmt {
 public:
  Stmt(sqlite3* db, const std::string& sql) : db_(db) {
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt_, nullptr) != SQLITE_OK) note_error();
  }
  ~Stmt() { sqlite3_finalize(stmt_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  // Binds the parameters ?1, ?2, ... in order.
  template <class... Args>
  Stmt& bind(const Args&... args) {
    int index = 0;
    (bind_one(++index, args), ...);
    return *this;
  }
  // Steps once: true when there is a row. False at the end or on an error;
  // done() tells which.
  bool next() {
    if (!stmt_ || !error_.empty() || finished_) return false;
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE)
      finished_ = true;
    else
      note_error();
    return false;
  }
  bool done(std::string* err) const { return error_.empty() || fail(err, error_); }
  // Runs a statement that returns no rows.
  bool run(std::string* err) {
    while (next()) {
    }
    return done(err);
  }

  // Columns of the current row. NULL reads as "", 0 or the fallback.
  bool is_null(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
  int64_t integer(int col) const { return sqlite3_column_int64(stmt_, col); }
  double real(int col) const { return sqlite3_column_double(stmt_, col); }
  std::string text(int col) const {
    const unsigned char* p = sqlite3_column_text(stmt_, col);
    return p ? std::string(reinterpret_cast<const char*>(p), sqlite3_column_bytes(stmt_, col)) : std::string();
  }
  // A JSON column, parsed.
  json parsed(int col, const json& fallback = kEmptyObject) const {
    if (is_null(col)) return fallback;
    json v = json::parse(text(col), nullptr, false);
    return v.is_discarded() ? fallback : v;
  }
  // A column of no declared type, as the JSON value it was bound from.
  json value(int col) const {
    switch (sqlite3_column_type(stmt_, col)) {
      case SQLITE_INTEGER:
        return integer(col);
      case SQLITE_FLOAT:
        return real(col);
      case SQLITE_NULL:
        return nullptr;
      default:
        return text(col);
    }
  }

 private:
  void note_error() {
    if (error_.empty()) error_ = sqlite3_errmsg(db_);
  }
  void check(int rc) {
    if (rc != SQLITE_OK) note_error();
  }
  void bind_one(int i, std::nullptr_t) {
    if (stmt_) check(sqlite3_bind_null(stmt_, i));
  }
  void bind_one(int i, int64_t v) {
    if (stmt_) check(sqlite3_bind_int64(stmt_, i, v));
  }
  void bind_one(int i, int v) { bind_one(i, int64_t{v}); }
  void bind_one(int i, double v) {
    if (stmt_) check(sqlite3_bind_double(stmt_, i, v));
  }
  void bind_one(int i, const std::string& v) {
    if (stmt_) check(sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT));
  }
  void bind_one(int i, const char* v) { bind_one(i, std::string(v)); }
  // A JSON scalar binds as itself (a bool as 0/1, null as NULL), an object
  // or array as its text.
  void bind_one(int i, const json& v) {
    if (v.is_null())
      bind_one(i, nullptr);
    else if (v.is_boolean())
      bind_one(i, int64_t{v.get<bool>()});
    else if (v.is_number_integer())
      bind_one(i, v.get<int64_t>());
    else if (v.is_number())
      bind_one(i, v.get<double>());
    else if (v.is_string())
      bind_one(i, v.get_ref<const std::string&>());
    else
      bind_one(i, json_text(v));
  }
  void bind_one(int i, JsonText v) {
    if (v.value.is_null())
      bind_one(i, nullptr);
    else
      bind_one(i, json_text(v.value));
  }

  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  std::string error_;
  bool finished_ = false;
};

// Statements without parameters (the schema, PRAGMAs, transaction control).
bool exec(sqlite3* db, const char* sql, std::string* err) {
  char* message = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &message) == SQLITE_OK) return true;
  *err = message ? message : sqlite3_errmsg(db);
  sqlite3_free(message);
  return false;
}

// --- Schema version -------------------------------------------------------

// 0 for an empty database, else the meta table's schema_version. A database
// with tables but no meta table is someone else's.
bool read_schema_version(sqlite3* db, int* version, std::string* err) {
  Stmt tables(db, "SELECT COUNT(*), COALESCE(SUM(name = 'meta'), 0) FROM sqlite_master WHERE type = 'table'");
  int64_t table_count = 0, meta_count = 0;
  if (tables.next()) {
    table_count = tables.integer(0);
    meta_count = tables.integer(1);
  }
  if (!tables.done(err)) return false;
  *version = 0;
  if (table_count == 0) return true;
  if (meta_count == 0) return fail(err, "not a ktune database (it has tables but no ktune meta table)");

  Stmt meta(db, "SELECT value FROM meta WHERE key = 'schema_version'");
  std::string text;
  if (meta.next()) text = meta.text(0);
  if (!meta.done(err)) return false;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *version);
  if (ec != std::errc() || end != text.data() + text.size() || *version < 1)
    return fail(err, "not a ktune database (its meta table has no valid schema_version)");
  return true;
}

bool check_not_newer(int version, std::string* err) {
  if (version <= kSchemaVersion) return true;
  return fail(err, "its schema version " + std::to_string(version) + " is newer than this ktune's (" +
                       std::to_string(kSchemaVersion) + "); use a newer ktune");
}

// Runs the migration steps the database lacks, all in one transaction; the
// version is read again under the write lock, in case another process
// migrated it meanwhile.
bool migrate(sqlite3* db, std::string* err) {
  if (!exec(db, "BEGIN IMMEDIATE", err)) return false;
  int version = 0;
  bool ok = read_schema_version(db, &version, err) && check_not_newer(version, err);
  for (const Migration& step : kMigrations) {
    if (!ok || step.version <= version) continue;
    std::string user_version = "PRAGMA user_version = " + std::to_string(step.version);
    ok = exec(db, step.sql, err) &&
         Stmt(db, "INSERT OR REPLACE INTO meta(key, value) VALUES ('schema_version', ?1)")
             .bind(std::to_string(step.version))
             .run(err) &&
         exec(db, user_version.c_str(), err);
    if (!ok) *err = "migrating to schema version " + std::to_string(step.version) + ": " + *err;
  }
  ok = ok && exec(db, "COMMIT", err);
  if (!ok) {
    std::string ignored;
    exec(db, "ROLLBACK", &ignored);
  }
  return ok;
}

// --- Applying events to the derived tables ---------------------------------

json nullable(const std::string& s) { return s.empty() ? json() : json(s); }

// The field, or `fallback` when the event left it out (for NOT NULL JSON columns).
const json& field_or(const json& data, const char* key, const json& fallback) {
  const json& v = data_field(data, key);
  return v.is_null() ? fallback : v;
}

bool flag(const json& data, const char* key) {
  const json& v = data_field(data, key);
  return v.is_boolean() ? v.get<bool>() : data_number(data, key) != 0;
}

// timing and profile events carry the attempt's launches per step.
bool set_launches(sqlite3* db, int64_t session, const Event& e, std::string* err) {
  const json& launches = data_field(e.data, "launches_per_step");
  if (!launches.is_number()) return true;
  return Stmt(db, "UPDATE attempts SET launches_per_step = ?3 WHERE session_id = ?1 AND seq = ?2")
      .bind(session, e.attempt, launches)
      .run(err);
}

bool apply_variant(sqlite3* db, int64_t session, const Event& e, std::string* err) {
  const json& d = e.data;
  std::string id = data_string(d, "id");
  if (id.empty()) return fail(err, "variant without an id");
  // The same variant may appear in many sessions: the first record of it stays.
  return Stmt(db,
              "INSERT OR IGNORE INTO variants(id, template, backend, knobs, source, parent, origin, rationale, "
              "created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)")
      .bind(id, data_string(d, "template"), data_string(d, "backend"), JsonText{field_or(d, "knobs", kEmptyObject)},
            data_string(d, "source"), nullable(data_string(d, "parent")), data_string(d, "origin"),
            data_string(d, "rationale"), e.wall)
      .run(err);
}

bool apply_attempt_started(sqlite3* db, int64_t session, const Event& e, std::string* err) {
  if (e.attempt <= 0) return fail(err, "attempt_started without an attempt number");
  std::string variant = data_string(e.data, "variant");
  bool known = false;
  {
    Stmt lookup(db, "SELECT 1 FROM variants WHERE id = ?1");
    known = lookup.bind(variant).next();
    if (!lookup.done(err)) return false;
  }
  if (!known)
    return fail(err, "attempt " + std::to_string(e.attempt) + " uses variant '" + variant +
                         "', which no variant event recorded before it");
  return Stmt(db, "INSERT INTO attempts(session_id, seq, variant, purpose, started_at) VALUES (?1, ?2, ?3, ?4, ?5)")
      .bind(session, e.attempt, variant, data_string(e.data, "purpose"), e.wall)
      .run(err);
}

bool apply_build(sqlite3* db, int64_t session, const Event& e, std::string* err) {
  const json& d = e.data;
  return Stmt(db,
              "INSERT INTO builds(session_id, attempt, ok, cached, seconds, command, log, resources, timed_out) "
              "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)")
      .bind(session, e.attempt, flag(d, "ok"), flag(d, "cached"), data_field(d, "seconds"), data_string(d, "command"),
            data_string(d, "log"), JsonText{data_field(d, "resources")}, flag(d, "timed_out"))
      .run(err);
}

// One row per validation case.
bool apply_validation(sqlite3* db, int64_t session, const Event& e, std::string* err) {
  for (const json& c : field_or(e.data, "cases", kEmptyArray)) {
    bool ok = Stmt(db,
                   "INSERT INTO validations(session_id, attempt, seed, context, passed, metrics, experts_match) "
                   "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)")
                  .bind(session, e.attempt, data_field(c, "seed"), data_field(c, "context"), flag(c, "passed"),
                        JsonText{data_field(c, "metrics")}, data_field(c, "experts_match"))
                  .run(err);
    if (!ok) return false;
  }
  return true;
}

// One row per timed context, raw samples kept.
bool apply_timing(sqlite3* db, int64_t session, const Event& e, std::string* err) {
  for (const json& c : field_or(e.data, "contexts", kEmptyArray)) {
    bool ok = Stmt(db,
                   "INSERT INTO timings(session_id, attempt, context, steps, warmup, samples_us, median_us, p10_us, "
                   "p90_us, mad_us) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)")
                  .bind(session, e.attempt, data_field(c, "context"), data_field(c, "steps"), data_field(c, "warmup"),
                        JsonText{field_or(c, "samples_us", kEmptyArray)}, data_field(c, "median_us"),
                        data_field(c, "p10_us"), data_field(c, "p90_us"), data_field(c, "mad_us"))
                  .run(err);
    if (!ok) return false;
  }
  return set_launches(db, session, e, err);
}

bool apply_profile(sqlite3* db, int64_t session, const Event& e, std::string* err) {
  const json& d = e.data;
  return Stmt(db,
              "INSERT INTO profiles(session_id, attempt, launches_per_step, resources, extra) "
              "VALUES (?1, ?2, ?3, ?4, ?5)")
             .bind(session, e.attempt, data_field(d, "launches_per_step"), JsonText{data_field(d, "resources")},
                   JsonText{data_field(d, "extra")})
             .run(err) &&
         set_launches(db, session, e, err);
}

bool apply_attempt_finished(sqlite3* db, int64_t session, const Event& e, std::string* err) {
  const json& d = e.data;
  std::string outcome = data_string(d, "outcome"), decision = data_string(d, "decision");
  std::string reason = data_string(d, "reason");
  if (!is_outcome(outcome)) return fail(err, "unknown outcome '" + outcome + "'");
  if (!decision.empty() && decision != "accepted" && decision != "rolled_back")
    return fail(err, "unknown decision '" + decision + "'");
  bool updated =
      Stmt(db,
           "UPDATE attempts SET outcome = ?3, decision = ?4, reason = ?5, error = ?6, finished_at = ?7, "
           "score_us = ?8, speedup = ?9, phase_s = ?10 WHERE session_id = ?1 AND seq = ?2")
          .bind(session, e.attempt, outcome, decision, reason, data_string(d, "error"), e.wall,
                data_field(d, "score_us"), data_field(d, "speedup"), JsonText{field_or(d, "phase_s", kEmptyObject)})
          .run(err);
  if (!updated) return false;
  if (sqlite3_changes(db) == 0)
    return fail(err, "attempt " + std::to_string(e.attempt) + " finished but was never started");

  if (!decision.empty()) {
    bool ok = Stmt(db,
                   "INSERT INTO decisions(session_id, attempt, decision, reason, best_before, best_after) "
                   "VALUES (?1, ?2, ?3, ?4, ?5, ?6)")
                  .bind(session, e.attempt, decision, reason, data_field(d, "best_before"), data_field(d, "best_after"))
                  .run(err);
    if (!ok) return false;
  }
  // A baseline that ran fixes the session's baseline, and is its best until
  // a best_changed event says otherwise (so a session always has a best to
  // roll back to, even if the orchestrator announces none for the baseline).
  const json& score = data_field(d, "score_us");
  if (outcome != "ok" || !score.is_number()) return true;
  return Stmt(db,
              "UPDATE sessions SET baseline_variant = a.variant, baseline_score_us = ?3, "
              "best_variant = COALESCE(best_variant, a.variant), best_score_us = COALESCE(best_score_us, ?3), "
              "best_speedup = COALESCE(best_speedup, 1.0) "
              "FROM attempts a WHERE sessions.id = ?1 AND a.session_id = ?1 AND a.seq = ?2 AND a.purpose = 'baseline'")
      .bind(session, e.attempt, score)
      .run(err);
}

bool apply_best_changed(sqlite3* db, int64_t session, const Event& e, std::string* err) {
  const json& d = e.data;
  return Stmt(db, "UPDATE sessions SET best_variant = ?2, best_score_us = ?3, best_speedup = ?4 WHERE id = ?1")
      .bind(session, data_string(d, "variant"), data_field(d, "score_us"), data_field(d, "speedup"))
      .run(err);
}

bool apply_session_resumed(sqlite3* db, int64_t session, const Event& e, std::string* err) {
  return Stmt(db,
              "UPDATE sessions SET status = 'running', ended_at = NULL, end_reason = NULL, "
              "budget_s = budget_s + ?2 WHERE id = ?1")
      .bind(session, data_number(e.data, "budget_s"))
      .run(err);
}

bool apply_session_ended(sqlite3* db, int64_t session, const Event& e, std::string* err) {
  const json& d = e.data;
  std::string status = data_string(d, "status");
  if (status.empty()) return fail(err, "session_ended without a status");
  return Stmt(db, "UPDATE sessions SET status = ?2, ended_at = ?3, end_reason = ?4, summary = ?5 WHERE id = ?1")
      .bind(session, status, e.wall, data_string(d, "reason"), JsonText{field_or(d, "summary", kEmptyObject)})
      .run(err);
}

bool apply_llm_call(sqlite3* db, int64_t session, const Event& e, std::string* err) {
  const json& d = e.data;
  return Stmt(db,
              "INSERT INTO llm_calls(session_id, attempt, provider, model, url, prompt, reply, status, http_status, "
              "tokens_in, tokens_out, latency_s, retries, error, created_at) "
              "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)")
      .bind(session, e.attempt > 0 ? json(e.attempt) : json(), data_string(d, "provider"), data_string(d, "model"),
            data_string(d, "url"), data_string(d, "prompt"), data_string(d, "reply"), data_string(d, "status"),
            data_field(d, "http_status"), data_field(d, "tokens_in"), data_field(d, "tokens_out"),
            data_field(d, "latency_s"), data_field(d, "retries"), nullable(data_string(d, "error")), e.wall)
      .run(err);
}

bool apply_probe(sqlite3* db, int64_t session, const Event& e, std::string* err) {
  const json& d = e.data;
  return Stmt(db, "INSERT INTO probes(session_id, name, value, unit, detail) VALUES (?1, ?2, ?3, ?4, ?5)")
      .bind(session, data_string(d, "name"), data_field(d, "value"), data_string(d, "unit"),
            JsonText{data_field(d, "detail")})
      .run(err);
}

using Handler = bool (*)(sqlite3* db, int64_t session, const Event& e, std::string* err);

// The kinds with derived rows; phase and unknown kinds live in events only.
const std::map<std::string_view, Handler> kHandlers = {
    {"variant", apply_variant},
    {"attempt_started", apply_attempt_started},
    {"build", apply_build},
    {"validation", apply_validation},
    {"timing", apply_timing},
    {"profile", apply_profile},
    {"attempt_finished", apply_attempt_finished},
    {"best_changed", apply_best_changed},
    {"session_resumed", apply_session_resumed},
    {"session_ended", apply_session_ended},
    {"llm_call", apply_llm_call},
    {"probe", apply_probe},
};

bool insert_event(sqlite3* db, int64_t session, const Event& e, std::string* err) {
  return Stmt(db,
              "INSERT INTO events(session_id, seq, t, wall, kind, attempt, data) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)")
      .bind(session, e.seq, e.t, e.wall, e.kind, e.attempt, JsonText{e.data})
      .run(err);
}

// --- Reading rows -----------------------------------------------------------

// A session's device is the name in its latest "device" probe event (an
// event whose JSON is damaged is skipped rather than failing the query).
const std::string kSessionSelect =
    "SELECT s.id, s.task, s.size, s.backend, s.designer, s.status, s.started_at, s.ended_at, s.end_reason, "
    "s.budget_s, s.seed, s.info, s.summary, s.best_variant, s.best_score_us, s.best_speedup, s.baseline_variant, "
    "s.baseline_score_us, (SELECT COUNT(*) FROM attempts a WHERE a.session_id = s.id), "
    "(SELECT MAX(wall) FROM events e WHERE e.session_id = s.id), "
    "(SELECT json_extract(d, '$.detail.device') FROM (SELECT CASE WHEN json_valid(e.data) THEN e.data END AS d, "
    "e.seq FROM events e WHERE e.session_id = s.id AND e.kind = 'probe') WHERE json_extract(d, '$.name') = 'device' "
    "ORDER BY seq DESC LIMIT 1) FROM sessions s";

SessionRow read_session(const Stmt& s) {
  SessionRow r;
  r.id = s.integer(0);
  r.task = s.text(1);
  r.size = s.text(2);
  r.backend = s.text(3);
  r.designer = s.text(4);
  r.status = s.text(5);
  r.started_at = s.real(6);
  r.ended_at = s.real(7);
  r.end_reason = s.text(8);
  r.budget_s = s.real(9);
  r.seed = s.integer(10);
  r.info = s.parsed(11);
  r.summary = s.parsed(12);
  r.best_variant = s.text(13);
  r.best_score_us = s.real(14);
  r.best_speedup = s.real(15);
  r.baseline_variant = s.text(16);
  r.baseline_score_us = s.real(17);
  r.attempts = static_cast<int>(s.integer(18));
  r.last_event_at = s.real(19);
  r.device = s.text(20);
  return r;
}

const std::string kAttemptSelect =
    "SELECT session_id, seq, variant, purpose, outcome, decision, reason, error, started_at, finished_at, score_us, "
    "speedup, launches_per_step, phase_s FROM attempts";

AttemptRow read_attempt(const Stmt& s) {
  AttemptRow r;
  r.session_id = s.integer(0);
  r.seq = static_cast<int>(s.integer(1));
  r.variant = s.text(2);
  r.purpose = s.text(3);
  r.outcome = s.text(4);
  r.decision = s.text(5);
  r.reason = s.text(6);
  r.error = s.text(7);
  r.started_at = s.real(8);
  r.finished_at = s.real(9);
  r.score_us = s.real(10);
  r.speedup = s.real(11);
  r.launches_per_step = s.is_null(12) ? -1 : static_cast<int>(s.integer(12));
  r.phase_s = s.parsed(13);
  return r;
}

const std::string kVariantSelect =
    "SELECT id, template, backend, knobs, source, parent, origin, rationale, created_at FROM variants";

VariantRow read_variant(const Stmt& s) {
  VariantRow r;
  r.id = s.text(0);
  r.template_name = s.text(1);
  r.backend = s.text(2);
  r.knobs = s.parsed(3);
  r.source = s.text(4);
  r.parent = s.text(5);
  r.origin = s.text(6);
  r.rationale = s.text(7);
  r.created_at = s.real(8);
  return r;
}

Event read_event(const Stmt& s) {
  Event e;
  e.seq = s.integer(0);
  e.t = s.real(1);
  e.wall = s.real(2);
  e.kind = s.text(3);
  e.attempt = static_cast<int>(s.integer(4));
  e.data = s.parsed(5);
  return e;
}

// Every row of a query, read by `read`.
template <class Row, class Read>
bool collect(Stmt& s, Read read, std::vector<Row>* out, std::string* err) {
  out->clear();
  while (s.next()) out->push_back(read(s));
  return s.done(err);
}

}  // namespace

// --- Opening ----------------------------------------------------------------

Store::~Store() { close(); }

void Store::close() {
  if (db_) sqlite3_close_v2(db_);
  db_ = nullptr;
}

bool Store::open(const std::string& path, std::string* err) {
  close();
  if (sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) != SQLITE_OK) {
    *err = "cannot open " + path + ": " + (db_ ? sqlite3_errmsg(db_) : "out of memory");
    close();
    return false;
  }
  sqlite3_busy_timeout(db_, 5000);  // readers and the writer wait for each other's short transactions
  // What the file is gets checked before WAL mode is set, so a file that is
  // not ours is refused untouched. synchronous=NORMAL: in WAL mode a commit
  // survives the process being killed; only a power cut may lose the last ones.
  std::string why;
  int version = 0;
  bool ok = exec(db_, "PRAGMA foreign_keys = ON", &why) && read_schema_version(db_, &version, &why) &&
            check_not_newer(version, &why) && exec(db_, "PRAGMA journal_mode = WAL", &why) &&
            exec(db_, "PRAGMA synchronous = NORMAL", &why) && (version == kSchemaVersion || migrate(db_, &why));
  if (!ok) {
    *err = "cannot open " + path + ": " + why;
    close();
  }
  return ok;
}

// --- Writing ----------------------------------------------------------------

bool Store::transaction(const std::function<bool(std::string* err)>& body, std::string* err) {
  if (!db_) return fail(err, "the store is not open");
  // Outermost, BEGIN IMMEDIATE takes the write lock up front (waiting up to
  // the busy timeout), so the commit never fails on a lock upgrade. Inside
  // another transaction, a savepoint.
  const bool outermost = sqlite3_get_autocommit(db_) != 0;
  if (!exec(db_, outermost ? "BEGIN IMMEDIATE" : "SAVEPOINT nested", err)) return false;
  bool ok = false;
  try {
    ok = body(err);
  } catch (const std::exception& e) {
    *err = e.what();
  }
  if (ok) ok = exec(db_, outermost ? "COMMIT" : "RELEASE nested", err);
  if (!ok) {
    std::string ignored;  // the first error is the one to report
    exec(db_, outermost ? "ROLLBACK" : "ROLLBACK TO nested; RELEASE nested", &ignored);
  }
  return ok;
}

bool Store::create_session(const json& started, int64_t* id, std::string* err, double wall) {
  if (!started.is_object()) return fail(err, "create session: session_started data must be a JSON object");
  Event e{.seq = 1, .t = 0, .wall = wall > 0 ? wall : wall_seconds(), .kind = "session_started", .data = started};
  std::string why;
  bool ok = transaction(
      [&](std::string* terr) {
        bool inserted = Stmt(db_,
                             "INSERT INTO sessions(task, size, backend, designer, status, started_at, budget_s, seed, "
                             "info) VALUES (?1, ?2, ?3, ?4, 'running', ?5, ?6, ?7, ?8)")
                            .bind(data_string(started, "task"), data_string(started, "size"),
                                  data_string(started, "backend"), data_string(started, "designer"), e.wall,
                                  data_number(started, "budget_s"), data_int(started, "seed"), JsonText{started})
                            .run(terr);
        if (!inserted) return false;
        *id = sqlite3_last_insert_rowid(db_);
        return insert_event(db_, *id, e, terr);
      },
      &why);
  if (!ok) *err = "create session: " + why;
  return ok;
}

bool Store::record(int64_t session, const std::string& kind, int attempt, const json& data, std::string* err,
                   std::optional<double> t, std::optional<double> wall) {
  if (kind.empty()) return fail(err, "record: an event needs a kind");
  if (!data.is_object()) return fail(err, "record " + kind + ": data must be a JSON object");
  if (kind == "session_started") return fail(err, "record session_started: a session starts with create_session");
  Event e{.kind = kind, .attempt = attempt > 0 ? attempt : static_cast<int>(data_int(data, "attempt")), .data = data};
  e.wall = wall.value_or(wall_seconds());
  std::string why;
  bool ok = transaction(
      [&](std::string* terr) {
        bool found = false;
        {
          Stmt next_seq(db_,
                        "SELECT started_at, (SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE session_id = ?1) "
                        "FROM sessions WHERE id = ?1");
          if (next_seq.bind(session).next()) {
            found = true;
            e.t = t.value_or(e.wall - next_seq.real(0));
            e.seq = next_seq.integer(1);
          }
          if (!next_seq.done(terr)) return false;
        }
        if (!found) return fail(terr, "no session " + std::to_string(session));
        return insert_event(db_, session, e, terr) && apply(session, e, terr);
      },
      &why);
  if (!ok) *err = "record " + kind + ": " + why;
  return ok;
}

bool Store::apply(int64_t session, const Event& e, std::string* err) {
  auto handler = kHandlers.find(e.kind);
  return handler == kHandlers.end() || handler->second(db_, session, e, err);
}

// --- Reading ----------------------------------------------------------------

bool Store::sessions(std::vector<SessionRow>* out, std::string* err) {
  if (!db_) return fail(err, "the store is not open");
  Stmt s(db_, kSessionSelect + " ORDER BY s.id");
  return collect(s, read_session, out, err);
}

bool Store::session(int64_t id, SessionRow* out, std::string* err) {
  if (!db_) return fail(err, "the store is not open");
  Stmt s(db_, kSessionSelect + " WHERE s.id = ?1");
  bool found = s.bind(id).next();
  if (found) *out = read_session(s);
  if (!s.done(err)) return false;
  return found || fail(err, "no session " + std::to_string(id));
}

bool Store::attempts(int64_t session, std::vector<AttemptRow>* out, std::string* err) {
  if (!db_) return fail(err, "the store is not open");
  Stmt s(db_, kAttemptSelect + " WHERE session_id = ?1 ORDER BY seq");
  s.bind(session);
  return collect(s, read_attempt, out, err);
}

bool Store::variant_attempts(const std::string& variant_id, std::vector<AttemptRow>* out, std::string* err) {
  if (!db_) return fail(err, "the store is not open");
  Stmt s(db_, kAttemptSelect + " WHERE variant = ?1 ORDER BY session_id, seq");
  s.bind(variant_id);
  return collect(s, read_attempt, out, err);
}

bool Store::variant(const std::string& id_or_prefix, VariantRow* out, std::string* err) {
  if (!db_) return fail(err, "the store is not open");
  if (id_or_prefix.empty()) return fail(err, "no variant id given");
  if (id_or_prefix == "best") {
    std::vector<SessionRow> all;
    if (!sessions(&all, err)) return false;
    const SessionRow* latest = nullptr;
    for (const SessionRow& r : all)
      if (!r.best_variant.empty() && (!latest || r.id > latest->id)) latest = &r;
    if (!latest) return fail(err, "no session in the database has a best variant yet");
    return variant(latest->best_variant, out, err);
  }
  // An exact match sorts first: a full id is never ambiguous, even when it
  // is also the prefix of a longer one.
  Stmt s(db_, kVariantSelect + " WHERE substr(id, 1, length(?1)) = ?1 ORDER BY id <> ?1, id LIMIT 3");
  s.bind(id_or_prefix);
  std::vector<VariantRow> matches;
  if (!collect(s, read_variant, &matches, err)) return false;
  if (matches.empty()) return fail(err, "no variant with id or prefix '" + id_or_prefix + "'");
  if (matches.size() > 1 && matches[0].id != id_or_prefix) {
    std::string listed;
    for (const VariantRow& m : matches) listed += (listed.empty() ? "" : ", ") + m.id.substr(0, 16);
    return fail(err, "ambiguous prefix '" + id_or_prefix + "': matches " + listed +
                         (matches.size() > 2 ? ", ..." : "") + " (give more characters)");
  }
  *out = matches[0];
  return true;
}

bool Store::events(int64_t session, std::vector<Event>* out, std::string* err, const std::string& kind) {
  if (!db_) return fail(err, "the store is not open");
  Stmt s(db_,
         "SELECT seq, t, wall, kind, attempt, data FROM events WHERE session_id = ?1 AND (?2 = '' OR kind = ?2) "
         "ORDER BY seq");
  s.bind(session, kind);
  return collect(s, read_event, out, err);
}

bool Store::timings(int64_t session, int attempt, json* out, std::string* err) {
  if (!db_) return fail(err, "the store is not open");
  Stmt s(db_,
         "SELECT context, steps, warmup, samples_us, median_us, p10_us, p90_us, mad_us FROM timings "
         "WHERE session_id = ?1 AND attempt = ?2 ORDER BY rowid");
  s.bind(session, attempt);
  *out = json::array();
  while (s.next()) {
    out->push_back({{"context", s.value(0)},
                    {"steps", s.value(1)},
                    {"warmup", s.value(2)},
                    {"samples_us", s.parsed(3, kEmptyArray)},
                    {"median_us", s.value(4)},
                    {"p10_us", s.value(5)},
                    {"p90_us", s.value(6)},
                    {"mad_us", s.value(7)}});
  }
  return s.done(err);
}

bool Store::judged_attempts(const std::string& task, const std::string& backend, const std::string& size,
                            std::vector<AttemptRow>* out, std::string* err) {
  if (!db_) return fail(err, "the store is not open");
  Stmt s(db_, kAttemptSelect +
                  " a WHERE a.outcome NOT IN ('', 'interrupted') AND a.session_id IN "
                  "(SELECT id FROM sessions WHERE task = ?1 AND backend = ?2 AND size = ?3) ORDER BY a.session_id, a.seq");
  s.bind(task, backend, size);
  return collect(s, read_attempt, out, err);
}

// --- JSON forms of the rows -------------------------------------------------

void to_json(json& j, const Event& e) {
  j = {{"seq", e.seq}, {"t", e.t}, {"wall", e.wall}, {"kind", e.kind}, {"attempt", e.attempt}, {"data", e.data}};
}

void to_json(json& j, const SessionRow& r) {
  j = {{"id", r.id},
       {"task", r.task},
       {"size", r.size},
       {"backend", r.backend},
       {"designer", r.designer},
       {"status", r.status},
       {"started_at", r.started_at},
       {"ended_at", r.ended_at},
       {"end_reason", r.end_reason},
       {"budget_s", r.budget_s},
       {"seed", r.seed},
       {"best_variant", r.best_variant},
       {"best_score_us", r.best_score_us},
       {"best_speedup", r.best_speedup},
       {"baseline_variant", r.baseline_variant},
       {"baseline_score_us", r.baseline_score_us},
       {"last_event_at", r.last_event_at},
       {"attempts", r.attempts},
       {"device", r.device},
       {"info", r.info},
       {"summary", r.summary}};
}

void to_json(json& j, const VariantRow& r) {
  j = {{"id", r.id},         {"template", r.template_name}, {"backend", r.backend},
       {"knobs", r.knobs},   {"source", r.source},          {"parent", r.parent},
       {"origin", r.origin}, {"rationale", r.rationale},    {"created_at", r.created_at}};
}

void to_json(json& j, const AttemptRow& r) {
  j = {{"session_id", r.session_id},
       {"seq", r.seq},
       {"variant", r.variant},
       {"purpose", r.purpose},
       {"outcome", r.outcome},
       {"decision", r.decision},
       {"reason", r.reason},
       {"error", r.error},
       {"started_at", r.started_at},
       {"finished_at", r.finished_at},
       {"score_us", r.score_us},
       {"speedup", r.speedup},
       {"launches_per_step", r.launches_per_step},
       {"phase_s", r.phase_s}};
}

}  // namespace ktune::traces
