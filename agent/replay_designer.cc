// The replay designer: proposes, in order, the candidates of a recorded
// session (its trace file) or a scripted list. With the same task, size and
// backend the rendered sources, and so the variant ids, are the same as
// recorded, which makes a recorded session re-runnable without its
// designer (or its language model).
#include <map>

#include "agent/designers.h"
#include "base/fs.h"
#include "traces/trace_file.h"

namespace ktune::agent {

namespace {

class ReplayDesigner : public Designer {
 public:
  explicit ReplayDesigner(std::vector<Proposal> p) : queue_(std::move(p)) {}
  std::string name() const override { return "replay"; }
  bool propose(const DesignContext&, int max, std::vector<Proposal>* out, std::string*) override {
    while (next_ < queue_.size() && int(out->size()) < max) out->push_back(queue_[next_++]);
    return true;
  }

 private:
  std::vector<Proposal> queue_;
  size_t next_ = 0;
};

bool from_trace(const std::string& path, std::vector<Proposal>* out, std::string* err) {
  std::string text;
  traces::TraceFile t;
  if (!read_file(path, &text, err) || !traces::parse_trace(text, &t, err)) return false;
  std::map<std::string, json> variants;
  for (const traces::Event& e : t.events) {
    if (e.kind == "variant") variants[e.data.value("id", "")] = e.data;
    if (e.kind != "attempt_started" || e.data.value("purpose", "") != "candidate") continue;
    auto it = variants.find(e.data.value("variant", ""));
    if (it == variants.end()) continue;
    const json& v = it->second;
    Proposal p;
    p.template_name = v.value("template", "");
    p.knobs = v.value("knobs", json::object());
    p.rendered = v.value("source", "");
    p.origin = "replay";
    p.rationale = "replay of " + v.value("origin", std::string("?")) + ": " + v.value("rationale", "");
    out->push_back(p);
  }
  return true;
}

}  // namespace

std::unique_ptr<Designer> make_replay_designer(const json& options, std::string* err) {
  std::vector<Proposal> proposals;
  if (options.contains("trace")) {
    if (!from_trace(options["trace"].get<std::string>(), &proposals, err)) return nullptr;
  } else if (options.contains("proposals") && options["proposals"].is_array()) {
    for (const json& j : options["proposals"]) {
      Proposal p;
      p.template_name = j.value("template", "");
      p.knobs = j.value("knobs", json::object());
      p.source = j.value("source", "");
      p.rendered = j.value("rendered", "");
      p.origin = j.value("origin", std::string("script"));
      p.rationale = j.value("rationale", "");
      proposals.push_back(p);
    }
  } else {
    *err = "the replay designer needs a trace (--replay-trace FILE) or a list of proposals";
    return nullptr;
  }
  return std::make_unique<ReplayDesigner>(std::move(proposals));
}

std::unique_ptr<Designer> make_designer(const std::string& name, const json& options, std::string* err) {
  if (name == "search") return make_search_designer();
  if (name == "replay") return make_replay_designer(options, err);
  if (name == "llm") return make_llm_designer(options, err);
  *err = "unknown designer '" + name + "' (expected search, replay or llm)";
  return nullptr;
}

}  // namespace ktune::agent
