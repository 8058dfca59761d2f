// Reports for `ktune history`, `show`, `compare` and `replay`. Each report
// first gathers its numbers (as JSON when it has any computing to do), then
// either prints that JSON or lays it out as compact aligned text, so the two
// forms always carry the same values.
#include "traces/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <set>

#include "base/text.h"

namespace ktune::traces {
namespace {

// --- Formatting -------------------------------------------------------------

// Microseconds per step; small kernels get a second decimal. "-" when unmeasured.
std::string us_text(double us) {
  if (us <= 0) return "-";
  return us < 10 ? formatted("%.2f", us) : formatted("%.1f", us);
}

std::string speedup_text(double speedup) { return speedup > 0 ? formatted("%.2fx", speedup) : "-"; }

// Seconds since the session started as mm:ss (minutes keep counting past 59).
std::string mmss(double t) {
  int s = static_cast<int>(std::max(0.0, t));
  return formatted("%02d:%02d", s / 60, s % 60);
}

// Local time, to the minute.
std::string date_text(double wall) {
  if (wall <= 0) return "-";
  std::time_t t = static_cast<std::time_t>(wall);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M", &tm);
  return buf;
}

std::string number_text(const json& v) {
  if (v.is_number()) return formatted("%.6g", v.get<double>());
  return v.is_string() ? v.get<std::string>() : v.is_null() ? "-" : json_text(v);
}

// On one line (a reason or rationale may hold newlines), at most `max` bytes.
std::string one_line(const std::string& s, size_t max) {
  std::string line = s;
  std::replace_if(
      line.begin(), line.end(), [](char c) { return c == '\n' || c == '\r' || c == '\t'; }, ' ');
  if (line.size() <= max) return line;
  size_t cut = max - 3;
  while (cut > 0 && (static_cast<unsigned char>(line[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 character
  return line.substr(0, cut) + "...";
}

std::string short_id(const std::string& id) { return id.substr(0, 12); }

std::string or_dash(const std::string& s) { return s.empty() ? "-" : s; }

// Characters on screen, not bytes (UTF-8 continuation bytes do not count).
size_t display_width(const std::string& s) {
  return std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
}

// A text table: a header row, then rows; columns two spaces apart, numbers
// right-aligned.
struct Column {
  std::string name;
  bool right = false;
};

class Table {
 public:
  explicit Table(std::vector<Column> columns) : columns_(std::move(columns)) {}
  void add(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  std::string render(const std::string& indent = "") const {
    std::vector<size_t> width(columns_.size());
    for (size_t c = 0; c < columns_.size(); ++c) {
      width[c] = display_width(columns_[c].name);
      for (const auto& row : rows_) width[c] = std::max(width[c], display_width(row[c]));
    }
    std::string out;
    auto line = [&](auto cell_of) {
      std::string text = indent;
      for (size_t c = 0; c < columns_.size(); ++c) {
        std::string cell = cell_of(c);
        std::string pad(width[c] - display_width(cell), ' ');
        text += (c ? "  " : "") + (columns_[c].right ? pad + cell : cell + pad);
      }
      text.erase(text.find_last_not_of(' ') + 1);
      out += text + "\n";
    };
    line([&](size_t c) { return columns_[c].name; });
    for (const auto& row : rows_) line([&](size_t c) { return row[c]; });
    return out;
  }

 private:
  std::vector<Column> columns_;
  std::vector<std::vector<std::string>> rows_;
};

// The entries of `values`: those named in `first`, in that order, then the
// others by name (outcomes in the order of kOutcomes, phases in the loop's).
template <class Value, class Names>
std::vector<std::pair<std::string, Value>> in_order(std::map<std::string, Value> values, const Names& first) {
  std::vector<std::pair<std::string, Value>> ordered;
  for (const char* name : first) {
    auto it = values.find(name);
    if (it == values.end()) continue;
    ordered.push_back(*it);
    values.erase(it);
  }
  ordered.insert(ordered.end(), values.begin(), values.end());
  return ordered;
}

std::string outcome_text(const std::string& outcome) { return outcome.empty() ? "(in flight)" : outcome; }

// --- Knobs ------------------------------------------------------------------

// The knobs that differ from the parent's: new or changed values, and the
// removed ones as null. Without a parent, all of them.
json knob_changes(const json& knobs, const json& parent_knobs) {
  json changes = json::object();
  if (knobs.is_object())
    for (const auto& [name, value] : knobs.items())
      if (data_field(parent_knobs, name.c_str()) != value) changes[name] = value;
  if (parent_knobs.is_object())
    for (const auto& [name, value] : parent_knobs.items())
      if (data_field(knobs, name.c_str()).is_null() && !value.is_null()) changes[name] = nullptr;
  return changes;
}

// "tile=64 stages=3 -split": strings unquoted, a removed knob as -name.
std::string knobs_text(const json& knobs) {
  std::string out;
  if (!knobs.is_object()) return out;
  for (const auto& [name, value] : knobs.items()) {
    if (!out.empty()) out += ' ';
    out +=
        value.is_null() ? "-" + name : name + "=" + (value.is_string() ? value.get<std::string>() : json_text(value));
  }
  return out;
}

// --- Sessions ---------------------------------------------------------------

// Wall time from start to end, or to the latest event of a session that is
// running or was killed.
double session_wall_s(const SessionRow& r) {
  double end = r.ended_at > 0 ? r.ended_at : r.last_event_at;
  return std::max(0.0, end - r.started_at);
}

std::string workload_text(const SessionRow& r) { return r.task + "/" + r.size + "/" + r.backend; }

json session_summary(const SessionRow& r) {
  return {{"id", r.id},
          {"task", r.task},
          {"size", r.size},
          {"backend", r.backend},
          {"device", r.device},
          {"designer", r.designer},
          {"status", r.status},
          {"started_at", r.started_at},
          {"wall_s", session_wall_s(r)},
          {"attempts", r.attempts},
          {"best_variant", r.best_variant},
          {"best_score_us", r.best_score_us},
          {"baseline_score_us", r.baseline_score_us},
          {"best_speedup", r.best_speedup}};
}

bool sessions_report(Store& store, bool as_json, std::string* out, std::string* err) {
  std::vector<SessionRow> rows;
  if (!store.sessions(&rows, err)) return false;
  if (as_json) {
    json list = json::array();
    for (const SessionRow& r : rows) list.push_back(session_summary(r));
    *out = json_text({{"sessions", list}}, 2) + "\n";
    return true;
  }
  if (rows.empty()) {
    *out = "no sessions yet\n";
    return true;
  }
  Table table({{"id", true},
               {"task"},
               {"size"},
               {"backend"},
               {"device"},
               {"designer"},
               {"status"},
               {"started"},
               {"wall", true},
               {"attempts", true},
               {"best us", true},
               {"speedup", true}});
  for (const SessionRow& r : rows)
    table.add({std::to_string(r.id), r.task, r.size, r.backend, r.device.empty() ? "-" : r.device, r.designer, r.status,
               date_text(r.started_at),
               duration_text(session_wall_s(r)), std::to_string(r.attempts), us_text(r.best_score_us),
               speedup_text(r.best_speedup)});
  *out = table.render();
  return true;
}

bool session_attempts_report(Store& store, int64_t id, bool as_json, std::string* out, std::string* err) {
  SessionRow r;
  std::vector<AttemptRow> attempts;
  if (!store.session(id, &r, err) || !store.attempts(id, &attempts, err)) return false;
  if (as_json) {
    *out = json_text({{"session", r}, {"attempts", attempts}}, 2) + "\n";
    return true;
  }
  *out = "session " + std::to_string(r.id) + "  " + workload_text(r) + (r.device.empty() ? "" : " on " + r.device) +
         "  designer " + r.designer + "  " + r.status +
         (r.end_reason.empty() ? "" : " (" + r.end_reason + ")") + "\n";
  *out += "started " + date_text(r.started_at) + "  wall " + duration_text(session_wall_s(r)) + "  baseline " +
          us_text(r.baseline_score_us) + " us  best " + us_text(r.best_score_us) + " us (" +
          speedup_text(r.best_speedup) + ", " + or_dash(short_id(r.best_variant)) + ")\n\n";
  Table table({{"seq", true},
               {"variant"},
               {"purpose"},
               {"outcome"},
               {"decision"},
               {"score_us", true},
               {"speedup", true},
               {"reason"}});
  for (const AttemptRow& a : attempts)
    table.add({std::to_string(a.seq), short_id(a.variant), a.purpose, outcome_text(a.outcome), or_dash(a.decision),
               us_text(a.score_us), speedup_text(a.speedup), one_line(a.reason, 60)});
  *out += table.render();
  return true;
}

// --- Compare ----------------------------------------------------------------

// The numbers compare_report sets side by side.
bool session_metrics(Store& store, int64_t id, json* metrics, std::string* err) {
  SessionRow r;
  std::vector<AttemptRow> attempts;
  std::vector<Event> best_changes;
  if (!store.session(id, &r, err) || !store.attempts(id, &attempts, err) ||
      !store.events(id, &best_changes, err, "best_changed"))
    return false;
  std::map<std::string, int> by_outcome;
  int accepted = 0, rolled_back = 0;
  for (const AttemptRow& a : attempts) {
    ++by_outcome[a.outcome.empty() ? "in_flight" : a.outcome];
    accepted += a.decision == "accepted";
    rolled_back += a.decision == "rolled_back";
  }
  double wall_s = session_wall_s(r);
  *metrics = {{"session", r.id},
              {"task", r.task},
              {"size", r.size},
              {"backend", r.backend},
              {"device", r.device},
              {"designer", r.designer},
              {"status", r.status},
              {"wall_s", wall_s},
              {"attempts", attempts.size()},
              {"by_outcome", by_outcome},
              {"accepted", accepted},
              {"rolled_back", rolled_back},
              {"baseline_us", r.baseline_score_us},
              {"best_us", r.best_score_us},
              {"best_speedup", r.best_speedup},
              // The last best_changed set the final best; null when the
              // baseline stayed the best.
              {"time_to_best_s", best_changes.empty() ? json() : json(best_changes.back().t)},
              {"attempts_per_hour", wall_s > 0 ? attempts.size() * 3600.0 / wall_s : 0.0}};
  return true;
}

std::string compare_text(const json& a, const json& b) {
  Table table({{""}, {"session " + data_string(a, "session")}, {"session " + data_string(b, "session")}});
  auto row = [&](const std::string& label, auto text_of) { table.add({label, text_of(a), text_of(b)}); };
  auto field = [](const char* key) { return [key](const json& m) { return data_string(m, key); }; };
  row("task/size/backend", [](const json& m) {
    return data_string(m, "task") + "/" + data_string(m, "size") + "/" + data_string(m, "backend");
  });
  row("device", field("device"));
  row("designer", field("designer"));
  row("status", field("status"));
  row("wall time", [](const json& m) { return duration_text(data_number(m, "wall_s")); });
  row("attempts", field("attempts"));
  std::map<std::string, int> outcomes;
  for (const json* m : {&a, &b})
    for (const auto& [outcome, n] : data_field(*m, "by_outcome").items()) outcomes[outcome] += n.get<int>();
  for (const auto& [outcome, n] : in_order(outcomes, kOutcomes))
    row("  " + outcome,
        [&](const json& m) { return std::to_string(data_int(data_field(m, "by_outcome"), outcome.c_str())); });
  row("accepted", field("accepted"));
  row("rolled back", field("rolled_back"));
  row("baseline us", [](const json& m) { return us_text(data_number(m, "baseline_us")); });
  row("best us", [](const json& m) { return us_text(data_number(m, "best_us")); });
  row("best speedup", [](const json& m) { return speedup_text(data_number(m, "best_speedup")); });
  row("time to best", [](const json& m) {
    const json& t = data_field(m, "time_to_best_s");
    return t.is_number() ? duration_text(t.get<double>()) : std::string("-");
  });
  row("attempts per hour", [](const json& m) { return formatted("%.1f", data_number(m, "attempts_per_hour")); });
  return table.render();
}

// --- Replay -----------------------------------------------------------------

// One attempt as replay shows it.
struct AttemptLine {
  double t = 0;  // when it was decided (when it started, if it never finished)
  int attempt = 0;
  std::string variant, origin, purpose, outcome, decision, reason;
  json changes = json::object();  // its knobs that differ from its parent's
  double score_us = 0;
  double best_speedup = 0;  // best so far once it was decided
};

// A change of the session's best.
struct BestPoint {
  double t = 0;
  int attempt = 0;
  double speedup = 0;
  std::string variant;
  double score_us = 0;
};


// A session's story, gathered from its events in one pass.
struct Timeline {
  json started = json::object();  // the session_started data
  double started_wall = 0, budget_s = 0, end_t = 0;
  std::string status = "running", end_reason;
  json probes = json::array();
  json baseline;  // {variant, score_us, attempt}, null until the baseline ran
  std::vector<AttemptLine> attempts;
  std::vector<std::pair<std::string, double>> phase_s;  // in the loop's order
  std::map<std::string, int> outcomes;
  std::vector<BestPoint> best;
};

Timeline build_timeline(const TraceFile& trace) {
  struct VariantInfo {
    std::string origin, parent;
    json knobs;
  };
  Timeline tl;
  std::map<std::string, VariantInfo> variants;
  std::map<int, size_t> line_of_attempt;
  std::map<std::string, double> phase_begin, session_phases, attempt_phases;
  int last_finished = 0;
  for (const Event& e : trace.events) {
    tl.end_t = std::max(tl.end_t, e.t);
    const json& d = e.data;
    if (e.kind == "session_started") {
      tl.started = d;
      tl.started_wall = e.wall;
      tl.budget_s = data_number(d, "budget_s");
    } else if (e.kind == "session_resumed") {
      tl.budget_s += data_number(d, "budget_s");
      tl.status = "running";
    } else if (e.kind == "session_ended") {
      tl.status = data_string(d, "status");
      tl.end_reason = data_string(d, "reason");
    } else if (e.kind == "phase") {
      std::string name = data_string(d, "name"), state = data_string(d, "state");
      if (state == "begin") phase_begin[name] = e.t;
      if (state == "end") {
        auto begin = phase_begin.find(name);
        session_phases[name] += data_number(d, "seconds", begin == phase_begin.end() ? 0 : e.t - begin->second);
      }
    } else if (e.kind == "probe") {
      tl.probes.push_back(
          {{"name", data_string(d, "name")}, {"value", data_field(d, "value")}, {"unit", data_string(d, "unit")}});
    } else if (e.kind == "variant") {
      variants[data_string(d, "id")] = {data_string(d, "origin"), data_string(d, "parent"), data_field(d, "knobs")};
    } else if (e.kind == "attempt_started") {
      AttemptLine line;
      line.t = e.t;
      line.attempt = e.attempt;
      line.variant = data_string(d, "variant");
      line.purpose = data_string(d, "purpose");
      if (auto v = variants.find(line.variant); v != variants.end()) {
        auto parent = variants.find(v->second.parent);
        line.origin = v->second.origin;
        line.changes = knob_changes(v->second.knobs, parent == variants.end() ? json::object() : parent->second.knobs);
      }
      line_of_attempt[e.attempt] = tl.attempts.size();
      tl.attempts.push_back(std::move(line));
    } else if (e.kind == "attempt_finished") {
      auto it = line_of_attempt.find(e.attempt);
      if (it == line_of_attempt.end()) continue;
      AttemptLine& line = tl.attempts[it->second];
      line.t = e.t;
      line.outcome = data_string(d, "outcome");
      line.decision = data_string(d, "decision");
      line.reason = data_string(d, "reason");
      line.score_us = data_number(d, "score_us");
      last_finished = e.attempt;
      ++tl.outcomes[line.outcome];
      const json& phase_s = data_field(d, "phase_s");
      if (phase_s.is_object())
        for (const auto& [phase, seconds] : phase_s.items())
          if (seconds.is_number()) attempt_phases[phase] += seconds.get<double>();
      // As in the store: a baseline that ran is the first best (speedup 1).
      if (line.purpose == "baseline" && line.outcome == "ok" && line.score_us > 0) {
        tl.baseline = {{"variant", line.variant}, {"score_us", line.score_us}, {"attempt", line.attempt}};
        if (tl.best.empty()) tl.best.push_back({e.t, e.attempt, 1.0, line.variant, line.score_us});
      }
    } else if (e.kind == "best_changed") {
      tl.best.push_back({e.t, e.attempt > 0 ? e.attempt : last_finished, data_number(d, "speedup"),
                         data_string(d, "variant"), data_number(d, "score_us")});
    }
  }
  // Session phases (phase events) and attempt phases (phase_s) together;
  // where both name a phase, the attempts' own account wins.
  for (const auto& [name, seconds] : session_phases) attempt_phases.try_emplace(name, seconds);
  tl.phase_s = in_order(attempt_phases, kPhaseOrder);
  // An attempt's best so far is the latest best set by it or an earlier one
  // (the best_changed event may come just before or after its attempt_finished).
  for (AttemptLine& line : tl.attempts)
    for (const BestPoint& p : tl.best)
      if (p.attempt <= line.attempt) line.best_speedup = p.speedup;
  return tl;
}

json best_point_json(const BestPoint& p) {
  return {{"t", p.t}, {"attempt", p.attempt}, {"speedup", p.speedup}, {"variant", p.variant}, {"score_us", p.score_us}};
}

json timeline_json(const Timeline& tl) {
  json attempts = json::array(), best_series = json::array();
  for (const AttemptLine& a : tl.attempts)
    attempts.push_back({{"t", a.t},
                        {"attempt", a.attempt},
                        {"variant", a.variant},
                        {"origin", a.origin},
                        {"purpose", a.purpose},
                        {"changes", a.changes},
                        {"outcome", a.outcome},
                        {"decision", a.decision},
                        {"score_us", a.score_us},
                        {"best_speedup", a.best_speedup},
                        {"reason", a.reason}});
  for (const BestPoint& p : tl.best) best_series.push_back(best_point_json(p));
  json phases = json::object();
  for (const auto& [name, seconds] : tl.phase_s) phases[name] = seconds;
  const json& s = tl.started;
  return {{"session",
           {{"task", data_string(s, "task")},
            {"size", data_string(s, "size")},
            {"backend", data_string(s, "backend")},
            {"designer", data_string(s, "designer")},
            {"budget_s", tl.budget_s},
            {"started_at", tl.started_wall},
            {"duration_s", tl.end_t},
            {"status", tl.status},
            {"end_reason", tl.end_reason}}},
          {"probes", tl.probes},
          {"baseline", tl.baseline},
          {"attempts", attempts},
          {"phase_s", phases},
          {"outcomes", tl.outcomes},
          {"best_series", best_series},
          {"best", tl.best.empty() ? json() : best_point_json(tl.best.back())}};
}

// The best speedup at time t (0 before there is one).
double best_at(const Timeline& tl, double t) {
  double best = 0;
  for (const BestPoint& p : tl.best)
    if (p.t <= t) best = p.speedup;
  return best;
}

// The best-so-far speedup over the session as block characters, lowest
// block = lowest best.
std::string sparkline(const Timeline& tl, int width = 48) {
  static const char* kBlocks[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  double lo = 1e300, hi = 0;
  for (const BestPoint& p : tl.best) lo = std::min(lo, p.speedup), hi = std::max(hi, p.speedup);
  std::string line;
  for (int i = 0; i < width; ++i) {
    double best = best_at(tl, tl.end_t * i / (width - 1));
    if (best <= 0) {
      line += ' ';
      continue;
    }
    int level = hi > lo ? static_cast<int>(std::lround((best - lo) / (hi - lo) * 7)) : 0;
    line += kBlocks[std::clamp(level, 0, 7)];
  }
  return line;
}

std::string timeline_text(const Timeline& tl) {
  const json& s = tl.started;
  std::string out = "replay  " + data_string(s, "task") + " " + data_string(s, "size") + " on " +
                    data_string(s, "backend") + ", designer " + data_string(s, "designer") + "\n";
  out += "started " + date_text(tl.started_wall) + ", budget " + duration_text(tl.budget_s) + ", ran " +
         duration_text(tl.end_t) + ", " + tl.status + (tl.end_reason.empty() ? "" : " (" + tl.end_reason + ")") + "\n";

  auto measure = std::find_if(tl.phase_s.begin(), tl.phase_s.end(), [](const auto& p) { return p.first == "measure"; });
  out +=
      "\nmeasure" + (measure == tl.phase_s.end() ? std::string() : " (" + duration_text(measure->second) + ")") + "\n";
  if (!tl.probes.empty()) {
    Table probes({{"probe"}, {"value", true}, {"unit"}});
    for (const json& p : tl.probes)
      probes.add({data_string(p, "name"), number_text(data_field(p, "value")), data_string(p, "unit")});
    out += probes.render("  ");
  }
  if (tl.baseline.is_null())
    out += "  baseline: none measured\n";
  else
    out += "  baseline " + short_id(data_string(tl.baseline, "variant")) + "  " +
           us_text(data_number(tl.baseline, "score_us")) + " us  (attempt " + data_string(tl.baseline, "attempt") +
           ")\n";

  out += "\nattempts\n";
  Table attempts({{"t", true},
                  {"#", true},
                  {"variant"},
                  {"origin"},
                  {"changes"},
                  {"outcome"},
                  {"decision"},
                  {"score_us", true},
                  {"best", true},
                  {"reason"}});
  for (const AttemptLine& a : tl.attempts)
    attempts.add({mmss(a.t), std::to_string(a.attempt), short_id(a.variant), or_dash(a.origin),
                  or_dash(one_line(knobs_text(a.changes), 40)), outcome_text(a.outcome), or_dash(a.decision),
                  us_text(a.score_us), speedup_text(a.best_speedup), one_line(a.reason, 60)});
  out += attempts.render("  ");

  out += "\ntime per phase\n";
  Table phases({{"phase"}, {"time", true}, {"share", true}});
  for (const auto& [name, seconds] : tl.phase_s)
    phases.add({phase_part(name) ? std::string("  of it, ") + phase_part(name)->label : name, duration_text(seconds),
                tl.end_t > 0 ? formatted("%.0f%%", 100 * seconds / tl.end_t) : "-"});
  out += phases.render("  ");

  out += "\noutcomes ";
  std::string separator = " ";
  for (const auto& [outcome, n] : in_order(tl.outcomes, kOutcomes)) {
    out += separator + outcome + " " + std::to_string(n);
    separator = ", ";
  }
  out += "\nbest     ";
  if (tl.best.empty()) return out + " none\n";
  return out + " " + speedup_text(tl.best.front().speedup) + " " + sparkline(tl) + " " +
         speedup_text(tl.best.back().speedup) + "  (00:00 to " + mmss(tl.end_t) + ")\n";
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace

bool history_report(Store& store, std::optional<int64_t> session, bool as_json, std::string* out, std::string* err) {
  return session ? session_attempts_report(store, *session, as_json, out, err)
                 : sessions_report(store, as_json, out, err);
}

bool show_report(Store& store, const std::string& variant, bool as_json, std::string* out, std::string* err) {
  VariantRow v;
  if (!store.variant(variant, &v, err)) return false;

  // The lineage, this variant first, each step with its knob changes.
  json lineage = json::array();
  std::set<std::string> seen;  // a cycle would be a bug elsewhere; do not loop on it
  for (VariantRow step = v;;) {
    VariantRow parent;
    std::string ignored;
    bool have_parent = !step.parent.empty() && seen.insert(step.id).second &&
                       store.variant(step.parent, &parent, &ignored) && parent.id == step.parent;
    json entry = {{"id", step.id},
                  {"origin", step.origin},
                  {"changes", knob_changes(step.knobs, have_parent ? parent.knobs : json::object())}};
    if (!step.parent.empty() && !have_parent) entry["missing_parent"] = step.parent;
    lineage.push_back(entry);
    if (!have_parent) break;
    step = parent;
  }

  std::vector<AttemptRow> attempt_rows;
  if (!store.variant_attempts(v.id, &attempt_rows, err)) return false;
  json attempts = json::array();
  for (const AttemptRow& a : attempt_rows) {
    json timings, medians = json::array();
    if (!store.timings(a.session_id, a.seq, &timings, err)) return false;
    for (const json& t : timings)
      medians.push_back({{"context", data_field(t, "context")},
                         {"median_us", data_field(t, "median_us")},
                         {"p10_us", data_field(t, "p10_us")},
                         {"p90_us", data_field(t, "p90_us")}});
    json entry = a;
    entry["medians"] = medians;
    attempts.push_back(entry);
  }

  if (as_json) {
    *out = json_text({{"variant", v}, {"lineage", lineage}, {"attempts", attempts}}, 2) + "\n";
    return true;
  }
  *out = "variant    " + v.id + "\n";
  *out += "template   " + v.template_name + " (" + v.backend + ")\n";
  *out += "origin     " + or_dash(v.origin) + ", created " + date_text(v.created_at) + "\n";
  *out += "rationale  " + or_dash(one_line(v.rationale, 200)) + "\n";
  *out += "knobs      " + or_dash(knobs_text(v.knobs)) + "\n";

  *out += "\nlineage (this variant first; knob changes from each one's parent)\n";
  Table chain({{"variant"}, {"origin"}, {"changes"}});
  for (const json& step : lineage) {
    std::string changes = knobs_text(data_field(step, "changes"));
    if (step.contains("missing_parent"))
      changes += " (parent " + short_id(data_string(step, "missing_parent")) + " not in this database)";
    chain.add({short_id(data_string(step, "id")), or_dash(data_string(step, "origin")), or_dash(changes)});
  }
  *out += chain.render("  ");

  *out += "\nattempts\n";
  if (attempts.empty())
    *out += "  none\n";
  else {
    Table table({{"session", true},
                 {"seq", true},
                 {"purpose"},
                 {"outcome"},
                 {"decision"},
                 {"score_us", true},
                 {"launches", true},
                 {"median us per context"}});
    for (const json& a : attempts) {
      std::string medians;
      for (const json& m : data_field(a, "medians"))
        medians += (medians.empty() ? "" : "  ") + number_text(data_field(m, "context")) + ": " +
                   us_text(data_number(m, "median_us"));
      int64_t launches = data_int(a, "launches_per_step", -1);
      table.add({data_string(a, "session_id"), data_string(a, "seq"), data_string(a, "purpose"),
                 outcome_text(data_string(a, "outcome")), or_dash(data_string(a, "decision")),
                 us_text(data_number(a, "score_us")), launches < 0 ? "-" : std::to_string(launches), or_dash(medians)});
    }
    *out += table.render("  ");
  }
  *out += "\nsource\n" + v.source + (v.source.empty() || v.source.back() == '\n' ? "" : "\n");
  return true;
}

bool compare_report(Store& store, int64_t a, int64_t b, bool as_json, std::string* out, std::string* err) {
  json ma, mb;
  if (!session_metrics(store, a, &ma, err) || !session_metrics(store, b, &mb, err)) return false;
  *out = as_json ? json_text({{"a", ma}, {"b", mb}}, 2) + "\n" : compare_text(ma, mb);
  return true;
}

bool replay_report(const TraceFile& trace, bool as_json, std::string* out, std::string* err) {
  if (trace.events.empty()) {
    *err = "replay: the trace has no events";
    return false;
  }
  Timeline tl = build_timeline(trace);
  *out = as_json ? json_text(timeline_json(tl), 2) + "\n" : timeline_text(tl);
  return true;
}

bool replay_svg(const TraceFile& trace, std::string* svg, std::string* err) {
  if (trace.events.empty()) {
    *err = "replay: the trace has no events";
    return false;
  }
  Timeline tl = build_timeline(trace);
  const double width = 720, height = 360, left = 64, right = 24, top = 40, bottom = 52;
  const double minutes = std::max(tl.end_t / 60, 1.0 / 60);
  double lo = 1e300, hi = 0;
  for (const BestPoint& p : tl.best) lo = std::min(lo, p.speedup), hi = std::max(hi, p.speedup);
  if (tl.best.empty()) lo = hi = 1;
  const double pad = std::max((hi - lo) * 0.08, 0.05);
  lo = std::max(0.0, lo - pad), hi += pad;
  auto x = [&](double t) { return left + t / 60 / minutes * (width - left - right); };
  auto y = [&](double speedup) { return height - bottom - (speedup - lo) / (hi - lo) * (height - top - bottom); };

  const json& s = tl.started;
  std::string title = data_string(s, "task") + " " + data_string(s, "size") + " on " + data_string(s, "backend") +
                      ", designer " + data_string(s, "designer") + ": best speedup over time";
  std::string out = formatted(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      width, height, width, height);
  out += formatted("<text x=\"%.1f\" y=\"22\" font-size=\"13\">%s</text>\n", left, xml_escape(title).c_str());
  // Axes, ticks and their labels.
  out += formatted("<path d=\"M %.1f %.1f V %.1f H %.1f\" fill=\"none\" stroke=\"black\"/>\n", left, top, height - bottom,
                width - right);
  for (int i = 0; i <= 5; ++i) {
    double tx = x(minutes * 60 * i / 5), sy = lo + (hi - lo) * i / 5;
    out += formatted("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", tx, height - bottom, tx,
                  height - bottom + 4);
    out += formatted("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.1f</text>\n", tx, height - bottom + 16,
                  minutes * i / 5);
    out += formatted("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", left, y(sy),
                  width - right, y(sy));
    out += formatted("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.2fx</text>\n", left - 6, y(sy) + 4, sy);
  }
  out += formatted("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">minutes since start</text>\n",
                (left + width - right) / 2, height - 14);
  out +=
      formatted("<text transform=\"translate(16 %.1f) rotate(-90)\" text-anchor=\"middle\">speedup over baseline</text>\n",
             (top + height - bottom) / 2);
  // The best so far as a step line to the end of the session, and a dot per accepted attempt.
  if (tl.best.empty()) {
    out += formatted("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">no best recorded</text>\n",
                  (left + width - right) / 2, (top + height - bottom) / 2);
  } else {
    std::string path = formatted("M %.1f %.1f", x(tl.best[0].t), y(tl.best[0].speedup));
    for (size_t i = 1; i < tl.best.size(); ++i)
      path += formatted(" H %.1f V %.1f", x(tl.best[i].t), y(tl.best[i].speedup));
    path += formatted(" H %.1f", x(tl.end_t));
    out += "<path d=\"" + path + "\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\"/>\n";
  }
  for (const AttemptLine& a : tl.attempts)
    if (a.decision == "accepted")
      out += formatted(
          "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"#d62728\"><title>attempt %d %s: %.2fx</title></circle>\n",
          x(a.t), y(a.best_speedup), a.attempt, xml_escape(short_id(a.variant)).c_str(), a.best_speedup);
  *svg = out + "</svg>\n";
  return true;
}

}  // namespace ktune::traces
