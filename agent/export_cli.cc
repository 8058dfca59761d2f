// Placeholder until `ktune export` lands (issue 6).
#include <CLI/CLI.hpp>

#include "agent/commands.h"

namespace ktune::agent {

void add_export_command(CLI::App*, int*) {}

}  // namespace ktune::agent
