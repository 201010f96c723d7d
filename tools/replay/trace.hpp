#pragma once
// Allocation traces in strata's format: CSV `op,id,bytes,stream` (header optional, `#` comments and blank
// lines ignored), plain or gzip. Shared by bench/replay, bench/peers and strata-plan, so that every tool
// reads a trace the same way and refuses the same bad input: a trace that cannot be replayed exactly is
// rejected with its file, line and what was wrong (trace_error), never replayed to a silently wrong answer.
// gzip goes through zlib when the build links it (STRATA_REPLAY_ZLIB), through `gzip -dc` otherwise.
#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>
#ifdef STRATA_REPLAY_ZLIB
#include <zlib.h>
#endif

namespace strata::replay {

struct trace_event {
  bool allocate;
  std::uint64_t id;
  std::size_t bytes;
  int stream;
};

/// Bad input: names the file and, where there is one, the line.
class trace_error : public std::runtime_error {
public:
  trace_error(const std::string& file, std::size_t line, const std::string& what)
      : std::runtime_error(file + (line ? ":" + std::to_string(line) : std::string()) + ": " + what), file_(file), line_(line)
  {
  }
  const std::string& file() const noexcept { return file_; }
  std::size_t line() const noexcept { return line_; }

private:
  std::string file_;
  std::size_t line_;
};

namespace detail {

inline bool is_gzip(const std::string& path)
{
  std::ifstream in(path, std::ios::binary);
  unsigned char magic[2] = {0, 0};
  in.read(reinterpret_cast<char*>(magic), 2);
  return in.gcount() == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
}

/// The whole decompressed text. Truncated or corrupt gzip data is an error, not a shorter trace.
inline std::string read_text(const std::string& path)
{
  if (!std::ifstream(path).good()) throw trace_error(path, 0, "cannot open the file");
  std::string text;
  if (!is_gzip(path)) {
    std::ifstream in(path, std::ios::binary);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    return text;
  }
  char buffer[1 << 16];
#ifdef STRATA_REPLAY_ZLIB
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) throw trace_error(path, 0, "cannot open the file");
  int n = 0;
  while ((n = gzread(file, buffer, sizeof buffer)) > 0) text.append(buffer, static_cast<std::size_t>(n));
  int code = Z_OK;
  const std::string message = gzerror(file, &code);
  gzclose(file);
  if (n < 0 || (code != Z_OK && code != Z_STREAM_END))
    throw trace_error(path, 0, "truncated or corrupt gzip data (" + message + ")");
#else
  std::string command = "gzip -dc -- '";
  for (char c : path) command += c == '\'' ? std::string("'\\''") : std::string(1, c);
  command += "' 2>/dev/null";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) throw trace_error(path, 0, "cannot run gzip -dc to read it");
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) text.append(buffer, n);
  if (::pclose(pipe) != 0) throw trace_error(path, 0, "truncated or corrupt gzip data (gzip -dc failed)");
#endif
  return text;
}

/// Text from the input as an error message quotes it: bytes outside printable ASCII as `\xNN`, and at most 80
/// of them, so that a binary file given as a trace cannot write control sequences to the user's terminal.
inline std::string shown(std::string_view text)
{
  static constexpr std::size_t longest = 80;
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < text.size() && i < longest; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 0xf];
    }
  }
  if (text.size() > longest) out += "...";
  return out;
}

/// Whether text looks like binary data rather than a CSV trace: a control character other than tab, CR and LF
/// among its first 4 KiB (comments may hold UTF-8; nothing in a trace is a control character).
inline bool looks_binary(std::string_view text) noexcept
{
  for (std::size_t i = 0; i < text.size() && i < 4096; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c < 0x20 && c != '\t' && c != '\r' && c != '\n') || c == 0x7f) return true;
  }
  return false;
}

template <class T>
bool parse_number(std::string_view field, T& out)
{
  const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), out);
  return ec == std::errc{} && end == field.data() + field.size() && !field.empty();
}

} // namespace detail

/// Parses a trace already in memory; `name` is what errors call the file. Checks every line: four fields, an
/// op of `a` or `f`, an id, a size that is a non-negative integer, an integer stream; an allocation of an id
/// still live, or a free of an id that is not, is refused (the replay could only guess). The text must end
/// with a newline, so that a cut-off last line ("a,7,51" of "a,7,5120,0") is caught.
inline std::vector<trace_event> parse_trace(std::string_view text, const std::string& name)
{
  if (detail::looks_binary(text))
    throw trace_error(name, 0, "binary data, not a trace (strata's traces are CSV text `op,id,bytes,stream`, plain or "
                               "gzip; a PyTorch snapshot is read as one when its name ends in .pickle or .pkl)");
  std::vector<trace_event> events;
  events.reserve(text.size() / 16);
  std::unordered_map<std::uint64_t, std::size_t> live;  // id -> line that allocated it
  std::size_t number = 0, pos = 0;
  bool header_allowed = true;
  while (pos < text.size()) {
    ++number;
    const std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos)
      throw trace_error(name, number, "the last line has no newline: the file looks truncated");
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line.front() == '#') continue;
    if (std::exchange(header_allowed, false) && line.substr(0, 3) == "op,") continue;
    std::string_view fields[4];
    std::size_t count = 0, start = 0;
    for (;;) {
      const std::size_t comma = line.find(',', start);
      if (count < 4) fields[count] = line.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
      ++count;
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    auto bad = [&](const std::string& what) { throw trace_error(name, number, what + ": `" + detail::shown(line) + "`"); };
    if (count != 4) bad("expected 4 fields `op,id,bytes,stream`, found " + std::to_string(count));
    if (fields[0] != "a" && fields[0] != "f") bad("unknown op `" + detail::shown(fields[0]) + "` (expected a or f)");
    trace_event e{fields[0] == "a", 0, 0, 0};
    if (!detail::parse_number(fields[1], e.id)) bad("the id `" + detail::shown(fields[1]) + "` is not a non-negative integer");
    if (!fields[2].empty() && fields[2].front() == '-') bad("negative size " + detail::shown(fields[2]));
    if (!detail::parse_number(fields[2], e.bytes)) bad("the size `" + detail::shown(fields[2]) + "` is not a number of bytes");
    if (!detail::parse_number(fields[3], e.stream)) bad("the stream `" + detail::shown(fields[3]) + "` is not an integer");
    if (e.allocate) {
      const auto [it, fresh] = live.emplace(e.id, number);
      if (!fresh) bad("id " + std::to_string(e.id) + " is allocated again while live (allocated on line " + std::to_string(it->second) + ")");
    } else if (live.erase(e.id) == 0) {
      bad("free of unknown id " + std::to_string(e.id) + " (never allocated, or already freed)");
    }
    events.push_back(e);
  }
  return events;
}

inline std::vector<trace_event> read_trace(const std::string& path) { return parse_trace(detail::read_text(path), path); }

/// Multiplies every size by `factor`, rounded up to 512 bytes as PyTorch rounds (so a figure that holds only
/// at one lucky size shows it).
inline void scale_sizes(std::vector<trace_event>& events, double factor)
{
  for (auto& e : events) {
    const auto scaled = static_cast<std::size_t>(static_cast<double>(e.bytes) * factor + 0.5);
    e.bytes = std::max<std::size_t>(512, (scaled + 511) / 512 * 512);
  }
}

} // namespace strata::replay
