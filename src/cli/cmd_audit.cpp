// `moesq audit` — placeholder registration until the subcommand lands.
#include "cli/commands.h"
#include "core/error.h"

namespace moesq::cli {

void register_audit(CLI::App& app) {
  auto* cmd = app.add_subcommand("audit", "(not built yet)");
  cmd->callback([] { MOESQ_FAIL("moesq audit is not available in this build"); });
}

}  // namespace moesq::cli
