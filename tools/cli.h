// The whole command line (`hybridkv plan|sim ...`); returns the exit code.
#pragma once

namespace hybridkv::tools {

int run_cli(int argc, char** argv);

}  // namespace hybridkv::tools
