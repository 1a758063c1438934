// `moesq compress` — placeholder registration until the subcommand lands.
#include "cli/commands.h"
#include "core/error.h"

namespace moesq::cli {

void register_compress(CLI::App& app) {
  auto* cmd = app.add_subcommand("compress", "(not built yet)");
  cmd->callback([] { MOESQ_FAIL("moesq compress is not available in this build"); });
}

}  // namespace moesq::cli
