// The mk._runtime extension module: build information, table layouts and the CPU executor.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cpu_executor.h"
#include "mk/tables.h"
#include "mk/version.h"

namespace py = pybind11;

namespace {

// mk._runtime.DeadlockError: a RuntimeError that also carries the RunStatus fields.
PyObject* deadlock_error_type = nullptr;

py::buffer_info request(const py::handle& obj, const std::string& table, bool writable) {
  if (!PyObject_CheckBuffer(obj.ptr()))
    throw mk::TableError(table + ": expected a NumPy array (see mk.runtime_tables), got " +
                         std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
  return py::reinterpret_borrow<py::buffer>(obj).request(writable);
}

// Copies a 1-D contiguous array whose rows are exactly T (the dtypes of mk.runtime_tables).
template <class T>
std::vector<T> rows(const py::handle& obj, const std::string& table) {
  py::buffer_info info = request(obj, table, false);
  if (info.ndim != 1) throw mk::TableError(table + ": expected a 1-D array");
  if (info.itemsize != static_cast<py::ssize_t>(sizeof(T)))
    throw mk::TableError(table + ": rows are " + std::to_string(info.itemsize) + " bytes, the C layout has " +
                         std::to_string(sizeof(T)));
  if (info.shape[0] > 1 && info.strides[0] != static_cast<py::ssize_t>(sizeof(T)))
    throw mk::TableError(table + ": array is not contiguous");
  std::vector<T> out(static_cast<size_t>(info.shape[0]));
  if (!out.empty()) std::memcpy(out.data(), info.ptr, out.size() * sizeof(T));
  return out;
}

std::vector<int32_t> int32_rows(const py::handle& obj, const std::string& table) {
  py::buffer_info info = request(obj, table, false);
  const std::string& f = info.format;
  if (!(f == "i" || f == "<i" || f == "=i" || (f == "l" && sizeof(long) == 4)))
    throw mk::TableError(table + ": expected an int32 array, got format '" + f + "'");
  return rows<int32_t>(obj, table);
}

py::dict layout(size_t size, std::initializer_list<std::pair<const char*, size_t>> fields) {
  py::dict d, offsets;
  for (const auto& [name, offset] : fields) offsets[name] = offset;
  d["size"] = size;
  d["fields"] = offsets;
  return d;
}

#define MK_FIELD(T, f) std::pair<const char*, size_t>(#f, offsetof(T, f))

py::dict table_layouts() {
  using namespace mk;
  py::dict d;
  d["TaskDesc"] = layout(sizeof(TaskDesc), {MK_FIELD(TaskDesc, kind), MK_FIELD(TaskDesc, grid),
                                            MK_FIELD(TaskDesc, coord), MK_FIELD(TaskDesc, wait_begin),
                                            MK_FIELD(TaskDesc, wait_end), MK_FIELD(TaskDesc, signal_begin),
                                            MK_FIELD(TaskDesc, signal_end), MK_FIELD(TaskDesc, args)});
  d["WaitDesc"] = layout(sizeof(WaitDesc), {MK_FIELD(WaitDesc, counter), MK_FIELD(WaitDesc, count),
                                            MK_FIELD(WaitDesc, distance)});
  d["SignalDesc"] = layout(sizeof(SignalDesc), {MK_FIELD(SignalDesc, counter), MK_FIELD(SignalDesc, tail),
                                                MK_FIELD(SignalDesc, count)});
  d["BufferDesc"] = layout(sizeof(BufferDesc),
                           {MK_FIELD(BufferDesc, offset_or_ptr), MK_FIELD(BufferDesc, bytes),
                            MK_FIELD(BufferDesc, dtype), MK_FIELD(BufferDesc, rank), MK_FIELD(BufferDesc, kind),
                            MK_FIELD(BufferDesc, reserved), MK_FIELD(BufferDesc, shape)});
  d["GraphHeader"] = layout(
      sizeof(GraphHeader),
      {MK_FIELD(GraphHeader, abi), MK_FIELD(GraphHeader, num_tasks), MK_FIELD(GraphHeader, num_waits),
       MK_FIELD(GraphHeader, num_signals), MK_FIELD(GraphHeader, num_sms), MK_FIELD(GraphHeader, num_counters),
       MK_FIELD(GraphHeader, num_buffers), MK_FIELD(GraphHeader, iterations), MK_FIELD(GraphHeader, arena_bytes)});
  d["RunStatus"] = layout(sizeof(RunStatus),
                          {MK_FIELD(RunStatus, error), MK_FIELD(RunStatus, sm), MK_FIELD(RunStatus, task),
                           MK_FIELD(RunStatus, counter), MK_FIELD(RunStatus, iteration), MK_FIELD(RunStatus, value),
                           MK_FIELD(RunStatus, threshold), MK_FIELD(RunStatus, wait_ms)});
  return d;
}

// None, a KernelLibrary, or a path (str or os.PathLike) to load one from.
std::shared_ptr<const mk::KernelLibrary> as_library(const py::object& library) {
  if (library.is_none()) return nullptr;
  if (py::isinstance<mk::KernelLibrary>(library)) return library.cast<std::shared_ptr<mk::KernelLibrary>>();
  const std::string path = py::str(py::module_::import("os").attr("fspath")(library));
  return std::make_shared<mk::KernelLibrary>(path);
}

mk::CpuExecutor make_executor(const py::handle& tasks, const py::handle& waits, const py::handle& signals,
                              const py::handle& queue_offsets, const py::handle& queue_tasks,
                              const py::handle& buffers, int32_t num_counters, int32_t iterations,
                              uint64_t arena_bytes, const py::object& library) {
  mk::Tables t;
  t.tasks = rows<mk::TaskDesc>(tasks, "tasks");
  t.waits = rows<mk::WaitDesc>(waits, "waits");
  t.signals = rows<mk::SignalDesc>(signals, "signals");
  t.queue_offsets = int32_rows(queue_offsets, "queue_offsets");
  t.queue_tasks = int32_rows(queue_tasks, "queue_tasks");
  if (!buffers.is_none()) t.buffers = rows<mk::BufferDesc>(buffers, "buffers");
  t.num_counters = num_counters;
  t.iterations = iterations;
  t.arena_bytes = arena_bytes;
  return mk::CpuExecutor(std::move(t), as_library(library));
}

// `buffers` is a list (one entry per buffer row, None = place in the arena) or one arena object.
py::object run(const mk::CpuExecutor& exec, const py::object& buffers, const py::object& arena,
               int32_t iterations, int32_t num_threads, int64_t timeout_ms, int32_t max_delay_us,
               uint64_t seed, const py::object& timeline) {
  std::vector<py::buffer_info> held;  // keeps the Python buffers alive and pinned while running
  std::vector<mk::BufferBinding> bindings;
  void* arena_ptr = nullptr;
  uint64_t arena_size = 0;
  // Inputs and weights may be read-only arrays; whatever a task may write must be writable.
  auto hold = [&](const py::handle& obj, const std::string& what, bool writable) {
    held.push_back(request(obj, what, false));
    const py::buffer_info& info = held.back();
    if (writable && info.readonly) throw mk::TableError(what + ": is read-only but tasks write it");
    for (py::ssize_t d = info.ndim - 1, expect = info.itemsize; d >= 0; expect *= info.shape[d], --d)
      if (info.shape[d] > 1 && info.strides[d] != expect) throw mk::TableError(what + ": not C-contiguous");
    return mk::BufferBinding{info.ptr, static_cast<uint64_t>(info.size * info.itemsize)};
  };
  py::object arena_obj = arena;
  if (py::isinstance<py::list>(buffers) || py::isinstance<py::tuple>(buffers)) {
    const auto& descs = exec.tables().buffers;
    size_t i = 0;
    for (const py::handle& b : buffers) {
      const bool writable = i >= descs.size() || (descs[i].kind != mk::BUF_INPUT && descs[i].kind != mk::BUF_WEIGHT);
      const std::string what = "buffers[" + std::to_string(i++) + "]";
      bindings.push_back(b.is_none() ? mk::BufferBinding{} : hold(b, what, writable));
    }
  } else if (!buffers.is_none()) {
    if (!arena_obj.is_none()) throw mk::TableError("buffers: an arena was given twice");
    arena_obj = buffers;
  }
  if (!arena_obj.is_none()) {
    mk::BufferBinding a = hold(arena_obj, "arena", true);
    arena_ptr = a.data;
    arena_size = a.bytes;
  }
  std::vector<void*> addresses = exec.bind(bindings, arena_ptr, arena_size);
  mk::RunOptions opt;
  opt.iterations = iterations;
  opt.num_threads = num_threads;
  opt.timeout_ms = timeout_ms;
  opt.max_delay_us = max_delay_us;
  opt.seed = seed;
  if (!timeline.is_none()) {
    const int32_t its = iterations > 0 ? iterations : exec.tables().iterations;
    const std::string shape =
        "int64 [" + std::to_string(its) + ", " + std::to_string(exec.tables().tasks.size()) + ", 2]";
    if (!py::isinstance<py::array_t<int64_t>>(timeline)) throw mk::TableError("timeline: expected " + shape);
    const mk::BufferBinding stamps = hold(timeline, "timeline", true);
    if (stamps.bytes != static_cast<uint64_t>(its) * exec.tables().tasks.size() * 2 * sizeof(int64_t))
      throw mk::TableError("timeline: expected " + shape);
    opt.timeline = static_cast<int64_t*>(stamps.data);
  }
  mk::RunResult result;
  {
    py::gil_scoped_release unlocked;
    result = exec.run(addresses, opt);
  }
  if (result.trace.empty()) return py::none();
  const py::ssize_t n = static_cast<py::ssize_t>(exec.tables().tasks.size());
  py::array_t<int64_t> trace({static_cast<py::ssize_t>(result.iterations), n, py::ssize_t{2}});
  std::memcpy(trace.mutable_data(), result.trace.data(), result.trace.size() * sizeof(int64_t));
  return std::move(trace);
}

void raise_deadlock(const mk::DeadlockError& e) {
  py::object err = py::reinterpret_borrow<py::object>(deadlock_error_type)(e.what());
  const mk::RunStatus& s = e.status;
  err.attr("sm") = s.sm;
  err.attr("task") = s.task;
  err.attr("counter") = s.counter;
  err.attr("iteration") = s.iteration;
  err.attr("value") = s.value;
  err.attr("threshold") = s.threshold;
  err.attr("wait_ms") = s.wait_ms;
  PyErr_SetObject(deadlock_error_type, err.ptr());
}

void add_constants(py::module_& m) {
  m.attr("KIND_NOP") = static_cast<int>(mk::KIND_NOP);
  m.attr("KIND_TRACE") = static_cast<int>(mk::KIND_TRACE);
  m.attr("KIND_ADD") = static_cast<int>(mk::KIND_ADD);
  m.attr("KIND_FIRST_LOWERED") = static_cast<int>(mk::KIND_FIRST_LOWERED);
  m.attr("MAX_COORDS") = mk::MAX_COORDS;
  m.attr("MAX_TASK_ARGS") = mk::MAX_TASK_ARGS;
  m.attr("MAX_RANK") = mk::MAX_RANK;
  m.attr("MAX_THREADS") = mk::MAX_THREADS;
}

}  // namespace

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
  m.def("table_layouts", &table_layouts,
        "Size and field byte offsets of each table row struct of mk/tables.h.");
  m.def(
      "task_kinds",
      [] {
        py::dict d;
        for (const auto& [id, name] : mk::registered_kinds()) d[py::str(name)] = id;
        return d;
      },
      "Registered task kinds, name -> id.");
  add_constants(m);

  deadlock_error_type = PyErr_NewExceptionWithDoc(
      "mk._runtime.DeadlockError", "A wait of the CPU executor ran past its watchdog limit.",
      PyExc_RuntimeError, nullptr);
  m.attr("DeadlockError") = py::reinterpret_borrow<py::object>(deadlock_error_type);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const mk::DeadlockError& e) {
      raise_deadlock(e);
    }
  });

  py::class_<mk::KernelLibrary, std::shared_ptr<mk::KernelLibrary>>(
      m, "KernelLibrary",
      "A kernel library emitted by mk.backends.cpu, loaded with dlopen and checked against the ABI.")
      .def(py::init([](const py::object& path) {
             return std::const_pointer_cast<mk::KernelLibrary>(as_library(path));
           }),
           py::arg("path"))
      .def_property_readonly("path", &mk::KernelLibrary::path)
      .def_property_readonly("abi", &mk::KernelLibrary::abi)
      .def_property_readonly("num_kinds", &mk::KernelLibrary::num_kinds)
      .def("kind_name", &mk::KernelLibrary::kind_name, py::arg("kind"),
           "The name of a kind (>= KIND_FIRST_LOWERED) the library defines, else ''.")
      .def("__repr__", [](const mk::KernelLibrary& lib) {
        return "<mk._runtime.KernelLibrary " + lib.path() + ": " + std::to_string(lib.num_kinds()) + " kinds>";
      });

  py::class_<mk::CpuExecutor>(m, "CpuExecutor",
                              "Runs flat task tables on threads that play SMs (see mk/tables.h).")
      .def(py::init(&make_executor), py::arg("tasks"), py::arg("waits"), py::arg("signals"),
           py::arg("queue_offsets"), py::arg("queue_tasks"), py::arg("buffers") = py::none(), py::kw_only(),
           py::arg("num_counters"), py::arg("iterations") = 1, py::arg("arena_bytes") = 0,
           py::arg("library") = py::none(),
           "`library`: a KernelLibrary (or a path to load one from) that runs every kind >= "
           "KIND_FIRST_LOWERED through its mk_dispatch.")
      .def_property_readonly("library",
                             [](const mk::CpuExecutor& e) -> py::object {
                               if (!e.library()) return py::none();
                               return py::cast(std::const_pointer_cast<mk::KernelLibrary>(e.library()));
                             })
      .def("run", &run, py::arg("buffers") = py::none(), py::kw_only(), py::arg("arena") = py::none(),
           py::arg("iterations") = 0, py::arg("num_threads") = 1, py::arg("timeout_ms") = 10000,
           py::arg("max_delay_us") = 0, py::arg("seed") = 0, py::arg("timeline") = py::none(),
           "Runs every queue `iterations` times (0: the tables' count) with the GIL released; returns "
           "the int64 trace [iterations, num_tasks, 2] of KIND_TRACE start/end stamps (-1 where none) "
           "or None when no task traces. `timeline`: an int64 array [iterations, num_tasks, 2] that "
           "gets each task body's (start, end) in ns since the launch began.")
      .def_property_readonly("num_sms", [](const mk::CpuExecutor& e) { return e.header().num_sms; })
      .def_property_readonly("num_tasks", [](const mk::CpuExecutor& e) { return e.header().num_tasks; })
      .def("header", [](const mk::CpuExecutor& e) {
        const mk::GraphHeader h = e.header();
        py::dict d;
        d["abi"] = h.abi;
        d["num_tasks"] = h.num_tasks;
        d["num_waits"] = h.num_waits;
        d["num_signals"] = h.num_signals;
        d["num_sms"] = h.num_sms;
        d["num_counters"] = h.num_counters;
        d["num_buffers"] = h.num_buffers;
        d["iterations"] = h.iterations;
        d["arena_bytes"] = h.arena_bytes;
        return d;
      });
}
