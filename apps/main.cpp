// kvserve: the command-line front end. Subcommands are registered from cmd_*.cpp.
#include <cstdio>
#include <exception>

#include "apps/commands.h"
#include "kernels/openmp_wait.h"

int main(int argc, char** argv) {
  kvserve::reexec_with_passive_openmp_wait(argv);
  CLI::App app{"kvserve: an LLM inference engine and server"};
  app.require_subcommand(1);
  kvserve::cli::register_info(app);
  kvserve::cli::register_run(app);
  kvserve::cli::register_convert(app);
  kvserve::cli::register_synth(app);
  kvserve::cli::register_kv_size(app);
  kvserve::cli::register_bench(app);
  kvserve::cli::register_perplexity(app);
  kvserve::cli::register_serve(app);
  kvserve::cli::register_quantize(app);
  kvserve::cli::register_ladder(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvserve: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
