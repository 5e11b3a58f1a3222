// The hybridkv command line: `plan` (and, later, `sim` and `bench`).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "plan_command.h"
#include "sim.h"

int main(int argc, char** argv) {
  CLI::App app{"hybridkv: cache memory manager for hybrid LLMs"};
  app.require_subcommand(1);
  hybridkv::tools::PlanOptions plan;
  hybridkv::tools::add_plan_command(app, plan);
  hybridkv::tools::SimOptions sim;
  hybridkv::tools::add_sim_command(app, sim);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string line = e.what();
    for (char& c : line) {
      if (c == '\n') c = ' ';
    }
    std::fprintf(stderr, "hybridkv: %s (see --help)\n", line.c_str());
    return 2;
  }
  if (app.got_subcommand("plan")) return hybridkv::tools::run_plan_command(plan);
  if (app.got_subcommand("sim")) return hybridkv::tools::run_sim_command(sim);
  return 2;
}
