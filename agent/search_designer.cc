// The default designer: a seeded, reproducible search of the megakernel's
// knob space that learns from the session's history.
//  - The default knobs come first (the hand-tuned starting point).
//  - Then, batch by batch: neighbours of the best variant (one knob moved
//    one step), in an order shuffled by the seed, mixed with random points
//    drawn per knob from values weighted by how they did so far.
//  - A knob value whose every attempt failed (compile error, crash, wrong
//    answer, ...) is not proposed again once it failed twice.
//  - Points already measured, in this session or an earlier one on the same
//    task, are never proposed, with two exceptions that start each session
//    on this machine as it is now: the defaults, and the fastest point of
//    earlier sessions still on the same code, are measured again.
//  - What is learned (failures, weights) comes from this session and from
//    the earlier sessions' attempts on the same code.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "agent/designer.h"
#include "base/rng.h"
#include "base/text.h"

namespace ktune::agent {

namespace {

class SearchDesigner : public Designer {
 public:
  std::string name() const override { return "search"; }

  bool propose(const DesignContext& ctx, int max, std::vector<Proposal>* out, std::string* err) override {
    const variants::KnobSpace& space = ctx.megakernel->space;
    Rng rng(ctx.seed ^ (0x5eedull * (ctx.history.size() + 1)));
    // Ids measured before or proposed now: not proposed again, and the
    // variants a proposal may name as its parent (the store holds them by
    // the time it is built).
    std::set<std::string> taken = ctx.measured;
    auto try_add = [&](const json& knobs, const std::string& why, const std::string& parent) {
      std::string reason;
      if (int(out->size()) >= max || !space.valid(knobs, &reason) || banned(space, knobs)) return;
      std::string id = ctx.variant_id(knobs, "");
      if (id.empty() || !taken.insert(id).second) return;
      Proposal p;
      p.knobs = knobs;
      p.origin = "search";
      p.rationale = why;
      p.parent = parent;
      out->push_back(p);
    };
    learn(ctx);
    // The session's starting points, measured here even when an earlier
    // session measured them: a best must be timed in this session to be
    // compared with its candidates.
    // Once is enough: a start already in this session's history, or proposed
    // by this designer and still queued (on a GPU the next batch is designed
    // while one is measured), is not proposed again.
    std::set<std::string> here = started_;
    for (const AttemptView& a : ctx.history) here.insert(a.variant);
    auto start_from = [&](const json& knobs, const std::string& why) {
      std::string id = ctx.variant_id(knobs, "");
      if (id.empty() || here.count(id) || int(out->size()) >= max) return;
      taken.erase(id);
      const size_t before = out->size();
      try_add(knobs, why, "");
      if (out->size() > before) started_.insert(id);
    };
    start_from(space.defaults(), "the template's default knobs (the hand-tuned starting point)");
    if (const AttemptView* earlier = fastest(ctx.earlier))
      start_from(earlier->knobs, "the fastest point of earlier sessions on this code (" + formatted("%.1f", earlier->score_us) +
                                     " us, " + formatted("%.2f", earlier->speedup) + "x their baseline), measured again as a start");
    // Neighbours of the best megakernel variant, or of the defaults while
    // the best is of another template (the baseline). That base is the
    // parent of every point below (the random ones too: their knob changes
    // then read against it).
    json base = space.defaults();
    std::string base_id, base_name = "the defaults";
    if (ctx.best && ctx.best->template_name == ctx.megakernel->name && ctx.best->knobs.is_object()) {
      base = space.complete(ctx.best->knobs);
      base_id = ctx.best->variant;
      base_name = "the best";
    } else if (std::string id = ctx.variant_id(base, ""); taken.count(id)) {
      base_id = id;
    }
    std::vector<json> neighbours;
    for (const auto& k : space.knobs) {
      auto it = std::find(k.values.begin(), k.values.end(), base[k.name]);
      if (it == k.values.end()) continue;
      size_t i = size_t(it - k.values.begin());
      for (int d : {-1, 1}) {
        if ((d < 0 && i == 0) || i + d >= k.values.size()) continue;
        json n = base;
        n[k.name] = k.values[i + d];
        neighbours.push_back(n);
      }
    }
    for (size_t i = neighbours.size(); i > 1; --i) std::swap(neighbours[i - 1], neighbours[rng.below(i)]);
    // Alternate: exploit (a neighbour) and explore (a weighted random point).
    size_t ni = 0;
    for (int tries = 0; int(out->size()) < max && tries < 64 * max; ++tries) {
      bool explore = rng.unit() < 0.35 || ni >= neighbours.size();
      if (!explore) {
        json n = neighbours[ni++];
        std::string moved;
        for (auto& [k, v] : n.items())
          if (v != base[k]) moved = k + " " + base[k].dump() + " -> " + v.dump();
        try_add(n, "neighbour of " + base_name + ": " + moved, base_id);
      } else {
        try_add(random_point(space, rng), "exploration: a random point weighted by what worked so far", base_id);
      }
    }
    (void)err;
    return true;
  }

 private:
  // Per (knob, value): how many attempts failed and how many succeeded, and
  // the mean log-speedup of the successful ones.
  struct Stat {
    int failed = 0, ok = 0;
    double log_speedup = 0;
  };
  std::map<std::string, Stat> stats_;
  std::set<std::string> started_;  // the starting points this designer proposed

  static std::string key(const std::string& knob, const json& v) { return knob + "=" + v.dump(); }

  // The ok attempt with the largest speedup; nullptr when none is ok.
  static const AttemptView* fastest(const std::vector<AttemptView>& attempts) {
    const AttemptView* best = nullptr;
    for (const AttemptView& a : attempts)
      if (a.outcome == "ok" && a.speedup > 0 && (!best || a.speedup > best->speedup)) best = &a;
    return best;
  }

  void learn(const DesignContext& ctx) {
    stats_.clear();
    std::vector<AttemptView> all = ctx.earlier;
    all.insert(all.end(), ctx.history.begin(), ctx.history.end());
    for (const AttemptView& a : all) {
      if (a.template_name != ctx.megakernel->name || !a.knobs.is_object() || a.outcome.empty() ||
          a.outcome == "interrupted")
        continue;
      for (auto& [k, v] : a.knobs.items()) {
        Stat& s = stats_[key(k, v)];
        if (a.outcome == "ok" && a.speedup > 0) {
          s.log_speedup = (s.log_speedup * s.ok + std::log(a.speedup)) / (s.ok + 1);
          ++s.ok;
        } else if (a.outcome != "ok") {
          ++s.failed;
        }
      }
    }
  }

  bool banned(const variants::KnobSpace& space, const json& knobs) const {
    for (const auto& k : space.knobs) {
      auto it = stats_.find(key(k.name, knobs[k.name]));
      if (it != stats_.end() && it->second.failed >= 2 && it->second.ok == 0) return true;
    }
    return false;
  }

  json random_point(const variants::KnobSpace& space, Rng& rng) const {
    json p = json::object();
    for (const auto& k : space.knobs) {
      // Weight each value by exp(mean log-speedup), unseen values by 1.
      std::vector<double> w;
      double total = 0;
      for (const json& v : k.values) {
        auto it = stats_.find(key(k.name, v));
        double wt = (it != stats_.end() && it->second.ok) ? std::exp(it->second.log_speedup) : 1.0;
        if (it != stats_.end() && it->second.failed && !it->second.ok) wt *= 0.25;
        w.push_back(wt);
        total += wt;
      }
      double r = rng.unit() * total;
      size_t i = 0;
      while (i + 1 < w.size() && r >= w[i]) r -= w[i++];
      p[k.name] = k.values[i];
    }
    return p;
  }
};

}  // namespace

std::unique_ptr<Designer> make_search_designer() { return std::make_unique<SearchDesigner>(); }

}  // namespace ktune::agent
