// `ktune export --db F <variant> | --knobs JSON [--size S], --format torch-module --out DIR [--force]`:
// the command line of agent/export.h.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>

#include "agent/commands.h"
#include "agent/export.h"

namespace ktune::agent {

void add_export_command(CLI::App* app, int* rc) {
  auto opts = std::make_shared<ExportOptions>();  // lives as long as the callback
  auto* cmd = app->add_subcommand("export", "a recorded CUDA megakernel variant as a drop-in PyTorch module");
  cmd->add_option("--db", opts->db, "the database holding the variant")->default_val("ktune.sqlite");
  cmd->add_option("variant", opts->variant, "variant id, a unique prefix, or best (the latest session's best)");
  cmd->add_option("--knobs", opts->knobs,
                  "instead of a recorded variant: the CUDA megakernel at these knobs (JSON; {} = the defaults)");
  cmd->add_option("--size", opts->size, "with --knobs: the config preset (full, small, tiny, top8)")
      ->default_val("full");
  cmd->add_option("--format", opts->format, "torch-module: solution.py + kernel.cu + kimi_ext.cu + eager.py + ...")
      ->default_val("torch-module");
  cmd->add_option("--out", opts->out_dir, "the directory to write (created; must be empty unless --force)")
      ->required();
  cmd->add_flag("--force", opts->force, "write into a non-empty directory, replacing the exported files");
  cmd->callback([opts, rc] {
    std::string summary, err;
    if (!export_variant(*opts, &summary, &err)) {
      std::fprintf(stderr, "ktune export: %s\n", err.c_str());
      *rc = 1;
      return;
    }
    std::printf("%s\n", summary.c_str());
    *rc = 0;
  });
}

}  // namespace ktune::agent
