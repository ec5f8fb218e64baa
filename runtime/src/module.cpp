// The mk._runtime extension module: build information now; the executors grow here.
#include <pybind11/pybind11.h>

#include <thread>

#include "mk/version.h"

namespace py = pybind11;

PYBIND11_MODULE(_runtime, m) {
  m.doc() = "mk C++ runtime";
  m.attr("__version__") = MK_VERSION;
  m.attr("abi") = MK_RUNTIME_ABI;
  m.def(
      "build_info",
      [] {
        py::dict d;
        d["version"] = MK_VERSION;
        d["abi"] = MK_RUNTIME_ABI;
        d["compiler"] = MK_COMPILER;
        d["build_type"] = MK_BUILD_TYPE;
        d["cplusplus"] = static_cast<long>(__cplusplus);
        return d;
      },
      "Version, ABI and compiler the runtime was built with.");
  m.def(
      "hardware_threads", [] { return std::thread::hardware_concurrency(); },
      "Number of hardware threads the CPU executor can use.");
}
