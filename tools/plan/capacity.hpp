#pragma once
// strata-plan's capacities: "80GiB", "80GB", "81920MiB", "1.5TiB", "4096B", or a device name. A number
// needs its unit: "15" could mean 15 GiB as easily as 15 bytes, and a plan for the wrong one looks plausible.
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace strata::plan {

/// A device's memory as the planner assumes it. `measured`: what cudaMemGetInfo reports as total on such a
/// device; otherwise the marketed size read as GiB (the usable memory is a little less).
struct device_memory {
  const char* name;
  std::size_t bytes;
  bool measured;
};

inline constexpr std::size_t gib = std::size_t{1} << 30;

inline const std::vector<device_memory>& devices()
{
  // H100-80GB: the total cudaMemGetInfo reports on an H100 80GB HBM3, 85017493504 bytes (79.18 GiB);
  // examples/memory_fraction prints a device's total and the cap it sets.
  static const std::vector<device_memory> table{
      {"H100-80GB", 85017493504ull, true}, {"H100", 85017493504ull, true}, {"H100-94GB", 94 * gib, false},
      {"H200", 141 * gib, false},         {"GH200", 96 * gib, false},     {"B200", 180 * gib, false},
      {"A100-40GB", 40 * gib, false},     {"A100-80GB", 80 * gib, false}, {"A100", 80 * gib, false},
      {"L40S", 48 * gib, false},          {"L4", 24 * gib, false},        {"A10", 24 * gib, false},
      {"V100-16GB", 16 * gib, false},     {"V100-32GB", 32 * gib, false}, {"RTX4090", 24 * gib, false},
  };
  return table;
}

inline bool same_name(std::string_view a, std::string_view b)
{
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

inline const device_memory* find_device(std::string_view name)
{
  for (const auto& d : devices())
    if (same_name(d.name, name)) return &d;
  return nullptr;
}

inline std::string device_names()
{
  std::string names;
  for (const auto& d : devices()) names += (names.empty() ? "" : ", ") + std::string(d.name);
  return names;
}

/// Bytes for a capacity; std::invalid_argument naming the text and what is wrong with it (a number without a
/// unit among them).
inline std::size_t parse_capacity(std::string_view text)
{
  const std::string quoted = "capacity `" + std::string(text) + "`";
  if (text.empty()) throw std::invalid_argument("capacity: empty (give e.g. 80GiB, 81920MiB, 85899345920B or H100-80GB)");
  if (const device_memory* d = find_device(text)) return d->bytes;
  std::size_t digits = 0;
  while (digits < text.size() && (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.')) ++digits;
  if (digits == 0) {
    if (text.front() == '-') throw std::invalid_argument(quoted + ": negative");
    throw std::invalid_argument(quoted + ": not a size or a known device (sizes: 80GiB, 80GB, 81920MiB, 4096B; devices: " +
                                device_names() + ")");
  }
  double number = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + digits, number);
  if (ec != std::errc{} || end != text.data() + digits) throw std::invalid_argument(quoted + ": `" + std::string(text.substr(0, digits)) + "` is not a number");
  std::string_view unit = text.substr(digits);
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  if (unit.empty()) {
    const std::string number_text(text.substr(0, digits));
    throw std::invalid_argument(quoted + ": no unit (write " + number_text + "GiB, " + number_text + "GB or " + number_text +
                                "B for bytes), or give a device: " + device_names());
  }
  static constexpr struct {
    const char* name;
    double factor;
  } units[] = {{"B", 1},          {"KB", 1e3},        {"MB", 1e6},         {"GB", 1e9},          {"TB", 1e12},
               {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
  for (const auto& u : units) {
    if (!same_name(u.name, unit)) continue;
    const double bytes = std::floor(number * u.factor);
    if (!(bytes >= 1)) throw std::invalid_argument(quoted + ": must be at least one byte");
    if (bytes >= 18446744073709549568.0) throw std::invalid_argument(quoted + ": too large");
    return static_cast<std::size_t>(bytes);
  }
  throw std::invalid_argument(quoted + ": unknown unit `" + std::string(unit) + "` (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB, or a device: " +
                              device_names() + ")");
}

/// "13.75 GiB", "398.0 MiB", "512 B": what the table prints.
inline std::string format_bytes(std::size_t bytes)
{
  char text[64];
  const double b = static_cast<double>(bytes);
  if (bytes >= gib) std::snprintf(text, sizeof text, "%.2f GiB", b / static_cast<double>(gib));
  else if (bytes >= (std::size_t{1} << 20)) std::snprintf(text, sizeof text, "%.1f MiB", b / 1048576.0);
  else if (bytes >= 1024) std::snprintf(text, sizeof text, "%.1f KiB", b / 1024.0);
  else std::snprintf(text, sizeof text, "%zu B", bytes);
  return text;
}

} // namespace strata::plan
