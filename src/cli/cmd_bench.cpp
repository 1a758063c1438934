// `moesq bench` — placeholder registration until the subcommand lands.
#include "cli/commands.h"
#include "core/error.h"

namespace moesq::cli {

void register_bench(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "(not built yet)");
  cmd->callback([] { MOESQ_FAIL("moesq bench is not available in this build"); });
}

}  // namespace moesq::cli
