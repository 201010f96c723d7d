// The viewer's C++ side: the JSON reader, the checks that name what is wrong in a report or snapshot, and
// the page it writes (markers filled, data embedded safely). The page's drawing is checked in a browser by
// check_viewer.sh.
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

TEST_CASE("json: values of every kind, escapes and nesting")
{
  const json::value v = json::parse(R"( {"a": [1, -2.5e3, 0, true, false, null], "s": "x\"\\\/\n\u00e9\ud83d\ude00", "o": {}} )");
  REQUIRE(v.is_object());
  const json::value& a = *v.find("a");
  REQUIRE(a.items.size() == 6);
  CHECK(a.items[0].number == 1);
  CHECK(a.items[1].number == -2500);
  CHECK(a.items[3].boolean);
  CHECK_FALSE(a.items[4].boolean);
  CHECK(a.items[5].is_null());
  CHECK(v.find("s")->text == "x\"\\/\n\xc3\xa9\xf0\x9f\x98\x80");  // é and U+1F600 from a surrogate pair
  CHECK(v.find("o")->is_object());
  CHECK(v.find("missing") == nullptr);
  CHECK(json::parse("18446744073709551615").number == doctest::Approx(1.8446744073709552e19));
}

TEST_CASE("json: bad text is refused with its line, column and what was wrong")
{
  CHECK(parse_failure("{\"a\": 1,\n \"b\": }") == "line 2, column 7: unexpected character '}' where a value was expected");
  CHECK(parse_failure("[1, 2") == "line 1, column 6: the text ends where ',' or ']' after an array element was expected (truncated?)");
  CHECK(parse_failure("{\"a\": [1, 2]") == "line 1, column 13: the text ends where ',' or '}' after an object member was expected (truncated?)");
  CHECK(parse_failure("\"abc") == "line 1, column 5: the text ends inside a string (truncated?)");
  CHECK(parse_failure("[01]") == "line 1, column 3: expected ',' or ']' after an array element, found '1'");
  CHECK(parse_failure("[1.]") == "line 1, column 4: a number with no digits after its '.'");
  CHECK(parse_failure("-") == "line 1, column 2: a '-' not followed by digits");
  CHECK(parse_failure("1e999") == "line 1, column 6: a number out of the range of a double");
  CHECK(parse_failure("[tru]") == "line 1, column 2: unexpected word 'tru' where a value was expected");
  CHECK(parse_failure("{1: 2}") == "line 1, column 2: expected a member name in double quotes");
  CHECK(parse_failure("\"a\tb\"") == "line 1, column 3: a control character inside a string (escape it)");
  CHECK(parse_failure("\"\\q\"") == "line 1, column 3: an unknown escape in a string");
  CHECK(parse_failure("\"\\ud800\"") == "line 1, column 8: a lone UTF-16 high surrogate in a \\u escape");
  CHECK(parse_failure("{} x") == "line 1, column 4: unexpected text after the JSON value");
  CHECK(parse_failure("") == "line 1, column 1: the text ends where a value was expected (truncated?)");
  CHECK(parse_failure(std::string(300, '[') + std::string(300, ']')) == "line 1, column 258: nested deeper than 256 levels");
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
  CHECK(render_failure("{\"traces\": [") == "strata::viewer: not JSON: line 1, column 13: the text ends where a value was expected (truncated?)");
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
  CHECK(back.find("traces")->items[0].find("trace")->text == hostile);
  const std::string snap = strata::viewer::render_snapshot_html(R"({"box":"b","segments":[]})");
  CHECK(snap.find("data-kind=\"snapshot\"") != std::string::npos);
  CHECK(embedded_data(snap) == R"({"box":"b","segments":[]})");
}

TEST_CASE("the committed fixture report is a valid report")
{
  const std::string text = fixture();
  const json::value doc = json::parse(text);
  CHECK(strata::viewer::check_document(doc) == strata::viewer::document_kind::report);
  CHECK(doc.find("traces")->items.size() == 2);
  CHECK(json::parse(embedded_data(strata::viewer::render_html(text))).find("traces")->items.size() == 2);
}
