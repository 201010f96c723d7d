#pragma once
// A small, strict JSON reader for the viewer: strata-view must say *where* a report or snapshot is broken
// (line and column) before it embeds it in a page, because a page that fails in the browser tells the user
// nothing useful. Standard library only; the tools depend on nothing the library does not.
#include <cctype>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace strata::viewer::json {

/// A parsed JSON value. Objects keep their members in document order as two parallel vectors (`keys`,
/// `items`), which keeps `value` a plain recursive struct (std::vector allows the incomplete element type).
/// Lookup by key is O(members): the viewer only asks for a handful of keys per object.
struct value {
  enum class type { null, boolean, number, string, array, object };
  type kind = type::null;
  bool boolean = false;
  double number = 0;
  std::string text;
  std::vector<std::string> keys;  ///< objects only
  std::vector<value> items;       ///< array elements, or object members' values (parallel to keys)

  bool is_null() const noexcept { return kind == type::null; }
  bool is_number() const noexcept { return kind == type::number; }
  bool is_string() const noexcept { return kind == type::string; }
  bool is_bool() const noexcept { return kind == type::boolean; }
  bool is_array() const noexcept { return kind == type::array; }
  bool is_object() const noexcept { return kind == type::object; }

  /// The member named `key`, or nullptr when absent (or when this is not an object).
  const value* find(std::string_view key) const noexcept
  {
    if (kind != type::object) return nullptr;
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (keys[i] == key) return &items[i];
    return nullptr;
  }
};

/// What a JSON value is called in messages ("an object", "a number", ...).
inline const char* kind_name(const value& v) noexcept
{
  switch (v.kind) {
  case value::type::null: return "null";
  case value::type::boolean: return "a boolean";
  case value::type::number: return "a number";
  case value::type::string: return "a string";
  case value::type::array: return "an array";
  case value::type::object: return "an object";
  }
  return "?";
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

class reader {
public:
  explicit reader(std::string_view text) : text_(text) {}

  value document()
  {
    skip_space();
    value v = parse_value(0);
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the JSON value");
    return v;
  }

private:
  // Deep enough for any report (they nest 7 levels); shallow enough that hostile input cannot overflow the
  // stack through recursion.
  static constexpr int max_depth = 256;

  std::string_view text_;
  std::size_t pos_ = 0;

  [[noreturn]] void fail(const std::string& what) const
  {
    std::size_t line = 1, column = 1;
    for (std::size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    throw parse_error(line, column, what);
  }

  bool at_end() const noexcept { return pos_ >= text_.size(); }
  char peek() const noexcept { return at_end() ? '\0' : text_[pos_]; }

  void skip_space() noexcept
  {
    while (!at_end() && (peek() == ' ' || peek() == '\n' || peek() == '\r' || peek() == '\t')) ++pos_;
  }

  void expect(char c, const char* context)
  {
    if (peek() != c) {
      if (at_end()) fail(std::string("the text ends where '") + c + "' " + context + " was expected (truncated?)");
      fail(std::string("expected '") + c + "' " + context + ", found '" + peek() + "'");
    }
    ++pos_;
  }

  value parse_value(int depth)
  {
    if (depth > max_depth) fail("nested deeper than " + std::to_string(max_depth) + " levels");
    if (at_end()) fail("the text ends where a value was expected (truncated?)");
    switch (peek()) {
    case '{': return parse_object(depth);
    case '[': return parse_array(depth);
    case '"': {
      value v;
      v.kind = value::type::string;
      v.text = parse_string();
      return v;
    }
    case 't': return parse_word("true", value::type::boolean, true);
    case 'f': return parse_word("false", value::type::boolean, false);
    case 'n': return parse_word("null", value::type::null, false);
    default:
      if (peek() == '-' || (peek() >= '0' && peek() <= '9')) return parse_number();
      fail(std::string("unexpected character '") + peek() + "' where a value was expected");
    }
  }

  value parse_word(std::string_view word, value::type kind, bool truth)
  {
    if (text_.substr(pos_, word.size()) != word) {
      std::size_t end = pos_;
      while (end < text_.size() && end - pos_ < 24 && std::isalnum(static_cast<unsigned char>(text_[end]))) ++end;
      fail("unexpected word '" + std::string(text_.substr(pos_, end - pos_)) + "' where a value was expected");
    }
    pos_ += word.size();
    value v;
    v.kind = kind;
    v.boolean = truth;
    return v;
  }

  value parse_number()
  {
    const std::size_t start = pos_;
    auto digits = [&] {
      const std::size_t before = pos_;
      while (!at_end() && peek() >= '0' && peek() <= '9') ++pos_;
      return pos_ - before;
    };
    if (peek() == '-') ++pos_;
    if (peek() == '0') {
      ++pos_;  // JSON forbids leading zeros: "012" is an error, found below as text after the value
    } else if (digits() == 0) {
      fail("a '-' not followed by digits");
    }
    if (peek() == '.') {
      ++pos_;
      if (digits() == 0) fail("a number with no digits after its '.'");
    }
    if (peek() == 'e' || peek() == 'E') {
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (digits() == 0) fail("a number with no digits in its exponent");
    }
    value v;
    v.kind = value::type::number;
    const auto [end, ec] = std::from_chars(text_.data() + start, text_.data() + pos_, v.number);
    if (ec == std::errc::result_out_of_range) fail("a number out of the range of a double");
    if (ec != std::errc{} || end != text_.data() + pos_) fail("a malformed number");
    return v;
  }

  static void append_utf8(std::string& out, std::uint32_t cp)
  {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::uint32_t hex4()
  {
    std::uint32_t cp = 0;
    for (int i = 0; i < 4; ++i, ++pos_) {
      const char c = peek();
      cp <<= 4;
      if (c >= '0' && c <= '9') cp |= static_cast<std::uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') cp |= static_cast<std::uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') cp |= static_cast<std::uint32_t>(c - 'A' + 10);
      else fail("a \\u escape needs four hexadecimal digits");
    }
    return cp;
  }

  std::string parse_string()
  {
    expect('"', "to open a string");
    std::string out;
    for (;;) {
      if (at_end()) fail("the text ends inside a string (truncated?)");
      const char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) fail("a control character inside a string (escape it)");
      if (c != '\\') {
        out += c;
        ++pos_;
        continue;
      }
      ++pos_;
      const char e = peek();
      ++pos_;
      switch (e) {
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      case '/': out += '/'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'u': {
        std::uint32_t cp = hex4();
        if (cp >= 0xD800 && cp <= 0xDBFF) {  // a surrogate pair spells one code point above U+FFFF
          if (text_.substr(pos_, 2) != "\\u") fail("a lone UTF-16 high surrogate in a \\u escape");
          pos_ += 2;
          const std::uint32_t low = hex4();
          if (low < 0xDC00 || low > 0xDFFF) fail("a UTF-16 high surrogate not followed by a low one");
          cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
          fail("a lone UTF-16 low surrogate in a \\u escape");
        }
        append_utf8(out, cp);
        break;
      }
      default: --pos_; fail("an unknown escape in a string");
      }
    }
  }

  value parse_array(int depth)
  {
    expect('[', "to open an array");
    value v;
    v.kind = value::type::array;
    skip_space();
    if (peek() == ']') {
      ++pos_;
      return v;
    }
    for (;;) {
      skip_space();
      v.items.push_back(parse_value(depth + 1));
      skip_space();
      if (peek() == ']') {
        ++pos_;
        return v;
      }
      expect(',', "or ']' after an array element");
    }
  }

  value parse_object(int depth)
  {
    expect('{', "to open an object");
    value v;
    v.kind = value::type::object;
    skip_space();
    if (peek() == '}') {
      ++pos_;
      return v;
    }
    for (;;) {
      skip_space();
      if (peek() != '"') {
        if (at_end()) fail("the text ends where a member name was expected (truncated?)");
        fail("expected a member name in double quotes");
      }
      v.keys.push_back(parse_string());
      skip_space();
      expect(':', "after a member name");
      skip_space();
      v.items.push_back(parse_value(depth + 1));
      skip_space();
      if (peek() == '}') {
        ++pos_;
        return v;
      }
      expect(',', "or '}' after an object member");
    }
  }
};

} // namespace detail

/// Parses one JSON document (RFC 8259; numbers as doubles). O(length of the text); throws parse_error.
inline value parse(std::string_view text) { return detail::reader(text).document(); }

} // namespace strata::viewer::json
