// The viewer's C++ side: JSON errors stated with their line and column, the checks that name what is wrong in
// a report or snapshot, and the page it writes (markers filled, data embedded safely). The page's drawing is
// checked in a browser by check_viewer.sh.
#include "viewer/html_report.hpp"

#include <doctest/doctest.h>

#include <fstream>
#include <sstream>
#include <string>

namespace json = strata::viewer::json;
using strata::viewer::shape_error;

namespace {

std::string parse_failure(std::string_view text)
{
  try {
    json::parse(text);
  } catch (const json::parse_error& e) {
    return e.what();
  }
  return "(parsed)";
}

std::string render_failure(std::string_view text)
{
  try {
    strata::viewer::render_any_html(text);
  } catch (const shape_error& e) {
    return e.what();
  }
  return "(rendered)";
}

// The JSON between the data element's tags of a rendered page.
std::string embedded_data(const std::string& page)
{
  const std::string open = "id=\"strata-data\"";
  const std::size_t at = page.find(open);
  REQUIRE(at != std::string::npos);
  const std::size_t start = page.find('>', at) + 1, end = page.find("</script>", start);
  REQUIRE(end != std::string::npos);
  return page.substr(start, end - start);
}

std::string fixture()
{
  std::ifstream in(STRATA_VIEWER_FIXTURE_DIR "/report_fixture.json", std::ios::binary);
  REQUIRE(in);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

const char* minimal_report = R"({"tool":"strata-plan","version":1,"traces":[{"trace":"t","operations":3,"scale":1.0,
  "capacity":null,"stacks":[{"name":"default_pool","peak_live":512,"peak_reserved":2048,"ratio":4.0,
  "largest_free_at_peak":1536,"upstream_calls":1,"map_calls":null,"unmap_calls":null,"fits":null,"min_capacity":2048,
  "timeline":{"op":[1,2,3],"live":[512,0,512],"reserved":[2048,2048,2048]},
  "peak_map":{"at_op":1,"snapshot":{"box":"coalescing_pool","segments":[{"address":4096,"size":2048,"blocks":[
    {"offset":0,"size":512,"free":false,"stream":-1},{"offset":512,"size":1536,"free":true,"stream":-1}]}]},
  "largest_request":{"size":512,"segment":0,"offset":512}}}]}]})";

} // namespace

TEST_CASE("json: values of every kind, escapes, and members in document order")
{
  const json::value v = json::parse(R"( {"z": [1, -2.5e3, 0, true, false, null], "s": "x\"\\\/\n\u00e9\ud83d\ude00", "o": {}} )");
  REQUIRE(v.is_object());
  const json::value& a = *json::find(v, "z");
  REQUIRE(a.size() == 6);
  CHECK(a[0].get<double>() == 1);
  CHECK(a[1].get<double>() == -2500);
  CHECK(a[3].get<bool>());
  CHECK_FALSE(a[4].get<bool>());
  CHECK(a[5].is_null());
  CHECK(json::find(v, "s")->get<std::string>() == "x\"\\/\n\xc3\xa9\xf0\x9f\x98\x80");  // é and U+1F600 from a surrogate pair
  CHECK(json::find(v, "o")->is_object());
  CHECK(json::find(v, "missing") == nullptr);
  CHECK(json::find(a, "z") == nullptr);  // not an object
  CHECK(v.begin().key() == "z");         // the page draws members in the order the report wrote them
  CHECK(std::string(json::kind_name(a)) == "an array");
  CHECK(std::string(json::kind_name(a[3])) == "a boolean");
  CHECK(json::parse("18446744073709551615").get<double>() == doctest::Approx(1.8446744073709552e19));
  // Nesting far deeper than any report parses without exhausting the stack.
  CHECK(json::parse(std::string(100000, '[') + std::string(100000, ']')).is_array());
}

TEST_CASE("json: bad text is refused with its line, column and what was wrong")
{
  struct bad_text {
    std::string text;
    std::size_t line, column;
    const char* reason;  // a part of what the message says was wrong
  };
  const bad_text cases[] = {
      {"{\"a\": 1,\n \"b\": }", 2, 7, "unexpected '}'"},
      {"[1, 2", 1, 6, "unexpected end of input; expected ']' (the text ends there: truncated?)"},
      {"{\"a\": [1, 2]", 1, 13, "unexpected end of input; expected '}' (the text ends there: truncated?)"},
      {"\"abc", 1, 5, "missing closing quote"},
      {"[01]", 1, 3, "unexpected number literal"},
      {"[1.]", 1, 4, "invalid number"},
      {"[tru]", 1, 5, "invalid literal"},
      {"{1: 2}", 1, 2, "object key"},
      {"\"a\tb\"", 1, 3, "control character"},
      {"\"\\ud800\"", 1, 8, "surrogate"},
      {"{} x", 1, 4, "expected end of input"},
      {"", 1, 1, "(the text ends there: truncated?)"},  // nlohmann's own words for it vary between releases
  };
  for (const auto& c : cases) {
    CAPTURE(c.text);
    try {
      json::parse(c.text);
      FAIL("parsed");
    } catch (const json::parse_error& e) {
      CHECK(e.line == c.line);
      CHECK(e.column == c.column);
      const std::string what = e.what();
      CHECK(what.rfind("line " + std::to_string(c.line) + ", column " + std::to_string(c.column) + ": ", 0) == 0);
      CHECK(what.find(c.reason) != std::string::npos);
      CHECK(what.find("json.exception") == std::string::npos);  // the position is said once, in our words
    }
  }
}

TEST_CASE("json: every truncation of a report is refused, and damaged bytes never crash the reader")
{
  const std::string text = minimal_report;
  std::size_t refused = 0;
  for (std::size_t n = 0; n < text.size(); ++n) {
    try {
      json::parse(std::string_view(text).substr(0, n));
    } catch (const json::parse_error&) {
      ++refused;
    }
  }
  CHECK(refused == text.size());
  // Each byte in turn replaced by characters that matter to JSON: the reader parses or refuses, and a
  // document it accepts is still checked (render_any_html) without any other exception escaping.
  std::size_t parsed = 0, rejected = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    for (char c : {'"', '{', ']', ',', '\\', '0', '\0'}) {
      std::string damaged = text;
      damaged[i] = c;
      try {
        strata::viewer::render_any_html(damaged);
        ++parsed;
      } catch (const shape_error&) {
        ++rejected;
      }
    }
  }
  CHECK(parsed + rejected == 7 * text.size());
  CHECK(rejected > parsed);
}

TEST_CASE("check_document tells a report from a snapshot")
{
  CHECK(strata::viewer::check_document(json::parse(minimal_report)) == strata::viewer::document_kind::report);
  CHECK(strata::viewer::check_document(json::parse(R"({"box":"b","segments":[]})")) == strata::viewer::document_kind::snapshot);
  CHECK(render_failure("[1]") == "strata::viewer: the document: is an array, not an object");
  CHECK(render_failure(R"({"tool":"x"})") ==
        "strata::viewer: the document: is neither a strata-plan report (no \"traces\") nor a strata snapshot (no \"segments\")");
  CHECK(render_failure("{\"traces\": [") ==
        "strata::viewer: not JSON: line 1, column 13: syntax error while parsing value - unexpected end of input; expected '[', '{', or a literal "
        "(the text ends there: truncated?)");
}

TEST_CASE("a report with a wrong member is refused, naming the member")
{
  auto broken = [](std::string_view from, std::string_view to) {
    std::string text = minimal_report;
    const std::size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    text.replace(at, from.size(), to);
    return render_failure(text);
  };
  CHECK(broken(R"("trace":"t")", R"("trace":7)") == "strata::viewer: traces[0].trace: is not a string");
  CHECK(broken(R"("name":"default_pool")", R"("nom":"default_pool")") == "strata::viewer: traces[0].stacks[0]: has no \"name\"");
  CHECK(broken(R"("live":[512,0,512])", R"("live":[512,0])") ==
        "strata::viewer: traces[0].stacks[0].timeline: \"live\" has 2 entries, \"op\" has 3");
  CHECK(broken(R"("reserved":[2048,2048,2048])", R"("reserved":[2048,"x",2048])") ==
        "strata::viewer: traces[0].stacks[0].timeline.reserved[1]: is a string, not a number");
  CHECK(broken(R"("peak_live":512)", R"("peak_live":"512")") == "strata::viewer: traces[0].stacks[0].peak_live: is a string, not a number or null");
  CHECK(broken(R"("fits":null)", R"("fits":"yes")") == "strata::viewer: traces[0].stacks[0].fits: is not true, false or null");
  CHECK(broken(R"("size":2048,"blocks")", R"("size":-2048,"blocks")") ==
        "strata::viewer: traces[0].stacks[0].peak_map.snapshot.segments[0].size: is negative, not a size in bytes");
  CHECK(broken(R"("offset":512,"size":1536)", R"("offset":256,"size":1536)") ==
        "strata::viewer: traces[0].stacks[0].peak_map.snapshot.segments[0].blocks[1]: starts inside the block before it (blocks must be in address order)");
  CHECK(broken(R"("offset":512,"size":1536)", R"("offset":512,"size":4096)") ==
        "strata::viewer: traces[0].stacks[0].peak_map.snapshot.segments[0].blocks[1]: ends past the end of its segment");
  CHECK(broken(R"("free":true)", R"("free":1)") ==
        "strata::viewer: traces[0].stacks[0].peak_map.snapshot.segments[0].blocks[1].free: is not true or false");
  CHECK(broken(R"("segment":0,)", R"("segment":1,)") ==
        "strata::viewer: traces[0].stacks[0].peak_map.largest_request.segment: is not the index of a segment of the snapshot");
  CHECK(broken(R"("stacks":[)", R"("stacks":{"x":[)") != "(rendered)");
  // A stack without a map, and a request that needs new memory, are allowed: the page says so.
  CHECK(broken(R"("largest_request":{"size":512,"segment":0,"offset":512})", R"("largest_request":{"size":512,"segment":null,"offset":null})") == "(rendered)");
}

TEST_CASE("render_html and render_snapshot_html take only their own kind")
{
  CHECK_THROWS_WITH_AS(strata::viewer::render_html(R"({"box":"b","segments":[]})"),
                       "strata::viewer::render_html: the document is a strata snapshot, not a strata-plan report", shape_error);
  CHECK_THROWS_WITH_AS(strata::viewer::render_snapshot_html(minimal_report),
                       "strata::viewer::render_snapshot_html: the document is a strata report, not a snapshot", shape_error);
}

TEST_CASE("the page embeds the document whole, with nothing that could end its script element")
{
  std::string report = minimal_report;
  const std::string hostile = R"(t </script><script>alert(1)</script> <!-- x)";
  report.replace(report.find(R"("trace":"t")"), 11, "\"trace\":\"" + hostile + "\"");
  const std::string page = strata::viewer::render_html(report);
  CHECK(page.rfind("<!DOCTYPE html>", 0) == 0);
  CHECK(page.find("@STRATA_") == std::string::npos);
  CHECK(page.find("data-kind=\"report\"") != std::string::npos);
  CHECK(page.find("alert(1)</script>") == std::string::npos);
  CHECK(page.find("<script src") == std::string::npos);  // self-contained: nothing fetched
  CHECK(page.find("http://") == std::string::npos);
  CHECK(page.find("https://") == std::string::npos);
  // The embedded text parses back to the same document.
  const json::value back = json::parse(embedded_data(page));
  CHECK(back["traces"][0]["trace"].get<std::string>() == hostile);
  const std::string snap = strata::viewer::render_snapshot_html(R"({"box":"b","segments":[]})");
  CHECK(snap.find("data-kind=\"snapshot\"") != std::string::npos);
  CHECK(embedded_data(snap) == R"({"box":"b","segments":[]})");
}

TEST_CASE("the committed fixture report is a valid report")
{
  const std::string text = fixture();
  const json::value doc = json::parse(text);
  CHECK(strata::viewer::check_document(doc) == strata::viewer::document_kind::report);
  CHECK(doc["traces"].size() == 2);
  CHECK(json::parse(embedded_data(strata::viewer::render_html(text)))["traces"].size() == 2);
}
