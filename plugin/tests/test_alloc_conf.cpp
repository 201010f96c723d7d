// STRATA_ALLOC_CONF: every key's good values, every key's bad values, and the string's own shape.
#include <doctest/doctest.h>

#include <string>
#include <utility>

#include "alloc_conf.hpp"

using namespace strata::plugin;

namespace {

/// The message of the conf_error that parsing `text` throws ("" when it parses).
std::string refusal(const std::string& text)
{
  try {
    (void)parse_alloc_conf(text);
  } catch (const conf_error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

} // namespace

TEST_CASE("alloc_conf: empty and blank strings give every default")
{
  for (const char* text : {"", "   ", "\t"}) {
    const alloc_conf c = parse_alloc_conf(text);
    CHECK(c.stack == stack_kind::default_pool);
    CHECK(!c.limit_fraction);
    CHECK(!c.limit_bytes);
    CHECK(c.record.empty());
    CHECK(c.peers == alloc_conf::peer_mode::none);
    CHECK(c.release_on_oom);
    CHECK(c.sim_devices == 1);
  }
}

TEST_CASE("alloc_conf: stack")
{
  CHECK(parse_alloc_conf("stack=default").stack == stack_kind::default_pool);
  CHECK(parse_alloc_conf("stack=coalescing").stack == stack_kind::coalescing);
  CHECK(parse_alloc_conf("stack=simulated").stack == stack_kind::simulated);
  const std::string e = refusal("stack=caching");
  CHECK(contains(e, "stack=caching"));
  CHECK(contains(e, "default, coalescing and simulated"));
  CHECK(contains(refusal("stack=Default"), "stack=Default"));  // names are case-sensitive
}

TEST_CASE("alloc_conf: limit as a fraction or as bytes with a unit")
{
  CHECK(*parse_alloc_conf("limit=0.9").limit_fraction == doctest::Approx(0.9));
  CHECK(*parse_alloc_conf("limit=1").limit_fraction == doctest::Approx(1.0));
  CHECK(*parse_alloc_conf("limit=1.0").limit_fraction == doctest::Approx(1.0));
  CHECK(*parse_alloc_conf("limit=40GiB").limit_bytes == (std::size_t{40} << 30));
  CHECK(*parse_alloc_conf("limit=512MiB").limit_bytes == (std::size_t{512} << 20));
  CHECK(*parse_alloc_conf("limit=1.5GiB").limit_bytes == (std::size_t{3} << 29));
  CHECK(*parse_alloc_conf("limit=4096B").limit_bytes == 4096);
  CHECK(*parse_alloc_conf("limit=10GB").limit_bytes == std::size_t{10000000000});
  CHECK(*parse_alloc_conf("limit=2KiB").limit_bytes == 2048);
  CHECK(*parse_alloc_conf("limit=1TiB").limit_bytes == (std::size_t{1} << 40));
  CHECK(!parse_alloc_conf("limit=40GiB").limit_fraction);
  for (const char* bad : {"limit=0", "limit=1.5", "limit=-0.5", "limit=2", "limit=4096", "limit=abc", "limit=0.9x",
                          "limit=40 GiBs", "limit=GiB", "limit=-1GiB", "limit=0GiB", "limit=0.3B", "limit=nan", "limit=inf"}) {
    const std::string e = refusal(bad);
    CAPTURE(bad);
    CHECK(contains(e, bad));  // the message repeats key=value
  }
  CHECK(contains(refusal("limit=2"), "(0, 1]"));
  CHECK(contains(refusal("limit=abc"), "unit"));
}

TEST_CASE("alloc_conf: record, and .gz refused because the recorder cannot compress")
{
  CHECK(parse_alloc_conf("record=/tmp/trace.csv").record == "/tmp/trace.csv");
  CHECK(parse_alloc_conf("record=trace").record == "trace");
  const std::string e = refusal("record=trace.csv.gz");
  CHECK(contains(e, "record=trace.csv.gz"));
  CHECK(contains(e, "cannot compress"));
}

TEST_CASE("alloc_conf: peers")
{
  CHECK(parse_alloc_conf("peers=all").peers == alloc_conf::peer_mode::all);
  CHECK(parse_alloc_conf("peers=none").peers == alloc_conf::peer_mode::none);
  const alloc_conf c = parse_alloc_conf("peers=1:2:5");
  CHECK(c.peers == alloc_conf::peer_mode::list);
  CHECK(c.peer_list == std::vector<int>{1, 2, 5});
  CHECK(parse_alloc_conf("peers=3").peer_list == std::vector<int>{3});
  for (const char* bad : {"peers=some", "peers=1:x", "peers=1::2", "peers=-1", "peers=1:", "peers=5000"}) {
    CAPTURE(bad);
    CHECK(contains(refusal(bad), bad));
  }
  CHECK(contains(refusal("peers=1:1"), "listed twice"));
  CHECK(contains(refusal("stack=coalescing,peers=all"), "only to stack=default"));
  CHECK(contains(refusal("peers=all,stack=simulated"), "only to stack=default"));  // order does not matter
}

TEST_CASE("alloc_conf: release_on_oom")
{
  CHECK(parse_alloc_conf("release_on_oom=true").release_on_oom);
  CHECK(parse_alloc_conf("release_on_oom=1").release_on_oom);
  CHECK(!parse_alloc_conf("release_on_oom=false").release_on_oom);
  CHECK(!parse_alloc_conf("release_on_oom=0").release_on_oom);
  for (const char* bad : {"release_on_oom=yes", "release_on_oom=True", "release_on_oom=2"}) {
    CAPTURE(bad);
    const std::string e = refusal(bad);
    CHECK(contains(e, bad));
    CHECK(contains(e, "true or false"));
  }
}

TEST_CASE("alloc_conf: return_free_chunks, only with stack=coalescing")
{
  CHECK(parse_alloc_conf("").return_free_chunks);  // the library's default
  CHECK(parse_alloc_conf("stack=coalescing,return_free_chunks=true").return_free_chunks);
  CHECK(!parse_alloc_conf("stack=coalescing,return_free_chunks=false").return_free_chunks);
  CHECK(!parse_alloc_conf("return_free_chunks=0,stack=coalescing").return_free_chunks);
  const std::string wrong_stack = refusal("return_free_chunks=false");
  CHECK(contains(wrong_stack, "applies only to stack=coalescing"));
  CHECK(contains(wrong_stack, "default"));
  CHECK(contains(refusal("stack=coalescing,return_free_chunks=maybe"), "true or false"));
}

TEST_CASE("alloc_conf: the simulated stack's keys, and only with it")
{
  const alloc_conf c = parse_alloc_conf("stack=simulated,sim_capacity=16GiB,sim_page=64KiB,sim_devices=4");
  CHECK(c.sim_capacity == (std::size_t{16} << 30));
  CHECK(c.sim_page == (std::size_t{64} << 10));
  CHECK(c.sim_devices == 4);
  for (const char* key : {"sim_capacity=1GiB", "sim_page=2MiB", "sim_devices=2"}) {
    CAPTURE(key);
    const std::string e = refusal(std::string("stack=default,") + key);
    CHECK(contains(e, "only to stack=simulated"));
    CHECK(contains(refusal(key), "only to stack=simulated"));  // the default stack too
  }
  for (const char* bad : {"sim_capacity=16", "sim_capacity=big", "sim_page=3000B", "sim_page=100B", "sim_devices=0",
                          "sim_devices=65", "sim_devices=two"}) {
    CAPTURE(bad);
    CHECK(contains(refusal(std::string("stack=simulated,") + bad), bad));
  }
  CHECK(contains(refusal("stack=simulated,sim_capacity=1MiB,sim_page=2MiB"), "less than one page"));
}

TEST_CASE("alloc_conf: several keys, spaces around keys and values")
{
  const alloc_conf c = parse_alloc_conf(" stack = coalescing , limit = 0.5 ,release_on_oom=false , record=t.csv ");
  CHECK(c.stack == stack_kind::coalescing);
  CHECK(*c.limit_fraction == doctest::Approx(0.5));
  CHECK(!c.release_on_oom);
  CHECK(c.record == "t.csv");
}

TEST_CASE("alloc_conf: the string's shape: unknown keys, duplicates, empty entries, missing '=' or value")
{
  std::string e = refusal("stack=default,colour=blue");
  CHECK(contains(e, "unknown key 'colour'"));
  CHECK(contains(e, "colour=blue"));
  CHECK(contains(e, "the keys are stack, limit, record"));
  CHECK(contains(refusal("Stack=default"), "unknown key 'Stack'"));

  e = refusal("limit=0.5,limit=0.6");
  CHECK(contains(e, "'limit' is given twice"));
  CHECK(contains(e, "limit=0.6"));
  CHECK(contains(refusal("stack=default, stack =default"), "given twice"));

  CHECK(contains(refusal("stack=default,"), "empty entry"));
  CHECK(contains(refusal(",stack=default"), "empty entry"));
  CHECK(contains(refusal("stack=default,,limit=0.5"), "empty entry"));
  CHECK(contains(refusal("stack=default, ,limit=0.5"), "empty entry"));

  CHECK(contains(refusal("stack"), "entry 'stack' is not key=value"));
  CHECK(contains(refusal("stack=default,limit"), "entry 'limit' is not key=value"));
  CHECK(contains(refusal("=default"), "no key"));
  e = refusal("record=");
  CHECK(contains(e, "record="));
  CHECK(contains(e, "empty value"));
  CHECK(contains(refusal("stack=default:coalescing"), "stack=default:coalescing"));  // PyTorch's ':' is not ours
}

TEST_CASE("alloc_conf: each refusal is a conf_error, a std::invalid_argument")
{
  CHECK_THROWS_AS(parse_alloc_conf("bogus=1"), conf_error);
  CHECK_THROWS_AS(parse_alloc_conf("limit=7"), std::invalid_argument);
}

TEST_CASE("alloc_conf: owner_cover_window")
{
  CHECK(parse_alloc_conf("").owner_cover_window == 4096);
  CHECK(parse_alloc_conf("owner_cover_window=always").owner_cover_window == SIZE_MAX);
  CHECK(parse_alloc_conf("owner_cover_window=100").owner_cover_window == 100);
  for (const char* bad : {"owner_cover_window=0", "owner_cover_window=never", "owner_cover_window=-3", "owner_cover_window=1.5"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(parse_alloc_conf(bad), doctest::Contains("owner_cover_window"), conf_error);
  }
}

TEST_CASE("alloc_conf: check_capture")
{
  CHECK_FALSE(parse_alloc_conf("").check_capture);
  CHECK(parse_alloc_conf("check_capture=true").check_capture);
  CHECK_FALSE(parse_alloc_conf("check_capture=false").check_capture);
  for (const char* bad : {"check_capture=", "check_capture=never", "check_capture=always"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(parse_alloc_conf(bad), doctest::Contains("check_capture"), conf_error);
  }
}

TEST_CASE("alloc_conf: reclaim")
{
  using mode = alloc_conf::reclaim_mode;
  CHECK(parse_alloc_conf("").reclaim == mode::relocate_idle);
  CHECK(parse_alloc_conf("reclaim=never").reclaim == mode::never);
  CHECK(parse_alloc_conf("reclaim=high_water").reclaim == mode::high_water);
  CHECK(parse_alloc_conf("reclaim=relocate_idle").reclaim == mode::relocate_idle);
  CHECK_THROWS_WITH_AS(parse_alloc_conf("reclaim=sometimes"), doctest::Contains("relocate_idle"), conf_error);
}

TEST_CASE("alloc_conf: keys spelled before the library's option names are refused, naming the new spelling")
{
  const std::pair<const char*, const char*> renamed[] = {{"owner_event_window=100", "owner_cover_window"},
                                                         {"capture_check=always", "check_capture=true"},
                                                         {"reclaim=relocate", "reclaim=relocate_idle"},
                                                         {"reclaim_slack=0.02", "reclaim_slack_fraction"},
                                                         {"reclaim_headroom=0.0625", "reclaim_headroom_fraction"}};
  for (const auto& [old_entry, new_spelling] : renamed) {
    CAPTURE(old_entry);
    CHECK_THROWS_WITH_AS(parse_alloc_conf(std::string("stack=default,") + old_entry), doctest::Contains(new_spelling), conf_error);
  }
}

TEST_CASE("alloc_conf: the share keys reclaim_slack_fraction and reclaim_headroom_fraction")
{
  struct share_key {
    const char* key;
    double alloc_conf::*field;
  };
  for (const share_key k : {share_key{"reclaim_slack_fraction", &alloc_conf::reclaim_slack_fraction},
                            share_key{"reclaim_headroom_fraction", &alloc_conf::reclaim_headroom_fraction}}) {
    CAPTURE(k.key);
    const std::string key = k.key;
    CHECK(parse_alloc_conf("").*k.field == 0.0);
    CHECK(parse_alloc_conf(key + "=0.0625").*k.field == doctest::Approx(0.0625));
    CHECK(parse_alloc_conf(key + "=1").*k.field == 1.0);
    for (const char* bad : {"-0.1", "-1", "1.5", "2", "lots", "much", ""}) {
      CAPTURE(bad);
      CHECK_THROWS_WITH_AS(parse_alloc_conf(key + "=" + bad), doctest::Contains(k.key), conf_error);
    }
  }
}

namespace {

/// The message of the conf_error that reading PyTorch's `text` throws ("" when it reads).
std::string torch_refusal(const std::string& text, stack_kind stack = stack_kind::default_pool)
{
  try {
    (void)parse_torch_alloc_conf(text, stack);
  } catch (const conf_error& e) {
    return e.what();
  }
  return "";
}

} // namespace

TEST_CASE("PyTorch's allocator settings: the fraction is honoured, bracketed lists read, empty text is nothing")
{
  CHECK(parse_torch_alloc_conf("", stack_kind::default_pool).notes.empty());
  CHECK(!parse_torch_alloc_conf("", stack_kind::default_pool).fraction);
  const auto r = parse_torch_alloc_conf("per_process_memory_fraction:0.25, pinned_num_register_threads:8", stack_kind::default_pool);
  REQUIRE(r.fraction);
  CHECK(*r.fraction == doctest::Approx(0.25));
  CHECK(r.notes.empty());  // the pinned host allocator stays PyTorch's: its keys take effect there
  const auto lists = parse_torch_alloc_conf("roundup_power2_divisions:[64:8,256:4,>:1],expandable_segments:False", stack_kind::default_pool);
  REQUIRE(lists.notes.size() == 1);
  CHECK(lists.notes[0].find("roundup_power2_divisions:[64:8,256:4,>:1] has no effect under strata") != std::string::npos);
  CHECK(parse_torch_alloc_conf("backend:native", stack_kind::default_pool).notes.empty());
}

TEST_CASE("PyTorch's allocator settings: keys without effect are noted with the reason, never dropped silently")
{
  const auto r = parse_torch_alloc_conf("expandable_segments:True,max_split_size_mb:128,release_lock_on_cudamalloc:true,"
                                        "graph_capture_record_stream_reuse:True,large_segment_size_mb:64,max_non_split_rounding_mb:32",
                                        stack_kind::default_pool);
  REQUIRE(r.notes.size() == 5);  // graph_capture_record_stream_reuse is honoured: no note
  const char* keys[] = {"expandable_segments", "max_split_size_mb", "release_lock_on_cudamalloc", "large_segment_size_mb",
                        "max_non_split_rounding_mb"};
  CHECK_THROWS_AS(parse_torch_alloc_conf("graph_capture_record_stream_reuse:maybe", stack_kind::default_pool), conf_error);
  for (std::size_t i = 0; i < 5; ++i) {
    CHECK(r.notes[i].find(std::string("PYTORCH_CUDA_ALLOC_CONF: ") + keys[i]) == 0);
    CHECK(r.notes[i].find("has no effect under strata: ") != std::string::npos);
  }
  CHECK(parse_torch_alloc_conf("expandable_segments:True", stack_kind::coalescing).notes.at(0).find("cudaMalloc'd") != std::string::npos);
}

TEST_CASE("PyTorch's allocator settings: what strata cannot honour is refused, naming the key and what to use")
{
  CHECK(torch_refusal("garbage_collection_threshold:0.6").find("PYTORCH_CUDA_ALLOC_CONF: garbage_collection_threshold:0.6: strata gives idle memory back") == 0);
  CHECK(torch_refusal("garbage_collection_threshold:0.6").find("reclaim=high_water") != std::string::npos);
  CHECK(torch_refusal("max_split_size_mb:128", stack_kind::coalescing).find("max_split_size_mb:128") != std::string::npos);
  CHECK(torch_refusal("backend:cudaMallocAsync").find("backend:cudaMallocAsync") != std::string::npos);
  CHECK(torch_refusal("per_process_memory_fraction:1.5").find("expected a fraction in [0, 1]") != std::string::npos);
  CHECK(torch_refusal("per_process_memory_fraction:-0.1").find("expected a fraction") != std::string::npos);
  CHECK(torch_refusal("per_process_memory_fraction:0").empty());  // PyTorch's limiting case: nothing may be held
  CHECK(torch_refusal("expandable_segments:maybe").find("expected True or False") != std::string::npos);
  CHECK(torch_refusal("no_such_key:1").find("unknown key 'no_such_key'") != std::string::npos);
  CHECK(torch_refusal("max_split_size_mb").find("is not key:value") != std::string::npos);
  CHECK(torch_refusal("roundup_power2_divisions:[64:8").find("unclosed '['") != std::string::npos);
  CHECK(torch_refusal("roundup_power2_divisions:64]").find("unopened ']'") != std::string::npos);
  CHECK(torch_refusal("max_split_size_mb:128,per_process_memory_fraction:0.5").empty());
}
