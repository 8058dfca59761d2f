#include "measure/runner.h"

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "base/clock.h"
#include "base/fs.h"
#include "base/tensor.h"
#include "kernels/kimi/state.h"
#include "measure/backend_hostmem.h"
#include "measure/profile_trace.h"
#include "measure/runner_backend.h"
#include "measure/validate.h"

namespace ktune::measure {

std::unique_ptr<RunnerBackend> make_cuda_backend(const kimi::KimiConfig& cfg, std::string* err);

std::unique_ptr<RunnerBackend> make_backend(const std::string& name, const kimi::KimiConfig& cfg, std::string* err) {
  if (name == "host") return std::make_unique<HostBackend>(cfg);
  if (name == "cuda-emu") return std::make_unique<EmuBackend>(cfg);
  if (name == "cuda") {
#ifdef KTUNE_HAVE_CUDA
    return make_cuda_backend(cfg, err);
#else
    *err = "this ktune was built without the CUDA toolkit";
    return nullptr;
#endif
  }
  *err = "unknown backend '" + name + "' (expected host, cuda or cuda-emu)";
  return nullptr;
}

StepStatus RunnerBackend::steps_back_to_back(int context, int cycle, int count) {
  StepStatus total;
  for (int i = 0; i < count; ++i) {
    StepStatus s = step(context + i % cycle, false);
    if (!s.ok) return s;
    total.us += s.us;
  }
  return total;
}

namespace {

json failure(const std::string& outcome, const std::string& error) {
  return {{"ok", false}, {"outcome", outcome}, {"error", error}};
}

struct Runner {
  kimi::KimiConfig cfg;
  kimi::KimiWeights weights;
  std::unique_ptr<RunnerBackend> backend;
  int capacity = 0;
  bool loaded = false;
  std::unique_ptr<kimi::SeededStates> states;  // once cfg and capacity are known

  // The longest context among a request's cases or contexts.
  static int longest_context(const json& items, bool pairs) {
    int longest = 0;
    for (const json& c : items) longest = std::max(longest, pairs ? c.at(0).get<int>() : c.value("context", 0));
    return longest;
  }

  // Runs the variant on each case and writes its outputs for the caller to
  // compare. "seconds" says where the runner's time went, summed over the
  // cases: building the case's state, copying it in, the step itself (wall
  // time, launch and synchronization included), copying it out, writing it.
  json validate(const json& req, bool* fatal) {
    std::string out_dir = req.value("out_dir", std::string());
    std::string err;
    if (out_dir.empty() || !make_dirs(out_dir, &err)) return failure("launch_error", "bad out_dir: " + err);
    json files = json::array(), step_us = json::array();
    int launches = -1;
    int index = 0;
    double state_s = 0, upload_s = 0, step_s = 0, download_s = 0, write_s = 0;
    const json cases = req.value("cases", json::array());
    const int longest = longest_context(cases, false);
    for (const json& c : cases) {
      int seed = c.value("seed", 0), context = c.value("context", 0);
      double t = mono_seconds();
      auto lap = [&t](double* into) {
        const double now = mono_seconds();
        *into += now - t;
        t = now;
      };
      kimi::KimiState st = states->get(uint64_t(seed), context, longest);
      std::vector<uint16_t> token = kimi::make_token(cfg, uint64_t(seed));
      lap(&state_s);
      if (!backend->put_state(st, token, &err)) return failure("launch_error", err);
      lap(&upload_s);
      StepStatus s = backend->step(context, true);
      if (!s.ok) {
        *fatal = s.fault;
        return failure(s.fault ? "device_fault" : "launch_error", s.error);
      }
      lap(&step_s);
      launches = std::max(launches, s.launches);
      step_us.push_back(s.us);
      kimi::StepOutput out;
      if (!backend->get_state(&st, &out, &err)) return failure("launch_error", err);
      lap(&download_s);
      std::string path = join_path(out_dir, "case" + std::to_string(index++) + ".safetensors");
      if (!write_case_outputs(path, cfg, st, out, &err)) return failure("launch_error", err);
      lap(&write_s);
      files.push_back(path);
    }
    json seconds = {{"state", state_s}, {"upload", upload_s}, {"step", step_s}, {"download", download_s},
                    {"write", write_s}};
    return {{"ok", true},         {"files", files},     {"launches_per_step", launches},
            {"step_us", step_us}, {"seconds", seconds}, {"declared_launches", backend->declared_launches()}};
  }

  // Per-step samples, each step timed alone; with "back_to_back" n > 0,
  // also "batches" batches of n steps launched back to back, each batch's
  // mean per step a sample (back_to_back_us).
  json time(const json& req, bool* fatal) {
    int warmup = req.value("warmup", 3), samples = req.value("samples", 50);
    int batch = req.value("back_to_back", 0), batches = req.value("batches", 5);
    uint64_t seed = req.value("seed", 1234567);
    json timings = json::array();
    std::string err;
    const json contexts = req.value("contexts", json::array());
    const int longest = longest_context(contexts, true);
    for (const json& ctx : contexts) {
      int context = ctx.at(0), steps = std::max(1, ctx.at(1).get<int>());
      kimi::KimiState st = states->get(seed, context, longest);
      if (!backend->put_state(st, kimi::make_token(cfg, seed), &err)) return failure("launch_error", err);
      json us = json::array();
      // The decode of `steps` tokens from `context`, repeated: the cache
      // grows by a row each step and starts over after `steps`.
      for (int i = 0; i < warmup + samples; ++i) {
        StepStatus s = backend->step(context + i % steps, false);
        if (!s.ok) {
          *fatal = s.fault;
          return failure(s.fault ? "device_fault" : "launch_error", s.error);
        }
        if (i >= warmup) us.push_back(s.us);
      }
      json row = {{"context", context}, {"steps", steps}, {"warmup", warmup}, {"samples_us", us}};
      if (batch > 0) {
        json per_step = json::array();
        for (int k = 0; k < batches; ++k) {
          StepStatus s = backend->steps_back_to_back(context, steps, batch);
          if (!s.ok) {
            *fatal = s.fault;
            return failure(s.fault ? "device_fault" : "launch_error", s.error);
          }
          per_step.push_back(s.us / batch);
        }
        row["back_to_back_steps"] = batch;
        row["back_to_back_us"] = per_step;
      }
      timings.push_back(row);
    }
    return {{"ok", true}, {"timings", timings}};
  }

  // Steps with a trace buffer: each sample's (tag, time) stamps, as written
  // by a profiled variant (KT_PROFILE), and the blocks' barrier arrivals.
  json profile(const json& req, bool* fatal) {
    int warmup = req.value("warmup", 3), samples = req.value("samples", 10);
    uint64_t seed = req.value("seed", 1234567);
    const size_t words = profile_trace_words();
    std::string err;
    if (!backend->set_trace(words, &err)) return failure("launch_error", err);
    json out = json::array();
    const json contexts = req.value("contexts", json::array());
    const int longest = longest_context(contexts, true);
    for (const json& ctx : contexts) {
      int context = ctx.at(0), steps = std::max(1, ctx.at(1).get<int>());
      kimi::KimiState st = states->get(seed, context, longest);
      if (!backend->put_state(st, kimi::make_token(cfg, seed), &err)) return failure("launch_error", err);
      json runs = json::array();
      for (int i = 0; i < warmup + samples; ++i) {
        StepStatus s = backend->step(context + i % steps, false);
        if (!s.ok) {
          *fatal = s.fault;
          return failure(s.fault ? "device_fault" : "launch_error", s.error);
        }
        std::vector<uint64_t> t;
        if (i < warmup || !backend->read_trace(&t, &err)) continue;
        runs.push_back({{"us", s.us}, {"stamps", trace_stamps(t)}, {"arrivals", barrier_arrivals(t)}});
      }
      out.push_back({{"context", context}, {"runs", runs}});
    }
    backend->set_trace(0, &err);
    return {{"ok", true}, {"profiles", out}};
  }

  // Returns the reply; sets *fatal when the runner must exit after it.
  json handle(const json& req, bool* fatal) {
    std::string op = req.value("op", std::string());
    std::string err;
    if (op == "hello") return {{"ok", true}, {"facts", backend->facts()}, {"config", cfg.name}};
    if (op == "probe") {
      json p = backend->probe(&err);
      if (!err.empty()) return failure("launch_error", err);
      return {{"ok", true}, {"probes", p}};
    }
    if (op == "load") {
      // The variant's prepare table runs inside load: a prepare kernel that
      // faults is a device_fault (and the runner exits); one that hangs
      // leaves this request unanswered, and the client's deadline makes it
      // a timeout.
      loaded = backend->load(req.value("artifact", std::string()), &err);
      if (!loaded) {
        *fatal = backend->faulted();
        return failure(*fatal ? "device_fault" : "launch_error", err);
      }
      return {{"ok", true}, {"declared_launches", backend->declared_launches()}};
    }
    if (op == "validate" || op == "time" || op == "profile") {
      if (!loaded) return failure("launch_error", "no variant loaded");
      if (op == "profile") return profile(req, fatal);
      return op == "validate" ? validate(req, fatal) : time(req, fatal);
    }
    return failure("launch_error", "unknown op '" + op + "'");
  }
};

void reply(const json& j) {
  std::string line = j.dump();
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

}  // namespace

int runner_main(int argc, char** argv) {
  std::string backend_name = "host", size = "small", weights_file;
  uint64_t weights_seed = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--backend") backend_name = v;
    else if (k == "--size") size = v;
    else if (k == "--weights-seed") weights_seed = std::stoull(v);
    else if (k == "--weights-file") weights_file = v;
  }
  Runner r;
  std::string err;
  bool ok = weights_file.empty() ? kimi::KimiConfig::preset(size, &r.cfg, &err) &&
                                       kimi::load_weights(r.cfg, weights_seed, &r.weights, &err)
                                 : kimi::load_weights_file(weights_file, &r.weights, &err);
  if (ok) {
    r.cfg = r.weights.cfg;
    r.capacity = r.cfg.max_context() + 8;
    r.states = std::make_unique<kimi::SeededStates>(r.cfg, r.capacity);
    r.backend = make_backend(backend_name, r.cfg, &err);
    ok = r.backend && r.backend->init(r.weights, r.capacity, &err);
  }
  if (!ok) {
    // Every request gets the same answer, so the client reads why.
    std::string line;
    while (std::getline(std::cin, line)) reply(failure("launch_error", "runner cannot start: " + err));
    std::fprintf(stderr, "ktune-runner: %s\n", err.c_str());
    return 2;
  }
  std::string line;
  while (std::getline(std::cin, line)) {
    json req = json::parse(line, nullptr, false);
    if (req.is_discarded() || !req.is_object()) {
      reply(failure("launch_error", "request is not a JSON object"));
      continue;
    }
    if (req.value("op", "") == "quit") break;
    bool fatal = false;
    reply(r.handle(req, &fatal));
    if (fatal) return 3;
  }
  return 0;
}

}  // namespace ktune::measure
