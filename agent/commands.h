// The parts of the command line that belong to optional capabilities,
// registered by their own files: the LLM designer's flags and the replay
// server (llm_cli.cc), and `ktune export` (export_cli.cc).
#pragma once
#include <string>

#include "base/json.h"

namespace CLI {
class App;
}

namespace ktune::agent {

// --llm-api, --llm-url, --llm-model, ... on `ktune run`; they fill `options`.
void add_llm_options(CLI::App* run, json* options);
// `ktune replay --serve ...`: answers the recorded session's LLM calls on loopback.
void add_replay_serve_options(CLI::App* replay);
bool replay_serve_requested(CLI::App* replay);
int run_replay_serve(CLI::App* replay, const std::string& trace_path);
// `ktune export --db F <variant> --format torch-module --out DIR`.
void add_export_command(CLI::App* app, int* rc);

}  // namespace ktune::agent
