// Reports over the store and trace files, as text tables or JSON: what
// `ktune history`, `show`, `compare` and `replay` print. Pure functions of
// the data: the command line only opens the store and prints the string.
#pragma once
#include <optional>
#include <string>

#include "traces/store.h"
#include "traces/trace_file.h"

namespace ktune::traces {

// Without `session`: one row per session (id, task, size, backend, designer,
// status, started, wall time, attempts, best speedup). With it: that
// session's attempts (seq, variant, outcome, decision, reason, score).
bool history_report(Store& store, std::optional<int64_t> session, bool as_json, std::string* out, std::string* err);
// A variant: knobs, origin and rationale, parent chain up to its root, every
// attempt of it with its measurements, and its rendered source.
bool show_report(Store& store, const std::string& variant, bool as_json, std::string* out, std::string* err);
// Two sessions side by side: best time, speedup over baseline, attempts by
// outcome, accepted / rolled back, time to reach the best, wall time.
bool compare_report(Store& store, int64_t a, int64_t b, bool as_json, std::string* out, std::string* err);
// A session's timeline phase by phase: the measure phase and its probes,
// every attempt with its decision and reason, time per phase, and the
// best-so-far speedup over time.
bool replay_report(const TraceFile& trace, bool as_json, std::string* out, std::string* err);
// The best-so-far speedup over time as a standalone SVG plot.
bool replay_svg(const TraceFile& trace, std::string* svg, std::string* err);

}  // namespace ktune::traces
