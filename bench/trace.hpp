#pragma once
// Reads allocation traces in strata's format (DESIGN.md): CSV `op,id,bytes,stream`, plain or gzip.
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace strata::bench {

struct trace_event {
  bool allocate;
  std::uint64_t id;
  std::size_t bytes;
  int stream;
};

/// gzread reads plain files as they are, so one path serves both.
inline std::vector<trace_event> read_trace(const std::string& path)
{
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) throw std::runtime_error("cannot open trace " + path);
  std::vector<trace_event> events;
  char line[256];
  std::size_t number = 0;
  while (gzgets(file, line, sizeof line) != nullptr) {
    ++number;
    if (number == 1 && std::string(line).rfind("op,", 0) == 0) continue;
    char op = 0;
    unsigned long long id = 0, bytes = 0;
    int stream = 0;
    if (std::sscanf(line, "%c,%llu,%llu,%d", &op, &id, &bytes, &stream) != 4 || (op != 'a' && op != 'f')) {
      gzclose(file);
      throw std::runtime_error(path + ":" + std::to_string(number) + ": not `op,id,bytes,stream`: " + line);
    }
    events.push_back({op == 'a', id, static_cast<std::size_t>(bytes), stream});
  }
  gzclose(file);
  return events;
}

} // namespace strata::bench
