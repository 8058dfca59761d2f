#include "agent/progress.h"

#include <cstdio>

#include "base/text.h"
#include "traces/events.h"

namespace ktune::agent {

namespace {
std::string knob_text(const json& knobs) {
  std::string out;
  for (auto& [k, v] : knobs.items()) out += (out.empty() ? "" : " ") + k + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
  return out;
}
}  // namespace

void Progress::header(int64_t session, const SessionOptions& o, bool resumed) {
  if (quiet_) return;
  const std::string limit = o.max_attempts > 0 ? formatted(" or %d attempts", o.max_attempts) : "";
  std::printf("ktune session %lld%s: %s %s on %s, designer %s, budget %s%s, db %s\n", (long long)session,
              resumed ? " (resumed)" : "", o.task.c_str(), o.size.c_str(), o.backend.c_str(), o.designer.c_str(),
              duration_text(o.budget_s).c_str(), limit.c_str(), o.db.c_str());
  std::fflush(stdout);
}

void Progress::note(const std::string& text) {
  if (quiet_) return;
  std::printf("  %s\n", text.c_str());
  std::fflush(stdout);
}

void Progress::probes(const json& probes) {
  if (quiet_) return;
  std::string line;
  for (const json& p : probes) {
    line += (line.empty() ? "" : " | ") + formatted("%s %.4g %s", p.value("name", "").c_str(), p.value("value", 0.0),
                                                    p.value("unit", "").c_str());
  }
  std::printf("[measure] %s\n", line.c_str());
  std::fflush(stdout);
}

void Progress::attempt(double t, const AttemptView& a, const Measurement& m, double baseline_us) {
  if (quiet_) return;
  const std::string head = formatted("[%s] #%-3d %-9s %s", duration_text(t).c_str(), a.seq, a.origin.c_str(),
                                     a.variant.substr(0, 12).c_str());
  if (a.outcome == "ok") {
    std::printf("%s  ok %9.1f us  %5.2fx  %-11s launches %d  %s\n", head.c_str(), a.score_us,
                baseline_us > 0 ? baseline_us / a.score_us : 0.0, a.decision.c_str(), m.launches,
                knob_text(a.knobs).c_str());
  } else {
    std::string err = a.error.size() > 140 ? a.error.substr(0, 140) + "..." : a.error;
    std::printf("%s  %s: %s\n", head.c_str(), a.outcome.c_str(), err.c_str());
  }
  std::fflush(stdout);
}

void Progress::summary(int64_t session, const std::string& status, const std::string& reason, const json& s) {
  if (quiet_) return;
  std::printf("\nsession %lld %s (%s) after %s\n", (long long)session, status.c_str(), reason.c_str(),
              duration_text(s.value("wall_s", 0.0)).c_str());
  if (s.contains("best_variant")) {
    std::printf("  best       %s  %.1f us  %.2fx over the baseline (%.1f us)\n",
                s["best_variant"].get<std::string>().substr(0, 12).c_str(), s.value("best_us", 0.0),
                s.value("best_speedup", 0.0), s.value("baseline_us", 0.0));
    std::printf("  knobs      %s %s\n", s.value("best_template", "").c_str(), knob_text(s["best_knobs"]).c_str());
  }
  std::string outcomes;
  for (auto& [k, v] : s["by_outcome"].items()) outcomes += " " + k + "=" + v.dump();
  std::printf("  attempts   %d (%s ) accepted %d, rolled back %d\n", s.value("attempts", 0), outcomes.c_str(),
              s.value("accepted", 0), s.value("rolled_back", 0));
  // A phase's parts (traces::kPhaseParts) are shown beside it, in brackets.
  std::string phases;
  const json& ph = s["phase_s"];
  for (auto& [k, v] : ph.items()) {
    if (traces::phase_part(k)) continue;
    phases += " " + k + " " + duration_text(v.get<double>());
    std::string parts;
    for (const traces::PhasePart& p : traces::kPhaseParts)
      if (k == p.phase && ph.contains(p.key))
        parts += std::string(parts.empty() ? "" : ", ") + p.label + " " + duration_text(ph[p.key].get<double>());
    if (!parts.empty()) phases += " (" + parts + ")";
  }
  std::printf("  wall time %s\n", phases.c_str());
  if (s.contains("designer") && !s["designer"].empty()) std::printf("  designer   %s\n", s["designer"].dump().c_str());
  std::fflush(stdout);
}

}  // namespace ktune::agent
