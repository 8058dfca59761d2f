// A loopback HTTP server that answers the two LLM APIs (POST
// .../chat/completions in the OpenAI shape, POST .../messages in the
// Anthropic shape) from a script instead of a model: the replies a recorded
// session got, in order (`ktune replay --serve s.jsonl`), so that the
// session re-runs without a model; or a test's list of responses, faults
// included (error statuses, Retry-After, bodies that are not JSON, answers
// slower than the client's timeout), so tests drive the real HTTP path.
//
// Each request takes the next entry of the script, in the order requests
// arrive; a connection is served on its own thread, so a slow answer does
// not hold up the client's next try. Once the script is used up, requests
// get a 404 with a JSON error.
#pragma once
#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/json.h"
#include "traces/trace_file.h"

namespace ktune::agent {

// One scripted answer. As JSON (a script file has one per line):
// {"content": "...", "status": 200, "body": "...", "delay_s": 0, "retry_after": 1,
//  "tokens_in": 0, "tokens_out": 0, "prompt": "..."}, every field optional.
struct ScriptedResponse {
  int status = 200;
  std::string content;        // the model's text, wrapped in the API's JSON shape
  std::string body;           // non-empty: sent verbatim instead (a malformed response)
  double delay_s = 0;         // wait this long before answering
  double retry_after_s = -1;  // >= 0: a Retry-After header
  int tokens_in = -1, tokens_out = -1;  // -1: estimated from the sizes (4 bytes a token)
  std::string prompt;         // the recorded prompt; a request that differs is reported on stderr
};

bool scripted_response_from_json(const json& j, ScriptedResponse* out, std::string* err);

// The answers of a recorded session: its llm_call events in order. A call
// that got a reply is answered with it (as a 200, so a malformed or empty
// reply is malformed or empty again). A call that failed (http_error,
// timeout) is answered with a 400, which the client does not retry, so the
// failure costs no time on replay. Calls that never reached the model
// (status "budget") are skipped.
std::vector<ScriptedResponse> script_from_trace(const traces::TraceFile& trace);

// A file for `ktune replay --serve`: a session trace (its first line is a
// trace header) or a script, one ScriptedResponse JSON per line.
bool load_script(const std::string& path, std::vector<ScriptedResponse>* out, std::string* err);

// What the server saw of one request.
struct ServedRequest {
  std::string path, api;      // api: "openai", "anthropic" or "" for another path
  int entry = -1;             // the script entry it got, -1 for none
  int status = 0;
  bool authorized = false;    // an API key header was present (its value is never kept)
  bool prompt_matches = true; // false when the entry has a prompt and the request's differs
};

class ReplayServer {
 public:
  explicit ReplayServer(std::vector<ScriptedResponse> script);
  ~ReplayServer();
  ReplayServer(const ReplayServer&) = delete;
  ReplayServer& operator=(const ReplayServer&) = delete;

  // Binds 127.0.0.1:port (0: a free port).
  bool bind(int port, std::string* err);
  int port() const { return port_; }
  // Answers requests until stop(), or until `max_requests` were answered
  // (0: no limit); then waits for the connections in progress.
  void serve(int max_requests = 0);
  // Safe from another thread and from a signal handler.
  void stop() { stopping_ = true; }
  std::vector<ServedRequest> requests() const;

 private:
  std::vector<ScriptedResponse> script_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  mutable std::mutex mu_;
  size_t next_ = 0;  // the next script entry
  std::vector<ServedRequest> requests_;
  void handle(int fd);
  bool sleep_unless_stopped(double seconds) const;
};

}  // namespace ktune::agent
