// Internal to the CPU runtime: messages without iostreams, table errors and the task-kind
// registry that the table validation and the executor share.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <type_traits>

#include "cpu_executor.h"

namespace mk {

// Messages are put together without iostreams: a runtime linked with a static libstdc++ (as on
// the GPU machine's image) may not have initialised the stream locale, and formatting a number
// through it there ended the process with a segmentation fault on the first failed run.
inline void append(std::string& out, const std::string& part) { out += part; }
inline void append(std::string& out, const char* part) { out += part; }
inline void append(std::string& out, char part) { out += part; }
template <class T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
void append(std::string& out, T part) {
  out += std::to_string(part);
}

template <class... Parts>
std::string cat(const Parts&... parts) {
  std::string out;
  (append(out, parts), ...);
  return out;
}

[[noreturn]] void table_error(const std::string& table, int64_t index, const std::string& what);
std::string coord_text(const TaskDesc& t);

struct KindInfo {
  std::string name;
  KindFn run;
  KindCheck check;
};

struct Registry {
  std::mutex mutex;
  std::map<int32_t, KindInfo> kinds;
};

// The registered kinds, the built-in ones (nop, trace, add) first.
Registry& registry();

}  // namespace mk
