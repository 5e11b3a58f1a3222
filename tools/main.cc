// The hybridkv command line: `plan` and `sim`.
#include "cli.h"

int main(int argc, char** argv) { return hybridkv::tools::run_cli(argc, argv); }
