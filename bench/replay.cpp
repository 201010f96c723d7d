// Replays an allocation trace against strata stacks on simulated memory and reports, for each stack, time
// per operation and peak held over peak live: how much memory the stack holds from the device, at its worst,
// for what the program needed.
//   replay TRACE [--scale F] [--exact] [--json FILE] [--calls]
// --scale multiplies every size by F (rounded up to 512 bytes, as PyTorch rounds), so a figure that holds
// only at one lucky size shows it. Chunked pools run over simulated_source rounding as cudaMalloc does
// (requests of 2 MiB or more take a multiple of 2 MiB) unless --exact; page-mapped pools over simulated_pages
// (2 MiB granularity), whose driver calls are counted and reported per 1000 operations; --calls lists
// every kind (reserve, create, release, map, unmap, set access, device wait), one line per page-mapped stack.
// The stream column is honoured by the stream-ordered stacks over simulated streams, where each operation is
// one piece of work on its stream, completed at once or 64 operations later. No GPU needed: the replay on
// device memory, beside the peers, is bench/peers. The stacks and the replay itself are tools/replay's, the
// same code strata-plan runs, so the two report the same figures.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../tools/replay/replay.hpp"

namespace {

/// Every kind of driver call of the page-mapped stacks, per 1000 operations.
void print_calls(const std::vector<strata::replay::replay_result>& results)
{
  std::printf("\ndriver calls per 1000 operations: reserve / create / release / map / unmap / set access / device wait (all)\n");
  for (const auto& r : results) {
    if (!r.has_page_calls) continue;
    const auto& c = r.page_calls;
    std::printf("%-68s %.2f / %.2f / %.2f / %.2f / %.2f / %.2f / %.2f (%.2f)\n", r.stack.c_str(), r.per_1000_ops(c.reserves),
                r.per_1000_ops(c.creates), r.per_1000_ops(c.releases), r.per_1000_ops(c.maps), r.per_1000_ops(c.unmaps),
                r.per_1000_ops(c.access_calls), r.per_1000_ops(c.synchronizes), r.per_1000_ops(c.driver_calls()));
  }
}

} // namespace

int main(int argc, char** argv)
{
  using namespace strata::replay;
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s TRACE [--scale F] [--exact] [--json FILE] [--calls]\n", argv[0]);
    return 2;
  }
  std::string json_path;
  double scale = 1.0;
  run_options options{.timed = true};
  bool calls = false;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json" && i + 1 < argc) json_path = argv[++i];
    else if (arg == "--scale" && i + 1 < argc) scale = std::strtod(argv[++i], nullptr);
    else if (arg == "--exact") options.rounding = strata::simulated_source::rounding::none;
    else if (arg == "--calls") calls = true;
    else {
      std::fprintf(stderr, "replay: unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  if (!(scale > 0)) {
    std::fprintf(stderr, "replay: --scale must be a positive number\n");
    return 2;
  }
  std::vector<trace_event> events;
  try {
    events = read_trace(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "replay: %s\n", e.what());
    return 2;
  }
  if (scale != 1.0) scale_sizes(events, scale);

  std::vector<replay_result> results;
  for (const stack_spec& stack : standard_stacks()) results.push_back(stack.run(events, options));
  print_table(argv[1], results);
  if (calls) print_calls(results);
  if (!json_path.empty()) write_json(json_path, argv[1], results, scale);
  return 0;
}
