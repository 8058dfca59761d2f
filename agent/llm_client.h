// The LLM designer's line to a language model: a small HTTP client over
// libcurl and the two API shapes ktune speaks, OpenAI-compatible chat
// completions (OpenAI, vLLM, llama.cpp's server, Ollama) and the Anthropic
// Messages API. A call retries with backoff on 429, 5xx, connection errors
// and timeouts. The API key is read from the environment here and kept in
// the client: no result, error text or log line carries it.
#pragma once
#include <string>
#include <vector>

namespace ktune::agent {

// ---- HTTP -------------------------------------------------------------------

struct HttpResponse {
  long status = 0;             // 0 when no response arrived
  std::string body;
  double retry_after_s = -1;   // the Retry-After header in seconds, -1 when absent
  bool timed_out = false;      // the request ran past its timeout
  bool retryable = false;      // a transport failure worth another try (refused, reset, timed out, ...)
  std::string error;           // why no response arrived (libcurl's words, without headers)
};

// POSTs a JSON body. `headers` are "Name: value" lines. Loopback addresses
// bypass any proxy of the environment.
HttpResponse http_post_json(const std::string& url, const std::vector<std::string>& headers,
                            const std::string& body, double timeout_s);

// ---- the model ------------------------------------------------------------------

struct LlmClientOptions {
  std::string api = "openai";  // "openai" (chat completions) or "anthropic" (messages)
  std::string url;             // base URL; empty: the provider's public endpoint
  std::string model;
  double timeout_s = 120;      // per HTTP request
  double temperature = 0.2;
  int max_tokens = 8192;       // the reply's length limit
  int max_retries = 3;         // further tries after the first one fails with a retryable error
};

struct LlmReply {
  // "ok" (a reply in the provider's shape; its text may still be empty),
  // "malformed" (a 200 whose body is not the provider's shape),
  // "http_error" (an error status, or no response, after the retries),
  // "timeout" (the last try ran past its timeout).
  std::string status;
  std::string text;            // the model's answer; for "malformed", the start of the body
  long http_status = 0;
  int tokens_in = 0, tokens_out = 0;
  double latency_s = 0;        // every try and every wait between them
  int retries = 0;
  std::string error;
};

class LlmClient {
 public:
  // Checks the options and reads the key from the environment:
  // KTUNE_LLM_API_KEY, else OPENAI_API_KEY or ANTHROPIC_API_KEY by api. No
  // key is fine (local servers).
  bool init(const LlmClientOptions& options, std::string* err);
  // One completion. Retries stop at `deadline_s` seconds from now, and no
  // request runs past it.
  LlmReply complete(const std::string& system, const std::string& user, double deadline_s) const;
  const std::string& endpoint() const { return endpoint_; }  // the URL posted to
  const LlmClientOptions& options() const { return options_; }

 private:
  LlmClientOptions options_;
  std::string key_;
  std::string endpoint_;
  std::string request_body(const std::string& system, const std::string& user) const;
  std::vector<std::string> headers() const;
  bool parse_reply(const std::string& body, LlmReply* out) const;
};

// The endpoint for a provider and a base URL: {url}/chat/completions or
// {url}/v1/messages, or the URL as given when it already names that path.
std::string llm_endpoint(const std::string& api, const std::string& url);

// One text for the system and user messages of a request, as the LLM
// designer records it and the replay server compares it.
std::string llm_prompt_text(const std::string& system, const std::string& user);

}  // namespace ktune::agent
