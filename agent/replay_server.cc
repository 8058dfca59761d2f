// The loopback LLM API server of `ktune replay --serve` and of the tests
// (see replay_server.h). Plain sockets, HTTP/1.1, one request per
// connection (Connection: close).
#include "agent/replay_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "agent/llm_client.h"
#include "base/clock.h"
#include "base/fs.h"

namespace ktune::agent {

namespace {

// A client that sends nothing for this long is dropped.
constexpr double kReadTimeoutS = 30;
// The largest request read (prompts carry whole kernel sources).
constexpr size_t kMaxRequestBytes = 64u << 20;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), ::tolower);
  return s;
}

struct Request {
  std::string method, path, body;
  bool authorized = false;
};

// Reads one request (headers, then Content-Length bytes of body). False
// when the client goes away, sends garbage or stalls.
bool read_request(int fd, const std::atomic<bool>& stopping, Request* out) {
  std::string data;
  size_t header_end = std::string::npos, need = 0;
  const double deadline = mono_seconds() + kReadTimeoutS;
  char buf[65536];
  while (true) {
    if (header_end != std::string::npos && data.size() >= header_end + 4 + need) break;
    if (stopping || mono_seconds() > deadline || data.size() > kMaxRequestBytes) return false;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return false;
    data.append(buf, size_t(n));
    if (header_end != std::string::npos) continue;
    header_end = data.find("\r\n\r\n");
    if (header_end == std::string::npos) continue;
    // The request line and the headers this server cares about.
    size_t line_end = data.find("\r\n");
    std::string line = data.substr(0, line_end);
    size_t sp1 = line.find(' '), sp2 = line.find(' ', sp1 + 1);
    if (sp1 == std::string::npos || sp2 == std::string::npos) return false;
    out->method = line.substr(0, sp1);
    out->path = line.substr(sp1 + 1, sp2 - sp1 - 1);
    for (size_t at = line_end + 2; at < header_end;) {
      size_t end = data.find("\r\n", at);
      std::string h = data.substr(at, end - at);
      at = end + 2;
      size_t colon = h.find(':');
      if (colon == std::string::npos) continue;
      std::string name = lower(h.substr(0, colon)), value = h.substr(colon + 1);
      if (name == "content-length") need = std::strtoull(value.c_str(), nullptr, 10);
      if (name == "authorization" || name == "x-api-key") out->authorized = true;
    }
  }
  out->body = data.substr(header_end + 4, need);
  return true;
}

void send_all(int fd, const std::string& text) {
  for (size_t at = 0; at < text.size();) {
    ssize_t n = send(fd, text.data() + at, text.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return;  // the client gave up (its timeout); nothing to do
    at += size_t(n);
  }
}

const char* reason_phrase(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    default: return "Status";
  }
}

void send_response(int fd, int status, const std::string& body, double retry_after_s) {
  std::string head = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) +
                     "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                     "\r\nConnection: close\r\n";
  if (retry_after_s >= 0) {
    char v[32];
    std::snprintf(v, sizeof v, "%g", retry_after_s);
    head += "Retry-After: " + std::string(v) + "\r\n";
  }
  send_all(fd, head + "\r\n" + body);
}

std::string error_body(const std::string& message) {
  return json{{"error", {{"type", "replay"}, {"message", message}}}}.dump();
}

// The prompt of a request in either API's shape, as the designer records it.
std::string request_prompt(const std::string& api, const json& request) {
  std::string system, user;
  for (const json& m : request.value("messages", json::array())) {
    if (!m.is_object() || !m.contains("content") || !m["content"].is_string()) continue;
    std::string role = m.value("role", "");
    if (role == "system") system = m["content"].get<std::string>();
    if (role == "user") user = m["content"].get<std::string>();
  }
  if (api == "anthropic" && request.contains("system") && request["system"].is_string())
    system = request["system"].get<std::string>();
  return llm_prompt_text(system, user);
}

// Where two prompts part, for the stderr note: the first differing line.
void report_mismatch(int entry, const std::string& recorded, const std::string& received) {
  size_t at = 0;
  while (at < recorded.size() && at < received.size() && recorded[at] == received[at]) ++at;
  size_t start = recorded.rfind('\n', at == 0 ? 0 : at - 1);
  start = start == std::string::npos ? 0 : start + 1;
  int line = int(std::count(recorded.begin(), recorded.begin() + long(start), '\n')) + 1;
  auto line_at = [&](const std::string& s) { return s.substr(start, std::min<size_t>(s.find('\n', start) - start, 120)); };
  std::fprintf(stderr, "replay: request for entry %d: the prompt differs from the recorded one at line %d\n"
                       "  recorded: %s\n  received: %s\n",
               entry + 1, line, line_at(recorded).c_str(), start < received.size() ? line_at(received).c_str() : "");
}

std::string reply_body(const std::string& api, const ScriptedResponse& r, const std::string& model, int entry,
                       int tokens_in, int tokens_out) {
  std::string id = "replay-" + std::to_string(entry + 1);
  json j;
  if (api == "anthropic") {
    j = {{"id", id},
         {"type", "message"},
         {"role", "assistant"},
         {"model", model},
         {"content", json::array({{{"type", "text"}, {"text", r.content}}})},
         {"stop_reason", "end_turn"},
         {"usage", {{"input_tokens", tokens_in}, {"output_tokens", tokens_out}}}};
  } else {
    j = {{"id", id},
         {"object", "chat.completion"},
         {"model", model},
         {"choices", json::array({{{"index", 0},
                                   {"message", {{"role", "assistant"}, {"content", r.content}}},
                                   {"finish_reason", "stop"}}})},
         {"usage", {{"prompt_tokens", tokens_in}, {"completion_tokens", tokens_out},
                    {"total_tokens", tokens_in + tokens_out}}}};
  }
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

bool scripted_response_from_json(const json& j, ScriptedResponse* out, std::string* err) {
  if (!j.is_object()) {
    *err = "a scripted response must be a JSON object";
    return false;
  }
  ScriptedResponse r;
  for (auto& [key, v] : j.items()) {
    bool ok = true;
    if (key == "status") ok = v.is_number_integer() && (r.status = v.get<int>()) >= 100 && r.status < 600;
    else if (key == "content") ok = v.is_string() && (r.content = v.get<std::string>(), true);
    else if (key == "body") ok = v.is_string() && (r.body = v.get<std::string>(), true);
    else if (key == "delay_s") ok = v.is_number() && (r.delay_s = v.get<double>()) >= 0;
    else if (key == "retry_after") ok = v.is_number() && (r.retry_after_s = v.get<double>()) >= 0;
    else if (key == "tokens_in") ok = v.is_number_integer() && (r.tokens_in = v.get<int>()) >= 0;
    else if (key == "tokens_out") ok = v.is_number_integer() && (r.tokens_out = v.get<int>()) >= 0;
    else if (key == "prompt") ok = v.is_string() && (r.prompt = v.get<std::string>(), true);
    else {
      *err = "unknown field \"" + key + "\" (expected status, content, body, delay_s, retry_after, tokens_in, "
             "tokens_out, prompt)";
      return false;
    }
    if (!ok) {
      *err = "field \"" + key + "\" has a wrong type or value: " + v.dump();
      return false;
    }
  }
  *out = std::move(r);
  return true;
}

std::vector<ScriptedResponse> script_from_trace(const traces::TraceFile& trace) {
  std::vector<ScriptedResponse> script;
  for (const traces::Event& e : trace.events) {
    if (e.kind != "llm_call") continue;
    const std::string status = traces::data_string(e.data, "status");
    if (status == "budget") continue;
    ScriptedResponse r;
    r.prompt = traces::data_string(e.data, "prompt");
    if (status == "http_error" || status == "timeout") {
      r.status = 400;
      r.content = "the recorded call failed: " + status + ": " + traces::data_string(e.data, "error");
    } else if (traces::data_field(e.data, "reply_is_body").is_boolean() && e.data["reply_is_body"].get<bool>()) {
      r.body = traces::data_string(e.data, "reply");
    } else {
      r.content = traces::data_string(e.data, "reply");
      r.tokens_in = int(traces::data_int(e.data, "tokens_in"));
      r.tokens_out = int(traces::data_int(e.data, "tokens_out"));
    }
    script.push_back(std::move(r));
  }
  return script;
}

bool load_script(const std::string& path, std::vector<ScriptedResponse>* out, std::string* err) {
  std::string text;
  if (!read_file(path, &text, err)) return false;
  size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) {
    *err = path + " is empty";
    return false;
  }
  json head = json::parse(text.substr(first, text.find('\n', first) - first), nullptr, false);
  if (head.is_object() && head.contains("format")) {
    traces::TraceFile trace;
    if (!traces::parse_trace(text, &trace, err)) return false;
    *out = script_from_trace(trace);
    return true;
  }
  std::vector<ScriptedResponse> script;
  int line_no = 0;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    start = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j = json::parse(line, nullptr, false);
    ScriptedResponse r;
    std::string why = "not valid JSON";
    if (j.is_discarded() || !scripted_response_from_json(j, &r, &why)) {
      *err = path + ":" + std::to_string(line_no) + ": " + why;
      return false;
    }
    script.push_back(std::move(r));
  }
  *out = std::move(script);
  return true;
}

ReplayServer::ReplayServer(std::vector<ScriptedResponse> script) : script_(std::move(script)) {}

ReplayServer::~ReplayServer() {
  if (listen_fd_ >= 0) close(listen_fd_);
}

bool ReplayServer::bind(int port, std::string* err) {
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) {
    *err = std::string("socket: ") + std::strerror(errno);
    return false;
  }
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(uint16_t(port));
  socklen_t len = sizeof addr;
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(listen_fd_, 16) != 0 ||
      getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    *err = "cannot listen on 127.0.0.1:" + std::to_string(port) + ": " + std::strerror(errno);
    close(listen_fd_);
    listen_fd_ = -1;
    return false;
  }
  port_ = ntohs(addr.sin_port);
  return true;
}

void ReplayServer::serve(int max_requests) {
  std::vector<std::thread> connections;
  int accepted = 0;
  while (!stopping_ && (max_requests <= 0 || accepted < max_requests)) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    ++accepted;
    connections.emplace_back([this, fd] {
      handle(fd);
      close(fd);
    });
  }
  for (std::thread& t : connections) t.join();
}

std::vector<ServedRequest> ReplayServer::requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return requests_;
}

bool ReplayServer::sleep_unless_stopped(double seconds) const {
  const double end = mono_seconds() + seconds;
  while (!stopping_ && mono_seconds() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(50L, long((end - mono_seconds()) * 1000) + 1)));
  return !stopping_;
}

void ReplayServer::handle(int fd) {
  Request req;
  if (!read_request(fd, stopping_, &req)) return;
  ServedRequest seen;
  seen.path = req.path;
  seen.authorized = req.authorized;
  if (req.method == "POST" && ends_with(req.path, "/chat/completions")) seen.api = "openai";
  if (req.method == "POST" && ends_with(req.path, "/messages")) seen.api = "anthropic";
  json request = json::parse(req.body, nullptr, false);
  {
    // The entry is taken, and the request logged, on arrival: a slow answer
    // does not reorder the log.
    std::lock_guard<std::mutex> lock(mu_);
    if (!seen.api.empty() && next_ < script_.size()) seen.entry = int(next_++);
    seen.status = seen.entry < 0 ? 404 : script_[size_t(seen.entry)].status;
    if (seen.entry >= 0 && !script_[size_t(seen.entry)].prompt.empty() && request.is_object())
      seen.prompt_matches = request_prompt(seen.api, request) == script_[size_t(seen.entry)].prompt;
    requests_.push_back(seen);
  }
  if (seen.api.empty()) {
    send_response(fd, 404, error_body("ktune replay answers POST .../chat/completions and POST .../messages"), -1);
    return;
  }
  if (seen.entry < 0) {
    send_response(fd, 404, error_body("the replay script is used up (" + std::to_string(script_.size()) +
                                      " responses served)"), -1);
    return;
  }
  const ScriptedResponse& r = script_[size_t(seen.entry)];
  if (!seen.prompt_matches) report_mismatch(seen.entry, r.prompt, request_prompt(seen.api, request));
  if (!sleep_unless_stopped(r.delay_s)) return;
  std::string model = request.is_object() ? request.value("model", std::string("replay")) : "replay";
  int tokens_in = r.tokens_in >= 0 ? r.tokens_in : int(req.body.size() / 4);
  int tokens_out = r.tokens_out >= 0 ? r.tokens_out : int(r.content.size() / 4);
  std::string body = !r.body.empty()   ? r.body
                     : r.status == 200 ? reply_body(seen.api, r, model, seen.entry, tokens_in, tokens_out)
                                       : error_body(r.content.empty() ? "scripted status " + std::to_string(r.status)
                                                                      : r.content);
  send_response(fd, r.status, body, r.retry_after_s);
}

}  // namespace ktune::agent
