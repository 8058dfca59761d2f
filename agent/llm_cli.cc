// The command line of the LLM designer: the --llm-* flags of `ktune run`,
// which fill the designer's options (never the API key: that comes from the
// environment only), and `ktune replay FILE --serve`, which answers the LLM
// APIs on loopback from a recorded session or a script (docs/llm.md).
#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdio>

#include "agent/commands.h"
#include "agent/replay_server.h"

namespace ktune::agent {

namespace {

// Each flag fills options[key] only when given, so the designer's defaults
// (and a resumed session's recorded options) apply otherwise.
template <typename T>
void add_option(CLI::App* run, json* options, const std::string& flag, const char* key, const std::string& help) {
  run->add_option_function<T>(flag, [options, key](const T& value) { (*options)[key] = value; }, help);
}

struct ServeOptions {
  bool serve = false;
  int port = 0;
  std::string api = "openai";
  int max_requests = 0;
};
ServeOptions g_serve;
ReplayServer* g_server = nullptr;  // for the signal handler

void stop_serving(int) {
  if (g_server) g_server->stop();
}

}  // namespace

void add_llm_options(CLI::App* run, json* options) {
  add_option<std::string>(run, options, "--llm-api", "api", "with --designer llm: openai (chat completions) or anthropic");
  add_option<std::string>(run, options, "--llm-url", "url",
                          "the API's base URL, e.g. http://127.0.0.1:8000/v1 (default: the provider's own)");
  add_option<std::string>(run, options, "--llm-model", "model", "the model name the API expects");
  add_option<int>(run, options, "--llm-max-calls", "max_calls", "at most this many model calls (0: no limit)");
  add_option<long>(run, options, "--llm-token-budget", "token_budget", "at most this many tokens in + out (0: no limit)");
  add_option<double>(run, options, "--llm-time-budget", "time_budget_s",
                     "at most this many seconds waiting for the model (0: no limit)");
  add_option<double>(run, options, "--llm-timeout", "timeout_s", "seconds one HTTP request may take (default 120)");
  add_option<double>(run, options, "--llm-temperature", "temperature", "sampling temperature (default 0.2)");
  add_option<int>(run, options, "--llm-max-tokens", "max_tokens", "the reply's length limit in tokens (default 8192)");
  add_option<int>(run, options, "--llm-max-retries", "max_retries",
                  "further tries of a call after a 429, 5xx, connection error or timeout (default 3)");
  add_option<int>(run, options, "--llm-source-chars", "source_chars",
                  "how much of the best's source the prompt shows (default 64000; 0: knob settings only)");
}

void add_replay_serve_options(CLI::App* replay) {
  replay->add_flag("--serve", g_serve.serve,
                   "answer the LLM APIs on 127.0.0.1 with the recorded replies (or a script's responses)");
  replay->add_option("--port", g_serve.port, "with --serve: the port (0: a free one, printed)")->default_val(0);
  replay->add_option("--api", g_serve.api, "with --serve: the API the client speaks (both paths are answered)")
      ->check(CLI::IsMember({"openai", "anthropic"}))
      ->default_val("openai");
  replay->add_option("--max-requests", g_serve.max_requests, "with --serve: exit after this many requests (0: never)")
      ->default_val(0);
}

bool replay_serve_requested(CLI::App*) { return g_serve.serve; }

int run_replay_serve(CLI::App*, const std::string& trace_path) {
  std::vector<ScriptedResponse> script;
  std::string err;
  if (!load_script(trace_path, &script, &err)) {
    std::fprintf(stderr, "ktune: %s\n", err.c_str());
    return 1;
  }
  ReplayServer server(std::move(script));
  if (!server.bind(g_serve.port, &err)) {
    std::fprintf(stderr, "ktune: %s\n", err.c_str());
    return 1;
  }
  g_server = &server;
  std::signal(SIGINT, stop_serving);
  std::signal(SIGTERM, stop_serving);
  const char* path = g_serve.api == "anthropic" ? "/v1/messages" : "/chat/completions";
  std::printf("serving on http://127.0.0.1:%d\n", server.port());
  std::printf("  %s API: POST http://127.0.0.1:%d%s; use --llm-api %s --llm-url http://127.0.0.1:%d\n",
              g_serve.api.c_str(), server.port(), path, g_serve.api.c_str(), server.port());
  std::fflush(stdout);
  server.serve(g_serve.max_requests);
  g_server = nullptr;
  int answered = 0, mismatched = 0;
  for (const ServedRequest& r : server.requests()) {
    answered += r.entry >= 0;
    mismatched += !r.prompt_matches;
  }
  std::printf("answered %d request(s) from the script, %zu in all; %d prompt(s) differed from the recording\n",
              answered, server.requests().size(), mismatched);
  return 0;
}

}  // namespace ktune::agent
