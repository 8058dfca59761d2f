// The HTTP client and the two provider adapters of the LLM designer (see
// llm_client.h).
#include "agent/llm_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "base/clock.h"
#include "base/json.h"

namespace ktune::agent {

namespace {

// The longest wait a Retry-After header may ask for, and between tries.
constexpr double kMaxWaitS = 30;
// What a "malformed" reply keeps of the body it could not read.
constexpr size_t kMalformedKeep = 4000;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

size_t append_body(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

// Keeps the Retry-After header (seconds; the HTTP-date form is ignored and
// the usual backoff applies).
size_t read_header(char* data, size_t size, size_t n, void* user) {
  std::string line(data, size * n);
  const std::string name = "retry-after:";
  std::string lower = line.substr(0, name.size());
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  if (lower == name) {
    char* end = nullptr;
    double v = std::strtod(line.c_str() + name.size(), &end);
    if (end != line.c_str() + name.size() && v >= 0) static_cast<HttpResponse*>(user)->retry_after_s = v;
  }
  return size * n;
}

// Transport failures that another try may get past; a malformed URL or an
// unsupported scheme will not.
bool retryable(CURLcode code) {
  switch (code) {
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_URL_MALFORMAT:
    case CURLE_NOT_BUILT_IN:
    case CURLE_BAD_FUNCTION_ARGUMENT:
    case CURLE_OUT_OF_MEMORY:
      return false;
    default:
      return true;
  }
}

std::string first_nonempty_env(std::initializer_list<const char*> names) {
  for (const char* n : names) {
    const char* v = std::getenv(n);
    if (v && *v) return v;
  }
  return "";
}

// A retryable HTTP status: rate limited, or the server's own trouble.
bool retryable_status(long status) { return status == 429 || status >= 500; }

}  // namespace

HttpResponse http_post_json(const std::string& url, const std::vector<std::string>& headers,
                            const std::string& body, double timeout_s) {
  static std::once_flag curl_ready;
  std::call_once(curl_ready, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  HttpResponse r;
  CURL* curl = curl_easy_init();
  if (!curl) {
    r.error = "cannot start libcurl";
    return r;
  }
  curl_slist* list = curl_slist_append(nullptr, "Content-Type: application/json");
  // Without this, libcurl holds a large body back for a second waiting for
  // "100 Continue", which servers of these APIs do not send.
  list = curl_slist_append(list, "Expect:");
  for (const std::string& h : headers) list = curl_slist_append(list, h.c_str());
  char error_text[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_POST, 1L);
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.data());
  curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(body.size()));
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, list);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, long(std::max(1.0, timeout_s * 1000)));
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, long(std::max(1.0, std::min(timeout_s, 30.0) * 1000)));
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // timeouts without SIGALRM (the session has threads)
  curl_easy_setopt(curl, CURLOPT_NOPROXY, "localhost,127.0.0.1,::1");
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, append_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &r.body);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, read_header);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &r);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error_text);
  CURLcode code = curl_easy_perform(curl);
  if (code == CURLE_OK) {
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &r.status);
  } else {
    r.timed_out = code == CURLE_OPERATION_TIMEDOUT;
    r.retryable = retryable(code);
    r.error = error_text[0] ? error_text : curl_easy_strerror(code);
    r.body.clear();
  }
  curl_slist_free_all(list);
  curl_easy_cleanup(curl);
  return r;
}

std::string llm_endpoint(const std::string& api, const std::string& url) {
  std::string base = url;
  if (base.empty()) base = api == "anthropic" ? "https://api.anthropic.com" : "https://api.openai.com/v1";
  while (!base.empty() && base.back() == '/') base.pop_back();
  if (api == "anthropic") {
    if (ends_with(base, "/messages")) return base;
    return base + (ends_with(base, "/v1") ? "/messages" : "/v1/messages");
  }
  return ends_with(base, "/chat/completions") ? base : base + "/chat/completions";
}

std::string llm_prompt_text(const std::string& system, const std::string& user) {
  return "[system]\n" + system + "\n[user]\n" + user;
}

bool LlmClient::init(const LlmClientOptions& options, std::string* err) {
  if (options.api != "openai" && options.api != "anthropic") {
    *err = "unknown LLM API '" + options.api + "' (expected openai or anthropic)";
    return false;
  }
  if (options.timeout_s <= 0) {
    *err = "the LLM request timeout must be positive (--llm-timeout)";
    return false;
  }
  if (options.model.empty()) {
    *err = "the llm designer needs a model name (--llm-model)";
    return false;
  }
  options_ = options;
  endpoint_ = llm_endpoint(options.api, options.url);
  key_ = first_nonempty_env(
      {"KTUNE_LLM_API_KEY", options.api == "anthropic" ? "ANTHROPIC_API_KEY" : "OPENAI_API_KEY"});
  return true;
}

std::string LlmClient::request_body(const std::string& system, const std::string& user) const {
  json body = {{"model", options_.model}, {"max_tokens", options_.max_tokens}, {"temperature", options_.temperature}};
  if (options_.api == "anthropic") {
    body["system"] = system;
    body["messages"] = json::array({{{"role", "user"}, {"content", user}}});
  } else {
    body["messages"] = json::array({{{"role", "system"}, {"content", system}}, {{"role", "user"}, {"content", user}}});
  }
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::vector<std::string> LlmClient::headers() const {
  if (options_.api == "anthropic") {
    std::vector<std::string> h = {"anthropic-version: 2023-06-01"};
    if (!key_.empty()) h.push_back("x-api-key: " + key_);
    return h;
  }
  if (key_.empty()) return {};
  return {"Authorization: Bearer " + key_};
}

// The text and token counts of a 200's body, in the provider's shape.
bool LlmClient::parse_reply(const std::string& body, LlmReply* out) const {
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return false;
  const bool anthropic = options_.api == "anthropic";
  if (anthropic) {
    // content is a list of blocks; the answer is the text ones.
    auto content = j.find("content");
    if (content == j.end() || !content->is_array()) return false;
    out->text.clear();
    for (const json& block : *content)
      if (block.is_object() && block.value("type", "") == "text" && block.contains("text") &&
          block["text"].is_string())
        out->text += block["text"].get<std::string>();
  } else {
    auto choices = j.find("choices");
    if (choices == j.end() || !choices->is_array() || choices->empty() || !(*choices)[0].is_object()) return false;
    const json& message = (*choices)[0].value("message", json::object());
    auto content = message.find("content");
    if (content == message.end()) return false;
    // null content is an empty answer (a model that only "thought").
    out->text = content->is_string() ? content->get<std::string>() : "";
  }
  const json usage = j.value("usage", json::object());
  auto count = [&](const char* name) {
    auto it = usage.find(name);
    return it != usage.end() && it->is_number() ? it->get<int>() : 0;
  };
  out->tokens_in = count(anthropic ? "input_tokens" : "prompt_tokens");
  out->tokens_out = count(anthropic ? "output_tokens" : "completion_tokens");
  return true;
}

LlmReply LlmClient::complete(const std::string& system, const std::string& user, double deadline_s) const {
  const double t0 = mono_seconds(), deadline = t0 + deadline_s;
  const std::string body = request_body(system, user);
  const std::vector<std::string> hdrs = headers();
  LlmReply reply;
  for (int attempt = 0;; ++attempt) {
    double left = deadline - mono_seconds();
    HttpResponse r = http_post_json(endpoint_, hdrs, body, std::min(options_.timeout_s, left));
    reply.http_status = r.status;
    reply.retries = attempt;
    reply.error.clear();  // only the last try's failure counts
    bool again;
    if (r.status == 200) {
      reply.status = parse_reply(r.body, &reply) ? "ok" : "malformed";
      if (reply.status == "malformed") {
        reply.text = r.body.substr(0, kMalformedKeep);
        reply.error = "the response is not a " +
                      std::string(options_.api == "anthropic" ? "Messages API reply" : "chat completion");
      }
      again = false;
    } else if (r.status != 0) {
      reply.status = "http_error";
      reply.error = "HTTP " + std::to_string(r.status) + ": " + r.body.substr(0, 300);
      again = retryable_status(r.status);
    } else {
      reply.status = r.timed_out ? "timeout" : "http_error";
      reply.error = r.error;
      again = r.retryable;
    }
    if (!again || attempt >= options_.max_retries) break;
    // Exponential backoff (0.5 s, 1 s, 2 s, ...), or what the server asks
    // for, within limits and before the deadline.
    double wait = r.retry_after_s >= 0 ? r.retry_after_s : 0.5 * std::pow(2.0, attempt);
    wait = std::min(wait, kMaxWaitS);
    if (mono_seconds() + wait + 0.1 >= deadline) break;
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
  }
  reply.latency_s = mono_seconds() - t0;
  return reply;
}

}  // namespace ktune::agent
