#include "measure/runner_client.h"

#include "base/clock.h"
#include "base/fs.h"

namespace ktune::measure {

bool RunnerClient::start(const RunnerOptions& opts, std::string* err) {
  opts_ = opts;
  return spawn(err);
}

bool RunnerClient::spawn(std::string* err) {
  double t0 = mono_seconds();
  child_ = std::make_unique<sandbox::LineChild>();
  sandbox::ProcessSpec spec;
  spec.argv = {opts_.runner, "--backend", opts_.backend, "--weights-seed", std::to_string(opts_.weights_seed)};
  if (opts_.weights_file.empty()) {
    spec.argv.insert(spec.argv.end(), {"--size", opts_.size});
  } else {
    spec.argv.insert(spec.argv.end(), {"--weights-file", opts_.weights_file});
  }
  spec.workdir = opts_.workdir;
  // The weights cache is shared with the orchestrator, which made sure the
  // weights exist before starting the runner.
  spec.env = sandbox::clean_env(opts_.workdir, {{"KTUNE_CACHE_DIR", cache_dir()}});
  spec.limits.memory_bytes = opts_.memory_bytes;
  spec.limits.file_bytes = 0;
  if (!child_->start(spec, opts_.log_path, err)) return false;
  ++starts_;
  std::string line, why;
  bool timed_out = false;
  if (!child_->send(json{{"op", "hello"}}.dump(), &why) ||
      !child_->receive(&line, opts_.start_timeout_s, &timed_out, &why)) {
    child_->kill();
    *err = timed_out ? "the runner did not start within " + std::to_string(int(opts_.start_timeout_s)) + " s"
                     : "the runner failed to start: " + why;
    return false;
  }
  json hello = json::parse(line, nullptr, false);
  if (hello.is_discarded() || !hello.value("ok", false)) {
    child_->kill();
    *err = "the runner failed to start: " + (hello.is_discarded() ? line : hello.value("error", line));
    return false;
  }
  facts_ = hello.value("facts", json::object());
  last_start_s_ = mono_seconds() - t0;
  return true;
}

RunnerReply RunnerClient::call(const json& request, double timeout_s) {
  RunnerReply r;
  std::string err;
  if ((!child_ || !child_->running()) && !spawn(&err)) {
    r.outcome = "launch_error";
    r.error = err;
    return r;
  }
  std::string line;
  bool timed_out = false;
  if (!child_->send(request.dump(), &err) || !child_->receive(&line, timeout_s, &timed_out, &err)) {
    if (timed_out) {
      child_->kill();
      r.outcome = "timeout";
      r.error = "no answer within " + std::to_string(timeout_s) + " s; the runner was killed";
    } else {
      r.outcome = "device_fault";
      r.error = "the runner died: " + err;
    }
    child_.reset();
    return r;
  }
  r.body = json::parse(line, nullptr, false);
  if (r.body.is_discarded() || !r.body.is_object()) {
    r.outcome = "launch_error";
    r.error = "unreadable runner reply: " + line.substr(0, 200);
    return r;
  }
  r.ok = r.body.value("ok", false);
  if (!r.ok) {
    r.outcome = r.body.value("outcome", std::string("launch_error"));
    r.error = r.body.value("error", std::string());
    // After a fault the runner exits (its device is unusable); the next
    // request starts a fresh one.
    if (r.outcome == "device_fault") {
      child_->kill();
      child_.reset();
    }
  }
  return r;
}

void RunnerClient::stop() {
  if (child_ && child_->running()) {
    std::string err;
    child_->send(json{{"op", "quit"}}.dump(), &err);
    std::string line;
    bool timed_out;
    child_->receive(&line, 5, &timed_out, &err);  // waits for the exit
    child_->kill();
  }
  child_.reset();
}

}  // namespace ktune::measure
