// The hybridkv command line: `plan` and `sim` (run_cli; the Python module calls it too).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "cli.h"
#include "plan_command.h"
#include "sim.h"

namespace hybridkv::tools {
namespace {

// Edit distance, for "did you mean" on a mistyped subcommand.
size_t distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// " (did you mean 'sim'?)" when the first argument is close to a subcommand.
std::string suggestion(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return "";
  const std::string typed = argv[1];
  for (const char* name : {"plan", "sim"}) {
    if (typed != name && distance(typed, name) <= 2) {
      return std::string(" (did you mean '") + name + "'?)";
    }
  }
  return "";
}

}  // namespace

int run_cli(int argc, char** argv) {
  CLI::App app{"hybridkv: cache memory manager for hybrid LLMs"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "hybridkv " HYBRIDKV_VERSION);
  app.option_defaults()->always_capture_default();  // --help shows every default
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
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string line = e.what();
    for (char& c : line) {
      if (c == '\n') c = ' ';
    }
    std::fprintf(stderr, "hybridkv: %s%s (see --help)\n", line.c_str(),
                 suggestion(argc, argv).c_str());
    return 2;
  }
  if (app.got_subcommand("plan")) return hybridkv::tools::run_plan_command(plan);
  if (app.got_subcommand("sim")) return hybridkv::tools::run_sim_command(sim);
  return 2;
}

}  // namespace hybridkv::tools
