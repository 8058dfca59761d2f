// Placeholder until the LLM designer lands (issue 5): no extra flags.
#include <CLI/CLI.hpp>

#include "agent/commands.h"

namespace ktune::agent {

void add_llm_options(CLI::App*, json*) {}
void add_replay_serve_options(CLI::App*) {}
bool replay_serve_requested(CLI::App*) { return false; }
int run_replay_serve(CLI::App*, const std::string&) { return 1; }

}  // namespace ktune::agent
