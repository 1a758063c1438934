// moesq — compress MoE experts to paired 4:8 NVFP4 and run them reproducibly.
#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "core/interrupt.h"

int main(int argc, char** argv) {
  // A file-size limit (ulimit -f) must surface as write() failing with EFBIG — an Error naming the
  // output, temporaries removed — not as SIGXFSZ killing the process mid-write (docs/RELIABILITY.md).
  ::signal(SIGXFSZ, SIG_IGN);
  // Ctrl-C / SIGTERM: the command's own temporaries are removed and it exits 128 + signal; compress
  // keeps OUT.work and says that --resume continues there (core/interrupt.h).
  moesq::install_interrupt_cleanup();
  CLI::App app{
      "moesq: compress the routed experts of Mixture-of-Experts models into paired 4:8 sparse NVFP4\n"
      "(2.75 bits/weight), evaluate them, and run them with reproducible grouped GEMMs.\n"
      "Run `moesq demo` for the main job on the embedded tiny Qwen3-MoE model."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "moesq 0.1.0");
  moesq::cli::register_inspect(app);
  moesq::cli::register_compress(app);
  moesq::cli::register_eval(app);
  moesq::cli::register_demo(app);
  moesq::cli::register_bench(app);
  moesq::cli::register_audit(app);
  moesq::cli::register_tokenize(app);
  moesq::cli::register_generate(app);
  moesq::cli::register_export(app);
  moesq::cli::register_serve(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    // CLI11 reports a missing subcommand before an unknown word; name the word the user typed.
    const auto extra = app.remaining(true);
    if (dynamic_cast<const CLI::RequiredError*>(&e) && !extra.empty()) {
      std::fprintf(stderr, "moesq: error: unknown command or argument '%s' (see moesq --help)\n", extra.front().c_str());
      return 1;
    }
    // A flag error reads like every other error of moesq and exits 1 like them (CLI11's own codes
    // 105, 106, ... and its unprefixed text would be a second style); the hint names the innermost
    // subcommand that was parsed.
    std::string where = "moesq";
    for (const CLI::App* sub = &app; !sub->get_subcommands().empty();) {
      sub = sub->get_subcommands().front();
      where += " " + sub->get_name();
    }
    std::fprintf(stderr, "moesq: error: %s (see %s --help)\n", e.what(), where.c_str());
    return 1;
  } catch (const moesq::Error& e) {
    std::fprintf(stderr, "moesq: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moesq: internal error: %s\n", e.what());
    return 2;
  }
  // The result on stdout is the output of inspect / eval / tokenize / --json: a write that failed
  // (full disk, closed pipe reader, /dev/full) is an error, not exit 0 with a truncated result.
  errno = 0;
  std::cout.flush();
  if (std::fflush(stdout) != 0 || std::ferror(stdout) || !std::cout) {
    const int err = errno;
    std::fprintf(stderr, "moesq: error: cannot write standard output (%s)\n", err ? std::strerror(err) : "write error");
    return 1;
  }
  return 0;
}
