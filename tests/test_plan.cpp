// strata-plan and tools/replay: the trace reader's checks, capacity parsing, the capacity search,
// the PyTorch caching allocator model and the JSON report.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "../tools/plan/capacity.hpp"
#include "../tools/plan/planner.hpp"

namespace {

using namespace strata;
using replay::parse_trace;
using replay::trace_error;
using replay::trace_event;

const std::filesystem::path inputs = std::filesystem::path(__FILE__).parent_path() / "plan";

/// The message of the trace_error that parsing `text` throws (empty when it parses).
std::string parse_error(const std::string& text)
{
  try {
    parse_trace(text, "t.csv");
  } catch (const trace_error& e) {
    return e.what();
  }
  return {};
}

std::string capacity_error(const std::string& text)
{
  try {
    plan::parse_capacity(text);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return {};
}

} // namespace

TEST_CASE("trace reader: header, comments, blank lines and CRLF are accepted")
{
  const auto events = parse_trace("# made by hand\nop,id,bytes,stream\r\na,7,512,0\r\n\na,8,2097152,3\nf,7,512,1\n", "t.csv");
  REQUIRE(events.size() == 3);
  CHECK(events[0].allocate);
  CHECK(events[0].id == 7);
  CHECK(events[1].bytes == 2097152);
  CHECK(events[1].stream == 3);
  CHECK_FALSE(events[2].allocate);
  CHECK(events[2].stream == 1);
}

TEST_CASE("trace reader: every bad line is refused with the file, the line and what was wrong")
{
  CHECK(parse_error("op,id,bytes,stream\na,1,512,0\nx,2,512,0\n") == "t.csv:3: unknown op `x` (expected a or f): `x,2,512,0`");
  CHECK(parse_error("a,1,-512,0\n") == "t.csv:1: negative size -512: `a,1,-512,0`");
  CHECK(parse_error("a,1,12kb,0\n") == "t.csv:1: the size `12kb` is not a number of bytes: `a,1,12kb,0`");
  CHECK(parse_error("a,1,,0\n") == "t.csv:1: the size `` is not a number of bytes: `a,1,,0`");
  CHECK(parse_error("a,1,512,0\nf,2,512,0\n") == "t.csv:2: free of unknown id 2 (never allocated, or already freed): `f,2,512,0`");
  CHECK(parse_error("a,1,512,0\nf,1,512,0\nf,1,512,0\n") == "t.csv:3: free of unknown id 1 (never allocated, or already freed): `f,1,512,0`");
  CHECK(parse_error("a,1,512,0\na,1,512,0\n") == "t.csv:2: id 1 is allocated again while live (allocated on line 1): `a,1,512,0`");
  CHECK(parse_error("a,1,512\n") == "t.csv:1: expected 4 fields `op,id,bytes,stream`, found 3: `a,1,512`");
  CHECK(parse_error("a,1,512,0,9\n") == "t.csv:1: expected 4 fields `op,id,bytes,stream`, found 5: `a,1,512,0,9`");
  CHECK(parse_error("a,one,512,0\n") == "t.csv:1: the id `one` is not a non-negative integer: `a,one,512,0`");
  CHECK(parse_error("a,1,512,s\n") == "t.csv:1: the stream `s` is not an integer: `a,1,512,s`");
  CHECK(parse_error("a,1,512,0\na,2,51") == "t.csv:2: the last line has no newline: the file looks truncated");
  CHECK(parse_error("a,1,512,0\na,2,512,0\n").empty());
}

TEST_CASE("trace reader: binary data is refused without being echoed, and a quoted line shows no control bytes")
{
  const std::string elf = std::string("\x7f" "ELF\x02\x01\x01", 7) + std::string(9, '\0') + "\x1b[2J\n";
  CHECK(parse_error(elf) == "t.csv: binary data, not a trace (strata's traces are CSV text `op,id,bytes,stream`, plain or gzip; "
                            "a PyTorch snapshot is read as one when its name ends in .pickle or .pkl)");
  CHECK(parse_error(std::string("a,1,512,0\n\x01\x02,3\n")).rfind("t.csv: binary data", 0) == 0);
  // Past the first 4 KiB the lines are checked one by one: what a message quotes is escaped and cut short.
  std::string late;
  for (int i = 0; late.size() <= 4096; ++i) late += "a," + std::to_string(i) + ",512,0\n";
  const std::string lines = std::to_string(std::count(late.begin(), late.end(), '\n') + 1);
  CHECK(parse_error(late + "a,\x1b[31m,512,0\n") ==
        "t.csv:" + lines + ": the id `\\x1b[31m` is not a non-negative integer: `a,\\x1b[31m,512,0`");
  CHECK(parse_error(late + std::string(100, 'z') + "\n") ==
        "t.csv:" + lines + ": expected 4 fields `op,id,bytes,stream`, found 1: `" + std::string(80, 'z') + "...`");
  // UTF-8 in a comment is text, not binary.
  CHECK(parse_error("# tra\xc3\xa7" "e\na,1,512,0\n").empty());
}

TEST_CASE("trace reader: gzip and plain files read the same; a truncated gzip file is refused")
{
  const auto plain = replay::read_trace((inputs / "mixed.csv").string());
  const auto gz = replay::read_trace((inputs / "mixed.csv.gz").string());
  REQUIRE(plain.size() == 1500);
  REQUIRE(gz.size() == plain.size());
  for (std::size_t i = 0; i < plain.size(); ++i) {
    CHECK(gz[i].id == plain[i].id);
    CHECK(gz[i].bytes == plain[i].bytes);
    CHECK(gz[i].stream == plain[i].stream);
    CHECK(gz[i].allocate == plain[i].allocate);
  }
  const std::string truncated = (inputs / "truncated.csv.gz").string();
  try {
    replay::read_trace(truncated);
    FAIL("a truncated gzip file was read");
  } catch (const trace_error& e) {
    CHECK(e.file() == truncated);
    CHECK(std::string(e.what()).find("truncated") != std::string::npos);
  }
  try {
    replay::read_trace((inputs / "no-such-trace.csv").string());
    FAIL("a missing file was read");
  } catch (const trace_error& e) {
    CHECK(std::string(e.what()).find("no-such-trace.csv: cannot open the file") != std::string::npos);
  }
}

TEST_CASE("capacity parsing: sizes in every unit, device names, a number without a unit refused, and a message naming what does not parse")
{
  using plan::parse_capacity;
  CHECK(parse_capacity("80GiB") == (std::size_t{80} << 30));
  CHECK(parse_capacity("80GB") == 80'000'000'000ull);
  CHECK(parse_capacity("81920MiB") == (std::size_t{80} << 30));
  CHECK(parse_capacity("1.5TiB") == (std::size_t{3} << 39));
  CHECK(parse_capacity("85899345920B") == (std::size_t{80} << 30));
  CHECK(parse_capacity("4096B") == 4096);
  CHECK(parse_capacity("2 gib") == (std::size_t{2} << 30));
  CHECK(parse_capacity("H100-80GB") == 85017493504ull);
  CHECK(parse_capacity("h100") == 85017493504ull);
  CHECK(parse_capacity("H200") == (std::size_t{141} << 30));
  CHECK(parse_capacity("A100-40GB") == (std::size_t{40} << 30));
  CHECK(capacity_error("80GX").rfind("capacity `80GX`: unknown unit `GX` (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB, or a device: H100-80GB,", 0) == 0);
  CHECK(capacity_error("-5GiB") == "capacity `-5GiB`: negative");
  CHECK(capacity_error("H900").rfind("capacity `H900`: not a size or a known device", 0) == 0);
  CHECK(capacity_error("1.2.3GiB") == "capacity `1.2.3GiB`: `1.2.3` is not a number");
  CHECK(capacity_error("0B") == "capacity `0B`: must be at least one byte");
  CHECK(capacity_error("15").rfind("capacity `15`: no unit (write 15GiB, 15GB or 15B for bytes), or give a device: H100-80GB,", 0) == 0);
  CHECK(capacity_error("85899345920").rfind("capacity `85899345920`: no unit", 0) == 0);
  CHECK(capacity_error("1.5 ").rfind("capacity `1.5 `: no unit", 0) == 0);
  CHECK(capacity_error("").rfind("capacity: empty", 0) == 0);
}

TEST_CASE("PyTorch caching allocator model: rounding, segment sizes, splitting, per-stream pools, release on refusal")
{
  using model = replay::torch_caching_model<ref<simulated_source>>;
  static_assert(model::round_size(1) == 512 && model::round_size(1000) == 1024 && model::round_size(4096) == 4096);
  static_assert(model::segment_size(1 << 20) == (2 << 20) && model::segment_size((1 << 20) + 512) == (20 << 20));
  static_assert(model::segment_size(10 << 20) == (10 << 20) && model::segment_size((10 << 20) + 512) == (12 << 20));
  simulated_source sim(std::size_t{64} << 20, std::size_t{1} << 32, simulated_source::rounding::like_cudamalloc);
  model pool{ref(sim)};
  void* a = pool.allocate(1000, 0);  // a small block from a 2 MiB segment
  CHECK(pool.reserved() == (2 << 20));
  CHECK(pool.allocated() == 1024);
  void* b = pool.allocate(3000, 0);  // same segment, next to a
  CHECK(reinterpret_cast<char*>(b) == reinterpret_cast<char*>(a) + 1024);
  void* c = pool.allocate(5 << 20, 0);  // a 20 MiB segment, split: 15 MiB stays free for large requests
  CHECK(pool.reserved() == (22 << 20));
  void* d = pool.allocate(4 << 20, 0);
  CHECK(reinterpret_cast<char*>(d) == reinterpret_cast<char*>(c) + (5 << 20));
  CHECK(pool.reserved() == (22 << 20));
  void* e = pool.allocate(4 << 20, 1);  // another stream never takes stream 0's free blocks
  CHECK(pool.reserved() == (42 << 20));
  pool.deallocate(d);
  pool.deallocate(c);  // merges with d and the 11 MiB tail: one free 20 MiB block
  auto snap = pool.snapshot();
  REQUIRE(snap.segments.size() == 3);
  CHECK(pool.usage().largest_free == (20 << 20));
  // 64 MiB capacity, 42 MiB held: a 30 MiB request forces PyTorch's release of wholly free segments (the
  // free 20 MiB one) before the second try succeeds.
  void* f = pool.allocate(30 << 20, 0);
  CHECK(pool.reserved() == (22 << 20) + (30 << 20));
  CHECK(pool.segments() == 3);
  // A request that cannot fit even after the release is out_of_memory, and the model is unchanged.
  CHECK_THROWS_AS(pool.allocate(20 << 20, 0), out_of_memory);
  CHECK(pool.reserved() == (52 << 20));
  for (void* p : {a, b, e, f}) pool.deallocate(p);
  CHECK(pool.allocated() == 0);
  CHECK(pool.release() == (52 << 20));
  CHECK(sim.allocated_bytes() == 0);
}

TEST_CASE("planner: every stack fits at its smallest capacity and is refused one step below it")
{
  const auto events = replay::read_trace((inputs / "mixed.csv").string());
  std::size_t stacks_checked = 0;
  for (const auto& spec : replay::standard_stacks()) {
    CAPTURE(spec.key);
    plan::plan_options opts{.capacity = std::size_t{64} << 20, .threads = 1};
    const plan::stack_plan p = plan::plan_stack(spec, events, opts, 24 << 20, {});
    REQUIRE(p.min_capacity);
    const std::size_t min = *p.min_capacity;
    CHECK(min <= p.result.peak_reserved + plan::granularity);
    CHECK(min >= p.result.peak_live);
    CHECK(plan::fits_in(spec, events, min));
    if (!p.min_capacity_exact) CHECK_FALSE(plan::fits_in(spec, events, min - plan::granularity));
    else CHECK_FALSE(plan::fits_in(spec, events, min - 256));
    // The capacity asked for: fits exactly when a capped replay does.
    CHECK(*p.fits == plan::fits_in(spec, events, std::size_t{64} << 20));
    // The map at the peak holds what the stack held then.
    REQUIRE(p.map);
    if (spec.key != "cudamalloc") CHECK(p.map->reserved() >= p.result.peak_live / 2);
    ++stacks_checked;
  }
  CHECK(stacks_checked == replay::standard_stacks().size());
}

TEST_CASE("planner: the timeline keeps each bucket's maximum, so its peaks are the replay's peaks")
{
  const auto events = replay::read_trace((inputs / "mixed.csv").string());
  const auto stacks = replay::standard_stacks();
  const plan::trace_plan tp = plan::plan_trace("mixed", events, stacks, {.threads = 2});
  REQUIRE(tp.stacks.size() == stacks.size());
  CHECK(tp.largest_request == (24 << 20));
  for (const auto& s : tp.stacks) {
    CAPTURE(s.key);
    const auto& line = s.result.line;
    REQUIRE(line.op.size() <= plan::timeline_points);
    REQUIRE(line.op.size() == line.live.size());
    CHECK(*std::max_element(line.live.begin(), line.live.end()) == s.result.peak_live);
    CHECK(*std::max_element(line.reserved.begin(), line.reserved.end()) >= s.result.peak_reserved);
    CHECK(s.result.operations == events.size());
    // The largest request's place at the peak, when there is one, is a free block that holds it.
    if (s.request_segment) {
      const auto& seg = s.map->segments.at(*s.request_segment);
      const auto it = std::find_if(seg.blocks.begin(), seg.blocks.end(), [&](const auto& b) { return b.offset == *s.request_offset; });
      REQUIRE(it != seg.blocks.end());
      CHECK(it->free);
      CHECK(it->size >= tp.largest_request);
    }
  }
  const std::string json = plan::to_json(std::vector<plan::trace_plan>{tp});
  CHECK(json.rfind("{\"tool\":\"strata-plan\",\"version\":1,\"traces\":[{\"trace\":\"mixed\",\"operations\":1500,", 0) == 0);
  CHECK(json.find("\"name\":\"pytorch_caching\"") != std::string::npos);
}

TEST_CASE("replay: every stack counts the allocations it served and the device allocations it took")
{
  const auto events = replay::read_trace((inputs / "mixed.csv").string());
  const auto served = static_cast<std::size_t>(std::count_if(events.begin(), events.end(), [](const trace_event& e) { return e.allocate; }));
  const auto stacks = replay::standard_stacks();
  auto stack = [&](const std::string& key) {
    const auto it = std::find_if(stacks.begin(), stacks.end(), [&](const replay::stack_spec& s) { return s.key == key; });
    REQUIRE(it != stacks.end());
    return *it;
  };
  for (const auto& spec : stacks) {
    CAPTURE(spec.key);
    const auto r = spec.run(events, {});
    REQUIRE_FALSE(r.failed);
    CHECK(r.allocations == served);
    CHECK(r.upstream_allocations >= 1);
    CHECK(r.upstream_allocations <= served);
  }
  CHECK(stack("cudamalloc").run(events, {}).upstream_allocations == served);  // one device allocation per tensor

  // Pools that reuse their memory: one device allocation for a thousand served.
  std::vector<trace_event> reuse;
  for (std::uint64_t i = 0; i < 1000; ++i) {
    reuse.push_back({true, i, std::size_t{1} << 20, 0});
    reuse.push_back({false, i, std::size_t{1} << 20, 0});
  }
  for (const char* key : {"coalescing_pool", "default_pool"}) {
    CAPTURE(key);
    const auto r = stack(key).run(reuse, {});
    CHECK(r.allocations == 1000);
    CHECK(r.upstream_allocations == 1);
    CHECK(r.upstream_allocation_percent() == doctest::Approx(0.1));
  }

  // A replay the device refuses part-way counts what was served before the refusal.
  std::vector<trace_event> growing;
  for (std::uint64_t i = 0; i < 10; ++i) growing.push_back({true, i, std::size_t{1} << 20, 0});
  replay::run_options small;
  small.capacity = (std::size_t{9} << 20) / 2;  // room for four 1 MiB allocations
  const auto r = stack("cudamalloc").run(growing, small);
  CHECK(r.failed);
  CHECK(r.allocations == 4);
  CHECK(r.upstream_allocations == 4);
}

TEST_CASE("planner: a 400,000-operation trace in one replay per stack stays linear (timeline of at most 2000 points)")
{
  std::vector<trace_event> events;
  for (std::uint64_t i = 0; i < 200'000; ++i) {
    events.push_back({true, i, 512 * (1 + i % 64), 0});
    if (i >= 32) events.push_back({false, i - 32, 512 * (1 + (i - 32) % 64), 0});
  }
  replay::run_options o;
  o.timeline_points = plan::timeline_points;
  const auto r = replay::standard_stacks().front().run(events, o);
  CHECK_FALSE(r.failed);
  CHECK(r.operations == events.size());
  CHECK(r.line.op.size() == plan::timeline_points);
}
