// `moesq inspect` — placeholder registration until the subcommand lands.
#include "cli/commands.h"
#include "core/error.h"

namespace moesq::cli {

void register_inspect(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "(not built yet)");
  cmd->callback([] { MOESQ_FAIL("moesq inspect is not available in this build"); });
}

}  // namespace moesq::cli
