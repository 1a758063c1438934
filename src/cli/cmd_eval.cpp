// `moesq eval` — placeholder registration until the subcommand lands.
#include "cli/commands.h"
#include "core/error.h"

namespace moesq::cli {

void register_eval(CLI::App& app) {
  auto* cmd = app.add_subcommand("eval", "(not built yet)");
  cmd->callback([] { MOESQ_FAIL("moesq eval is not available in this build"); });
}

}  // namespace moesq::cli
