#pragma once
// The memory map viewer: one self-contained HTML page (styles, script and data inline; nothing fetched) that
// draws a strata-plan report or one strata snapshot. The page itself is tools/viewer/page/*.{html,css,js};
// the build embeds it as `strata_viewer_page.inc` (tools/viewer/CMakeLists.txt), so link `strata_viewer`.
#include "viewer/json.hpp"

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

#include "strata_viewer_page.inc"  // generated: strata::viewer::detail::page_parts

namespace strata::viewer {

/// What a JSON document handed to the viewer is.
enum class document_kind { report, snapshot };

/// JSON that parses but is not a report or a snapshot; `what()` names the member that is wrong, with its
/// path ("traces[0].stacks[2].timeline: ...").
struct shape_error : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

namespace detail {

[[noreturn]] inline void wrong(const std::string& path, const std::string& what)
{
  throw shape_error((path.empty() ? std::string("the document") : path) + ": " + what);
}

inline std::string join(const std::string& path, std::string_view key)
{
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

inline const json::value& member(const json::value& obj, std::string_view key, const std::string& path)
{
  const json::value* v = json::find(obj, key);
  if (!v) wrong(path, "has no \"" + std::string(key) + "\"");
  return *v;
}

inline const json::value& object_at(const json::value& v, const std::string& path)
{
  if (!v.is_object()) wrong(path, std::string("is ") + json::kind_name(v) + ", not an object");
  return v;
}

inline const json::value& array_member(const json::value& obj, std::string_view key, const std::string& path)
{
  const json::value& v = member(obj, key, path);
  if (!v.is_array()) wrong(join(path, key), std::string("is ") + json::kind_name(v) + ", not an array");
  return v;
}

inline double size_member(const json::value& obj, std::string_view key, const std::string& path)
{
  const json::value& v = member(obj, key, path);
  if (!v.is_number() || v.get<double>() < 0)
    wrong(join(path, key), std::string("is ") + (v.is_number() ? "negative" : json::kind_name(v)) + ", not a size in bytes");
  return v.get<double>();
}

// A figure the page prints: a number or null (absent counts as null).
inline void optional_number(const json::value& obj, std::string_view key, const std::string& path)
{
  const json::value* v = json::find(obj, key);
  if (v && !v->is_number() && !v->is_null())
    wrong(join(path, key), std::string("is ") + json::kind_name(*v) + ", not a number or null");
}

// Segments and blocks as strata::to_json writes them. The page finds blocks by binary search and draws them
// by offset, so blocks must lie inside their segment, in address order, without overlapping.
inline void check_snapshot_at(const json::value& snap, const std::string& path)
{
  object_at(snap, path);
  if (const json::value* box = json::find(snap, "box"); box && !box->is_string())
    wrong(join(path, "box"), std::string("is ") + json::kind_name(*box) + ", not a string");
  const json::value& segments = array_member(snap, "segments", path);
  for (std::size_t s = 0; s < segments.size(); ++s) {
    const std::string seg_path = join(path, "segments[" + std::to_string(s) + "]");
    const json::value& seg = object_at(segments[s], seg_path);
    const double seg_size = size_member(seg, "size", seg_path);
    optional_number(seg, "address", seg_path);
    const json::value& blocks = array_member(seg, "blocks", seg_path);
    double end = 0;
    for (std::size_t b = 0; b < blocks.size(); ++b) {
      const std::string block_path = seg_path + ".blocks[" + std::to_string(b) + "]";
      const json::value& block = object_at(blocks[b], block_path);
      const double offset = size_member(block, "offset", block_path);
      const double size = size_member(block, "size", block_path);
      if (!member(block, "free", block_path).is_boolean()) wrong(block_path + ".free", "is not true or false");
      optional_number(block, "stream", block_path);
      if (offset < end) wrong(block_path, "starts inside the block before it (blocks must be in address order)");
      if (offset + size > seg_size) wrong(block_path, "ends past the end of its segment");
      end = offset + size;
    }
  }
}

inline void check_timeline(const json::value& stack, const std::string& path)
{
  const std::string tl_path = path + ".timeline";
  const json::value& tl = object_at(member(stack, "timeline", path), tl_path);
  const json::value& op = array_member(tl, "op", tl_path);
  for (const char* key : {"op", "live", "reserved"}) {
    const json::value& series = array_member(tl, key, tl_path);
    if (series.size() != op.size())
      wrong(tl_path, "\"" + std::string(key) + "\" has " + std::to_string(series.size()) + " entries, \"op\" has " +
                         std::to_string(op.size()));
    for (std::size_t i = 0; i < series.size(); ++i)
      if (!series[i].is_number())
        wrong(tl_path + "." + key + "[" + std::to_string(i) + "]",
              std::string("is ") + json::kind_name(series[i]) + ", not a number");
  }
}

inline void check_peak_map(const json::value& stack, const std::string& path)
{
  const json::value* pm = json::find(stack, "peak_map");
  if (!pm || pm->is_null()) return;  // a stack may come without a map; the page says so
  const std::string pm_path = path + ".peak_map";
  object_at(*pm, pm_path);
  optional_number(*pm, "at_op", pm_path);
  const json::value& snap = member(*pm, "snapshot", pm_path);
  check_snapshot_at(snap, pm_path + ".snapshot");
  const json::value* req = json::find(*pm, "largest_request");
  if (!req || req->is_null()) return;
  const std::string req_path = pm_path + ".largest_request";
  object_at(*req, req_path);
  size_member(*req, "size", req_path);
  const json::value* seg = json::find(*req, "segment");
  if (!seg || seg->is_null()) return;  // "needs new memory"
  if (!seg->is_number() || seg->get<double>() < 0 || seg->get<double>() >= static_cast<double>(member(snap, "segments", "").size()))
    wrong(req_path + ".segment", "is not the index of a segment of the snapshot");
  size_member(*req, "offset", req_path);
}

inline void check_report(const json::value& report)
{
  object_at(report, "");
  const json::value& traces = array_member(report, "traces", "");
  for (std::size_t t = 0; t < traces.size(); ++t) {
    const std::string trace_path = "traces[" + std::to_string(t) + "]";
    const json::value& trace = object_at(traces[t], trace_path);
    if (!member(trace, "trace", trace_path).is_string()) wrong(trace_path + ".trace", "is not a string");
    optional_number(trace, "operations", trace_path);
    optional_number(trace, "capacity", trace_path);
    optional_number(trace, "scale", trace_path);
    const json::value& stacks = array_member(trace, "stacks", trace_path);
    for (std::size_t s = 0; s < stacks.size(); ++s) {
      const std::string path = trace_path + ".stacks[" + std::to_string(s) + "]";
      const json::value& stack = object_at(stacks[s], path);
      if (!member(stack, "name", path).is_string()) wrong(path + ".name", "is not a string");
      for (const char* figure : {"peak_live", "peak_reserved", "ratio", "largest_free_at_peak", "upstream_calls",
                                 "map_calls", "unmap_calls", "min_capacity"})
        optional_number(stack, figure, path);
      if (const json::value* fits = json::find(stack, "fits"); fits && !fits->is_boolean() && !fits->is_null())
        wrong(path + ".fits", "is not true, false or null");
      check_timeline(stack, path);
      check_peak_map(stack, path);
    }
  }
}

// The page with its placeholders: assembled once from the generated parts (string literals are kept short
// for compilers that limit their length).
inline const std::string& page_template()
{
  static const std::string page = [] {
    std::string out;
    for (std::string_view part : page_parts) out += part;
    return out;
  }();
  return page;
}

// JSON inside <script type="application/json">: the only text that could end the element early or open a
// comment starts with '<', and in valid JSON '<' only occurs inside strings, where \u003c means the same.
inline void append_embedded_json(std::string& out, std::string_view json_text)
{
  out.reserve(out.size() + json_text.size() + 64);
  for (char c : json_text) {
    if (c == '<') out += "\\u003c";
    else out += c;
  }
}

inline std::string fill_page(std::string_view kind, std::string_view json_text)
{
  static constexpr std::string_view kind_marker = "@STRATA_KIND@", data_marker = "@STRATA_DATA@";
  const std::string& page = page_template();
  const std::size_t k = page.find(kind_marker), d = page.find(data_marker);
  if (k == std::string::npos || d == std::string::npos || d < k)
    throw std::logic_error("strata::viewer: the embedded page lost its @STRATA_KIND@/@STRATA_DATA@ markers");
  std::string out;
  out.reserve(page.size() + json_text.size() + 64);
  out.append(page, 0, k);
  out += kind;
  out.append(page, k + kind_marker.size(), d - k - kind_marker.size());
  append_embedded_json(out, json_text);
  out.append(page, d + data_marker.size());
  return out;
}

} // namespace detail

/// Says whether `doc` is a strata-plan report (has "traces") or a snapshot (has "segments"), and checks
/// that it has every member the page draws. O(size of the document); throws shape_error naming the
/// first wrong member.
inline document_kind check_document(const json::value& doc)
{
  if (!doc.is_object()) detail::wrong("", std::string("is ") + json::kind_name(doc) + ", not an object");
  if (json::find(doc, "traces")) {
    detail::check_report(doc);
    return document_kind::report;
  }
  if (json::find(doc, "segments")) {
    detail::check_snapshot_at(doc, "");
    return document_kind::snapshot;
  }
  detail::wrong("", "is neither a strata-plan report (no \"traces\") nor a strata snapshot (no \"segments\")");
}

namespace detail {

inline std::string render(std::string_view json_text, const char* caller, const document_kind* expected)
{
  document_kind kind;
  try {
    kind = check_document(json::parse(json_text));
  } catch (const json::parse_error& e) {
    throw shape_error(std::string(caller) + ": not JSON: " + e.what());
  } catch (const shape_error& e) {
    throw shape_error(std::string(caller) + ": " + e.what());
  }
  const char* name = kind == document_kind::report ? "report" : "snapshot";
  if (expected && kind != *expected)
    throw shape_error(std::string(caller) + ": the document is a strata " + name + ", not a " +
                      (*expected == document_kind::report ? "strata-plan report" : "snapshot"));
  return fill_page(name, json_text);
}

} // namespace detail

/// The page for a strata-plan report (the JSON `strata-plan --json` writes). Parses and checks the report
/// first (O(its size)), so a broken report throws shape_error naming what is wrong, rather than giving a
/// page that fails in the browser.
inline std::string render_html(std::string_view report_json)
{
  constexpr document_kind expected = document_kind::report;
  return detail::render(report_json, "strata::viewer::render_html", &expected);
}

/// The page for one snapshot (`strata::to_json(pool.snapshot())`): the memory map alone. Checks like
/// render_html.
inline std::string render_snapshot_html(std::string_view snapshot_json)
{
  constexpr document_kind expected = document_kind::snapshot;
  return detail::render(snapshot_json, "strata::viewer::render_snapshot_html", &expected);
}

/// The page for either kind of document, told apart by check_document (what strata-view does).
inline std::string render_any_html(std::string_view json_text)
{
  return detail::render(json_text, "strata::viewer", nullptr);
}

} // namespace strata::viewer
