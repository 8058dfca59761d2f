// Progress: what a session prints while it runs (one line per probe group,
// attempt and note) and the summary at the end. Output only; the record of
// the session is the store.
#pragma once
#include <string>

#include "agent/designer.h"
#include "agent/evaluator.h"
#include "agent/session.h"
#include "base/json.h"

namespace ktune::agent {

class Progress {
 public:
  void set_quiet(bool q) { quiet_ = q; }
  void header(int64_t session, const SessionOptions& o, bool resumed);
  void note(const std::string& text);
  void probes(const json& probes);
  void attempt(double t, const AttemptView& a, const Measurement& m, double baseline_us);
  void summary(int64_t session, const std::string& status, const std::string& reason, const json& s);

 private:
  bool quiet_ = false;
};

}  // namespace ktune::agent
