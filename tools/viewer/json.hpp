#pragma once
// The viewer's JSON: nlohmann/json, with its parse errors restated as "line L, column C: what was wrong".
// strata-view must say *where* a report or snapshot is broken before it embeds it in a page, because a page
// that fails in the browser tells the user nothing useful.
#include <nlohmann/json.hpp>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace strata::viewer::json {

/// A parsed document. Objects keep their members in document order (the page draws stacks in the order the
/// report lists them).
using value = nlohmann::ordered_json;

/// What a JSON value is called in messages ("an object", "a number", ...).
inline const char* kind_name(const value& v) noexcept
{
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "binary data";
}

/// The member named `key`, or nullptr when absent (or when `v` is not an object). O(members).
inline const value* find(const value& v, std::string_view key)
{
  if (!v.is_object()) return nullptr;
  const auto it = v.find(key);
  return it == v.end() ? nullptr : &*it;
}

/// Thrown for text that is not JSON; `what()` reads "line L, column C: <what was wrong>".
struct parse_error : std::runtime_error {
  std::size_t line, column;
  parse_error(std::size_t l, std::size_t c, const std::string& what)
      : std::runtime_error("line " + std::to_string(l) + ", column " + std::to_string(c) + ": " + what), line(l),
        column(c)
  {
  }
};

namespace detail {

// nlohmann's message without its prefix ("[json.exception.parse_error.101] parse error at line 1, column 13: "),
// which parse_error states in its own words.
inline std::string reason(const nlohmann::json::parse_error& e)
{
  const std::string_view what = e.what();
  const std::size_t column = what.find(", column ");
  const std::size_t colon = what.find(": ", column == std::string_view::npos ? 0 : column);
  return std::string(colon == std::string_view::npos ? what : what.substr(colon + 2));
}

} // namespace detail

/// Parses one JSON document (RFC 8259). O(length of the text); throws parse_error. Deep nesting is no
/// danger: nlohmann/json parses and destroys documents without recursion.
inline value parse(std::string_view text)
{
  try {
    return value::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte: the 1-based index of the character where parsing stopped (one past the end for a truncation).
    const std::size_t at = e.byte == 0 ? 0 : e.byte - 1;
    std::size_t line = 1, column = 1;
    for (std::size_t i = 0; i < at && i < text.size(); ++i) {
      if (text[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    const bool at_end = e.byte > text.size();
    throw parse_error(line, column, detail::reason(e) + (at_end ? " (the text ends there: truncated?)" : ""));
  }
}

} // namespace strata::viewer::json
