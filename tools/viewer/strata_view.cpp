// strata-view FILE.json -o OUT.html: the memory map viewer's page for a strata-plan report or a strata
// snapshot (strata::to_json), told apart by their members. Exit 0 on success, 2 on bad input or usage.
#include "viewer/html_report.hpp"

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>

namespace {

constexpr const char* usage = "usage: strata-view REPORT_OR_SNAPSHOT.json -o OUT.html\n"
                              "  Writes one self-contained HTML page (no network) drawing a strata-plan report\n"
                              "  (strata-plan --json) or a pool's snapshot (strata::to_json(pool.snapshot())).\n";

int fail(const std::string& message)
{
  std::cerr << "strata-view: " << message << '\n';
  return 2;
}

} // namespace

int main(int argc, char** argv)
{
  std::string input, output;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::cout << usage;
      return 0;
    }
    if (arg == "-o" || arg == "--output") {
      if (i + 1 == argc) return fail(std::string(arg) + " needs a file name\n" + usage);
      output = argv[++i];
    } else if (arg.size() > 1 && arg[0] == '-') {
      return fail("unknown option " + std::string(arg) + "\n" + usage);
    } else if (input.empty()) {
      input = arg;
    } else {
      return fail("one input file only (got " + input + " and " + std::string(arg) + ")\n" + usage);
    }
  }
  if (input.empty() || output.empty()) return fail(std::string("an input file and -o OUT.html are needed\n") + usage);

  std::ifstream in(input, std::ios::binary);
  if (!in) return fail(input + ": cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return fail(input + ": reading failed");

  std::string page;
  try {
    page = strata::viewer::render_any_html(text.str());
  } catch (const strata::viewer::shape_error& e) {
    // e.what() starts with "strata::viewer: "; the user wants the file named instead.
    std::string_view what = e.what();
    constexpr std::string_view prefix = "strata::viewer: ";
    if (what.substr(0, prefix.size()) == prefix) what.remove_prefix(prefix.size());
    return fail(input + ": " + std::string(what));
  }
  std::ofstream out(output, std::ios::binary | std::ios::trunc);
  if (!out) return fail(output + ": cannot be written");
  out << page;
  out.close();
  if (!out) return fail(output + ": writing failed");
  std::cerr << "strata-view: wrote " << output << " (" << page.size() << " bytes)\n";
  return 0;
}
