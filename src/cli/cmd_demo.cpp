// `moesq demo` — placeholder registration until the subcommand lands.
#include "cli/commands.h"
#include "core/error.h"

namespace moesq::cli {

void register_demo(CLI::App& app) {
  auto* cmd = app.add_subcommand("demo", "(not built yet)");
  cmd->callback([] { MOESQ_FAIL("moesq demo is not available in this build"); });
}

}  // namespace moesq::cli
