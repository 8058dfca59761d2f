// The LLM designer: each proposal is one call to a language model, which
// reads the task, the measured hardware, the current best variant, the knob
// space and a compact history of attempts, and answers with one JSON object:
//   {"rationale": "...", "knobs": {...}}                   a knob setting of the megakernel template
//   {"rationale": "...", "source": "...", "knobs": {...}}  a whole new source for it (knobs optional)
// (docs/llm.md has the contract and the prompt). Every call is recorded as
// an llm_call event, whatever became of it; a reply that is malformed,
// empty, invalid or already measured gives no proposal and the session goes
// on. Budgets (calls, tokens, seconds waiting for the model) end the
// designer's work: propose() then returns nothing, which ends the session.
#include <algorithm>
#include <deque>
#include <map>

#include "agent/designers.h"
#include "agent/llm_client.h"
#include "base/clock.h"
#include "base/text.h"

namespace ktune::agent {

namespace {

struct LlmOptions {
  LlmClientOptions client;
  int max_calls = 0;         // 0: no limit
  long token_budget = 0;     // tokens in + out over the session, 0: no limit
  double time_budget_s = 0;  // seconds spent waiting for the model, 0: no limit
  int source_chars = 64000;  // how much of a source the prompt shows; 0: the model may only set knobs
  int history = 30;          // attempts in the prompt's history
};

// Reads the options `ktune run --llm-*` fills; a value of the wrong type is
// an error naming it.
bool read_options(const json& j, LlmOptions* o, std::string* err) {
  auto take = [&](const char* name, auto* field) {
    auto it = j.find(name);
    if (it == j.end() || it->is_null()) return true;
    using T = std::remove_pointer_t<decltype(field)>;
    bool ok = std::is_same_v<T, std::string> ? it->is_string() : it->is_number();
    if (ok) *field = it->get<T>();
    else *err = "llm option '" + std::string(name) + "' has a wrong type: " + it->dump();
    return ok;
  };
  LlmClientOptions& c = o->client;
  return take("api", &c.api) && take("url", &c.url) && take("model", &c.model) && take("timeout_s", &c.timeout_s) &&
         take("temperature", &c.temperature) && take("max_tokens", &c.max_tokens) &&
         take("max_retries", &c.max_retries) && take("max_calls", &o->max_calls) &&
         take("token_budget", &o->token_budget) && take("time_budget_s", &o->time_budget_s) &&
         take("source_chars", &o->source_chars) && take("history", &o->history);
}

// ---- reading a reply ---------------------------------------------------------------

// The text with raw control characters inside JSON strings escaped: models
// often put a source's newlines into a string as they are.
std::string escape_controls_in_strings(const std::string& s) {
  std::string out;
  bool in_string = false, escaped = false;
  for (char c : s) {
    if (in_string && !escaped && (c == '\n' || c == '\r' || c == '\t')) {
      out += c == '\n' ? "\\n" : c == '\r' ? "\\r" : "\\t";
      continue;
    }
    out += c;
    if (escaped) escaped = false;
    else if (in_string && c == '\\') escaped = true;
    else if (c == '"') in_string = !in_string;
  }
  return out;
}

json parse_lenient(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  return j.is_discarded() ? json::parse(escape_controls_in_strings(text), nullptr, false) : j;
}

// The end (one past the closing brace) of the object starting at `open`,
// counting braces outside strings; npos when it never closes.
size_t object_end(const std::string& s, size_t open) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = open; i < s.size(); ++i) {
    char c = s[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{') {
      ++depth;
    } else if (c == '}' && --depth == 0) {
      return i + 1;
    }
  }
  return std::string::npos;
}

bool is_proposal(const json& j) { return j.is_object() && (j.contains("knobs") || j.contains("source")); }

// The reply's JSON object: the whole text, else the first balanced {...}
// in it (inside a code fence or prose) that reads as a proposal, else the
// first that reads at all (which then has the wrong shape).
json find_object(const std::string& text) {
  json whole = parse_lenient(text);
  if (whole.is_object()) return whole;
  json first_object;
  int tries = 0;  // bounds the work on a long reply full of braces
  for (size_t open = text.find('{'); open != std::string::npos && tries < 200; open = text.find('{', open + 1)) {
    size_t end = object_end(text, open);
    if (end == std::string::npos) continue;
    ++tries;
    json j = parse_lenient(text.substr(open, end - open));
    if (is_proposal(j)) return j;
    if (j.is_object() && first_object.is_null()) first_object = j;
  }
  return first_object;
}

std::string value_text(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// The knobs with each value mapped to the allowed one it stands for (a
// model may write 4 as "4").
json normalized_knobs(const json& knobs, const variants::KnobSpace& space) {
  json out = json::object();
  for (auto& [name, v] : knobs.items()) {
    out[name] = v;
    if (const variants::Knob* k = space.find(name))
      for (const json& allowed : k->values)
        if (allowed == v || value_text(allowed) == value_text(v)) out[name] = allowed;
  }
  return out;
}

// "tile=128 threads=4": the knobs that differ from the template's defaults.
std::string knob_diff(const variants::KnobSpace& space, const json& knobs) {
  std::string out;
  if (knobs.is_object())
    for (const variants::Knob& k : space.knobs)
      if (knobs.contains(k.name) && knobs[k.name] != k.default_value)
        out += (out.empty() ? "" : " ") + k.name + "=" + value_text(knobs[k.name]);
  return out.empty() ? "defaults" : out;
}

// One line of at most `n` characters.
std::string one_line(std::string s, size_t n) {
  for (char& c : s)
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  return s.size() > n ? s.substr(0, n) + "..." : s;
}

// A compiler message without the build directory in front of the file
// name ("/.../builds/<hash>/variant.cc:26:1: error: ..." -> "variant.cc:26:1: error: ...").
std::string without_paths(const std::string& error) {
  size_t colon = error.find(':');
  if (error.empty() || error[0] != '/' || colon == std::string::npos) return error;
  return error.substr(error.rfind('/', colon) + 1);
}

std::string clipped(const std::string& s, size_t n) {
  if (s.size() <= n) return s;
  return s.substr(0, n) + "\n/* ... " + std::to_string(s.size() - n) + " more characters not shown */\n";
}

// An attempt's last cells in the prompt's tables, "us | speedup | error":
// the numbers only when it was timed.
std::string measured_cells(const AttemptView& a) {
  const bool timed = a.score_us > 0;
  return (timed ? formatted("%.1f", a.score_us) : "") + " | " + (timed ? formatted("%.2f", a.speedup) + "x" : "") + " | " +
         one_line(without_paths(a.error), 200);
}

// ---- the designer --------------------------------------------------------------------

class LlmDesigner : public Designer {
 public:
  LlmDesigner(LlmOptions o, LlmClient client) : opts_(std::move(o)), client_(std::move(client)) {}
  std::string name() const override { return "llm"; }

  bool propose(const DesignContext& ctx, int max, std::vector<Proposal>* out, std::string* err) override {
    std::set<std::string> taken = ctx.measured;  // with this step's proposals
    std::string last_failure;
    const double t0 = mono_seconds();
    for (int i = 0; i < max && stop_reason_.empty(); ++i) {
      if (out_of_budget(ctx)) break;
      double session_left = ctx.budget_left_s - (mono_seconds() - t0);
      if (session_left < 1) break;  // the session ends before a model could answer
      Call c = call(ctx, *out, taken, session_left);
      if (c.status == "ok") {
        c.record["attempt"] = ctx.next_attempt + int(out->size());
        out->push_back(c.proposal);
      } else {
        last_failure = c.status + ": " + c.error;
        if (!c.reply_is_failure) remember_rejection(c.status + ": " + c.error);
      }
      ctx.record("llm_call", c.record);
    }
    if (out->empty() && stop_reason_.empty()) {
      *err = last_failure.empty() ? "no session time left for a model call"
                                  : "no usable proposal from the model (" + last_failure + ")";
      return false;
    }
    return true;
  }

  json usage() const override {
    json u = {{"calls", calls_},           {"tokens_in", tokens_in_}, {"tokens_out", tokens_out_},
              {"failed_calls", failed_},   {"by_status", by_status_}, {"model_s", model_s_}};
    if (!stop_reason_.empty()) u["stopped"] = stop_reason_;
    return u;
  }

 private:
  struct Call {
    std::string status, error;
    Proposal proposal;
    std::string variant;  // the id the proposal renders to
    json record;
    bool reply_is_failure = false;  // no answer of the model's came back: nothing for it to learn from
  };

  LlmOptions opts_;
  LlmClient client_;
  int calls_ = 0, failed_ = 0;
  long tokens_in_ = 0, tokens_out_ = 0;
  double model_s_ = 0;
  json by_status_ = json::object();
  std::string stop_reason_;                  // set when a budget ran out
  std::deque<std::string> rejections_;       // the latest replies that gave no attempt, and why
  std::map<std::string, std::string> sources_;  // variant id -> the source the model wrote for it

  json call_record(const std::string& status) const {
    return {{"provider", opts_.client.api}, {"model", opts_.client.model}, {"url", client_.endpoint()},
            {"status", status}};
  }

  void count(const std::string& status) {
    by_status_[status] = by_status_.value(status, 0) + 1;
    if (status != "ok" && status != "budget") ++failed_;
  }

  // True (and recorded, once) when a budget is used up.
  bool out_of_budget(const DesignContext& ctx) {
    if (opts_.max_calls > 0 && calls_ >= opts_.max_calls)
      stop_reason_ = "the limit of " + std::to_string(opts_.max_calls) + " model calls was reached";
    else if (opts_.token_budget > 0 && tokens_in_ + tokens_out_ >= opts_.token_budget)
      stop_reason_ = "the token budget of " + std::to_string(opts_.token_budget) + " was used (" +
                     std::to_string(tokens_in_ + tokens_out_) + " tokens)";
    else if (opts_.time_budget_s > 0 && model_s_ >= opts_.time_budget_s)
      stop_reason_ = "the time budget of " + formatted("%.0f", opts_.time_budget_s) + " s waiting for the model was used";
    if (stop_reason_.empty()) return false;
    json r = call_record("budget");
    r["error"] = stop_reason_;
    count("budget");
    ctx.record("llm_call", r);
    return true;
  }

  void remember_rejection(const std::string& what) {
    rejections_.push_back(one_line(what, 300));
    if (rejections_.size() > 5) rejections_.pop_front();
  }

  // One model call, within `session_left` seconds, and what became of it.
  Call call(const DesignContext& ctx, const std::vector<Proposal>& this_step, std::set<std::string>& taken,
            double session_left) {
    const std::string system = system_prompt(ctx), user = user_prompt(ctx, this_step);
    double deadline = session_left;
    if (opts_.time_budget_s > 0) deadline = std::min(deadline, opts_.time_budget_s - model_s_);
    LlmReply reply = client_.complete(system, user, deadline);
    ++calls_;
    tokens_in_ += reply.tokens_in;
    tokens_out_ += reply.tokens_out;
    model_s_ += reply.latency_s;
    Call c;
    c.status = reply.status;
    c.error = reply.error;
    if (reply.status == "ok") read_reply(ctx, reply.text, taken, &c);
    else c.reply_is_failure = true;
    count(c.status);
    c.record = call_record(c.status);
    c.record.update({{"prompt", llm_prompt_text(system, user)}, {"reply", reply.text},
                     {"http_status", reply.http_status}, {"tokens_in", reply.tokens_in},
                     {"tokens_out", reply.tokens_out}, {"latency_s", reply.latency_s}, {"retries", reply.retries}});
    // A 200 whose body was not the API's shape: the reply is that body, and
    // a replay must send it as it came.
    if (reply.status == "malformed") c.record["reply_is_body"] = true;
    if (!c.error.empty()) c.record["error"] = c.error;
    if (c.status == "ok") {
      c.record["variant"] = c.variant;
      c.record["rationale"] = c.proposal.rationale;
    }
    return c;
  }

  // Turns the model's text into a proposal, or says why it is none.
  void read_reply(const DesignContext& ctx, const std::string& text, std::set<std::string>& taken, Call* c) {
    const variants::KnobSpace& space = ctx.megakernel->space;
    auto reject = [&](const std::string& status, const std::string& why) {
      c->status = status;
      c->error = why;
    };
    if (text.find_first_not_of(" \t\r\n") == std::string::npos) return reject("empty", "the reply is empty");
    json j = find_object(text);
    if (j.is_null()) return reject("malformed", "no JSON object in the reply");
    if (!is_proposal(j)) return reject("malformed", "the JSON object has neither \"knobs\" nor \"source\"");
    if (j.contains("knobs") && !j["knobs"].is_object()) return reject("malformed", "\"knobs\" is not an object");
    if (j.contains("source") && (!j["source"].is_string() || j["source"].get<std::string>().empty()))
      return reject("malformed", "\"source\" is not a non-empty string");
    Proposal& p = c->proposal;
    p.origin = "llm";
    p.rationale = j.contains("rationale") ? one_line(value_text(j["rationale"]), 2000) : "";
    p.source = j.value("source", std::string());
    if (!p.source.empty() && opts_.source_chars <= 0)
      return reject("malformed", "this session accepts knob settings only, not sources");
    json point = space.complete(normalized_knobs(j.value("knobs", json::object()), space));
    std::string why;
    if (!space.valid(point, &why)) return reject("invalid_knobs", why);
    p.knobs = point;
    std::string id = ctx.variant_id(point, p.source);
    if (id.empty()) return reject("malformed", "the source does not render (an #include of an unknown kernels/ file?)");
    if (!taken.insert(id).second)
      return reject("duplicate", (p.source.empty() ? "" : "this source with ") + knob_diff(space, point) +
                                     ": already measured or proposed");
    if (!p.source.empty()) sources_[id] = p.source;
    c->variant = id;
  }

  // ---- the prompt --------------------------------------------------------------------

  std::string system_prompt(const DesignContext& ctx) const {
    const variants::Template& t = *ctx.megakernel;
    const bool sources = opts_.source_chars > 0;
    std::string s =
        "You are the designer of a ktune tuning session: you propose the next variant of a kernel. ktune builds "
        "each variant in a sandbox, validates it against a reference on fresh inputs, times it, and keeps it as "
        "the new best only when it is faster than the current best beyond the noise; otherwise it rolls back. You "
        "see the measured hardware, the current best, and the history of attempts with their outcomes and "
        "errors. Learn from them: do not repeat what failed, build on what worked.\n\n"
        "Answer with exactly one JSON object, in " +
        std::string(sources ? "one of these shapes" : "this shape") +
        ":\n"
        "{\"rationale\": \"<why this should be faster, one or two sentences>\", \"knobs\": {\"<knob>\": <value>, ...}}\n";
    if (sources)
      s += "{\"rationale\": \"<why>\", \"source\": \"<the complete source file>\", \"knobs\": {...}}\n";
    s += "\n- \"knobs\": values from the knob space of template " + t.name +
         " below. A knob you leave out takes the template's default, not the best's value, so name every knob "
         "that should differ from its default. A setting that was already measured is not measured again.\n";
    if (sources)
      s += "- \"source\": a whole new text for the template's file (" + t.file +
           "), replacing it. ktune puts the task's size #defines (KT_...) and the knob #defines in front of it "
           "(\"knobs\" is optional and sets them) and inlines its #include \"kernels/...\" lines. It must "
           "compute what the template computes, within the validation tolerance, in at most " +
           (t.max_launches ? std::to_string(t.max_launches) : std::string("any number of")) +
           " launch(es) per step. Write it as a JSON string (\\n for newlines, \\\" for quotes).\n";
    else
      s += "- This session accepts knob settings only.\n";
    s += "- Put nothing but the JSON object in your answer; text around it is ignored.\n";
    return s;
  }

  std::string user_prompt(const DesignContext& ctx, const std::vector<Proposal>& this_step) const {
    const variants::Template& t = *ctx.megakernel;
    const variants::KnobSpace& space = t.space;
    std::string s = "# Task\n" + ctx.task + ", size " + ctx.size + ", backend " + ctx.backend + ".\n";
    s += "Template " + t.name + " (" + t.file + "): " + t.summary + ".\n";
    if (ctx.baseline_us > 0) s += "Baseline: " + formatted("%.1f", ctx.baseline_us) + " us per step (speedup 1.00x).\n";
    s += "Session time left: " + formatted("%.0f", ctx.budget_left_s) + " s.\n";

    s += "\n# Hardware (measured)\n";
    s += "device: " + one_line(ctx.facts.dump(), 1500) + "\n";
    for (const json& p : ctx.probes) {
      if (!p.is_object()) continue;
      std::string unit = p.value("unit", "");
      s += p.value("name", "?") + " = " +
           (p.contains("value") && p["value"].is_number() ? formatted("%.4g", p["value"].get<double>()) : "?") +
           (unit.empty() ? "" : " " + unit) + "\n";
    }

    s += "\n# Knob space of " + t.name + "\n";
    for (const variants::Knob& k : space.knobs) {
      std::string values;
      for (const json& v : k.values) values += (values.empty() ? "" : ", ") + v.dump();
      bool strings = !k.values.empty() && k.values[0].is_string();
      s += "- " + k.name + " (" + k.macro + "): " + values + (strings ? " (the macro gets the position, 0, 1, ...)" : "") +
           "; default " + k.default_value.dump() + ". " + k.help + "\n";
    }

    s += "\n# Current best\n";
    const std::string* best_source = nullptr;
    if (ctx.best) {
      const AttemptView& b = *ctx.best;
      s += "attempt " + std::to_string(b.seq) + " (" + b.origin + ", " + b.template_name + "): " +
           formatted("%.1f", b.score_us) + " us per step, " + formatted("%.2f", b.speedup) + "x over the baseline\n";
      if (b.template_name == t.name) {
        s += "knobs: " + b.knobs.dump() + "\n";
        auto it = sources_.find(b.variant);
        if (it != sources_.end()) best_source = &it->second;
      }
    } else {
      s += "none yet\n";
    }

    const size_t n = ctx.history.size(), first = n > size_t(opts_.history) ? n - size_t(opts_.history) : 0;
    s += "\n# History (" + (first ? "the last " + std::to_string(n - first) + " of " : std::string()) +
         std::to_string(n) + " attempts; knobs: what differs from the defaults)\n";
    s += "seq | origin | variant | outcome | us | speedup | error\n";
    for (size_t i = first; i < n; ++i) {
      const AttemptView& a = ctx.history[i];
      std::string what = a.template_name != t.name ? a.template_name
                                                   : (sources_.count(a.variant) ? "own source, " : "") +
                                                         knob_diff(space, a.knobs);
      std::string outcome = a.outcome + (a.decision.empty() ? "" : ", " + a.decision);
      s += std::to_string(a.seq) + " | " + a.origin + " | " + what + " | " + outcome + " | " + measured_cells(a) + "\n";
    }
    if (!ctx.earlier.empty()) {
      // What earlier sessions learned on this same code: their fastest
      // points and their failures (the latest ones), not measured again.
      std::vector<const AttemptView*> ok, failed;
      for (const AttemptView& a : ctx.earlier) (a.outcome == "ok" && a.speedup > 0 ? ok : failed).push_back(&a);
      std::sort(ok.begin(), ok.end(), [](const AttemptView* a, const AttemptView* b) { return a->speedup > b->speedup; });
      constexpr size_t kShown = 10;
      if (ok.size() > kShown) ok.resize(kShown);
      if (failed.size() > kShown) failed.erase(failed.begin(), failed.end() - kShown);
      s += "\n# Earlier sessions on this code (" + std::to_string(ctx.earlier.size()) +
           " attempts; their fastest points, then their latest failures; speedup over their own baseline)\n";
      s += "knobs | outcome | us | speedup | error\n";
      for (const std::vector<const AttemptView*>* list : {&ok, &failed})
        for (const AttemptView* a : *list)
          s += knob_diff(space, a->knobs) + " | " + a->outcome + " | " + measured_cells(*a) + "\n";
    }
    if (!rejections_.empty()) {
      s += "\n# Your latest replies that gave no attempt (oldest first)\n";
      for (const std::string& r : rejections_) s += "- " + r + "\n";
    }
    if (!this_step.empty()) {
      s += "\n# Already proposed in this step (not measured yet)\n";
      for (const Proposal& p : this_step)
        s += "- " + std::string(p.source.empty() ? "" : "own source, ") + knob_diff(space, p.knobs) + "\n";
    }
    if (opts_.source_chars > 0) {
      s += "\n# Source of the current best (" +
           std::string(best_source ? "written by you earlier" : "the template's own text") +
           "; the knobs arrive as #defines)\n```" + (ctx.backend == "host" ? "cpp" : "cuda") + "\n" +
           clipped(best_source ? *best_source : ctx.megakernel_source, size_t(opts_.source_chars)) + "```\n";
    }
    s += "\n# Your answer\nOne JSON object, as the system message describes.\n";
    return s;
  }
};

}  // namespace

std::unique_ptr<Designer> make_llm_designer(const json& options, std::string* err) {
  LlmOptions o;
  if (!read_options(options, &o, err)) return nullptr;
  LlmClient client;
  if (!client.init(o.client, err)) return nullptr;
  return std::make_unique<LlmDesigner>(std::move(o), std::move(client));
}

}  // namespace ktune::agent
