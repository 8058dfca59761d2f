#include "measure/golden_check.h"

#include "base/text.h"

namespace ktune::measure {

std::string GoldenSummary::describe() const {
  std::string s = std::to_string(checks) + " checks, " + std::to_string(failed) + " failed, launches/step " +
                  std::to_string(launches) + "; worst cosine:";
  for (auto& [k, v] : worst) {
    s += formatted(" %s %.6f", k.c_str(), v);
  }
  return s;
}

bool check_golden_file(RunnerBackend& be, const kimi::GoldenFile& g, const kimi::GoldenOptions& opts,
                       GoldenSummary* out, std::string* err) {
  std::vector<kimi::GoldenCheck> checks;
  for (const kimi::GoldenCase& c : g.cases) {
    kimi::StepFn step = [&](kimi::KimiState* st, const std::vector<uint16_t>& tok, kimi::StepOutput* o,
                            std::string* e) {
      if (!be.put_state(*st, tok, e)) return false;
      StepStatus s = be.step(st->context, true);
      if (!s.ok) {
        *e = s.error;
        return false;
      }
      out->launches = std::max(out->launches, s.launches);
      return be.get_state(st, o, e);
    };
    if (!kimi::check_golden_case(g, c, step, opts, &checks, err)) return false;
  }
  for (const kimi::GoldenCheck& ch : checks) {
    std::string kind = ch.name.substr(ch.name.rfind('.') + 1);
    auto it = out->worst.try_emplace(kind, 1.0).first;
    it->second = std::min(it->second, ch.sim.cosine);
    ++out->checks;
    if (!ch.ok) {
      ++out->failed;
      if (out->failures.size() < 10) out->failures.push_back(ch.name + " cos=" + std::to_string(ch.sim.cosine));
    }
  }
  return true;
}

}  // namespace ktune::measure
