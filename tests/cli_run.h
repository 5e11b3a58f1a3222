// Runs the `hybridkv` CLI (HKV_CLI) as a user would and returns its exit code, stdout and
// stderr: the CLI tests' one way to call it.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace hybridkv::testing {

struct CliRun {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A file name under $TMPDIR (or /tmp) unique to this process.
inline std::string scratch(const std::string& name) {
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp ? tmp : "/tmp") + "/hkv_cli_" + std::to_string(getpid()) + "_" + name;
}

inline CliRun run_cli(const std::string& args) {
  const std::string out = scratch("out"), err = scratch("err");
  const int status =
      std::system((std::string(HKV_CLI) + " " + args + " >" + out + " 2>" + err).c_str());
  CliRun r{WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out), slurp(err)};
  std::remove(out.c_str());
  std::remove(err.c_str());
  return r;
}

}  // namespace hybridkv::testing
