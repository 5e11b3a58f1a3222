// hybridkv._hybridkv: the native half of the Python module (python/hybridkv/__init__.py is the
// other). Binds the public C++ API only. Library errors become Python exceptions with the same
// messages; calls that can block or walk pages release the GIL; the hybrid manager, which the
// C++ API drives from one scheduler thread, is serialized by a mutex so that several Python
// threads may share it.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "cli.h"
#include "manager_calls.h"

namespace nb = nanobind;
using namespace nb::literals;

NB_MODULE(_hybridkv, m) {
  m.doc() = "hybridkv: cache memory manager for hybrid LLMs (native part)";
  // torch tensors made from pool views keep the manager alive, and interpreter shutdown does
  // not collect them in order: nanobind would report those as leaks at exit.
  nb::set_leak_warnings(false);
  hybridkv::python::bind_errors(m);
  hybridkv::python::bind_configs(m);
  hybridkv::python::bind_shared_fetch_future(m);
  hybridkv::python::bind_manager(m);
  hybridkv::python::bind_kv_cache(m);
  m.def(
      "run_cli",
      [](std::vector<std::string> argv) {
        std::vector<char*> args;
        for (std::string& a : argv) args.push_back(a.data());
        args.push_back(nullptr);
        return hybridkv::tools::run_cli(static_cast<int>(argv.size()), args.data());
      },
      "argv"_a, "Runs `hybridkv argv[1:]...` in this process; returns the exit code.");
}
