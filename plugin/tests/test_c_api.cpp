// libstrata_alloc.so's C entry points over the simulated stack (no GPU): what PyTorch and CuPy call.
// The plug-in's state belongs to its process (configured once, built on first use), so every case runs in a
// child process of its own; the child reports each failed expectation back through a pipe.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <new>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <strata_alloc.h>

namespace {

/// Expectations checked in the child; their failures travel to the parent as text.
struct expectations {
  std::string failures;
  void operator()(bool ok, const std::string& what, int line)
  {
    if (!ok) failures += "line " + std::to_string(line) + ": " + what + " (last error: " + strata_last_error() + ")\n";
  }
};
#define EXPECT(cond) ex((cond), #cond, __LINE__)

/// Runs `body` in a fresh process; returns what failed there ("" when everything held).
std::string in_child(const std::function<void(expectations&)>& body, bool run_atexit = false)
{
  int fds[2];
  if (pipe(fds) != 0) return "pipe failed";
  std::cout.flush();  // or the child's exit would write the parent's buffered output a second time
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    expectations ex;
    try {
      body(ex);
    } catch (const std::exception& e) {
      ex.failures += std::string("exception escaped: ") + e.what() + "\n";
    }
    const ssize_t written = write(fds[1], ex.failures.data(), ex.failures.size());
    (void)written;
    close(fds[1]);
    if (run_atexit) std::exit(0);  // the plug-in's exit-time trace flush runs
    _exit(0);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status)) out += "child died (signal " + std::to_string(WTERMSIG(status)) + ")\n";
  return out;
}

/// A flat JSON object of numbers and strings, parsed strictly: throws on anything else.
std::map<std::string, std::string> parse_flat_json(const std::string& s)
{
  std::map<std::string, std::string> out;
  std::size_t i = 0;
  auto expect_char = [&](char c) {
    if (i >= s.size() || s[i] != c) throw std::runtime_error("JSON: expected '" + std::string(1, c) + "' at " + std::to_string(i));
    ++i;
  };
  auto string_token = [&] {
    expect_char('"');
    const std::size_t end = s.find('"', i);
    if (end == std::string::npos) throw std::runtime_error("JSON: unterminated string");
    std::string v = s.substr(i, end - i);
    i = end + 1;
    return v;
  };
  expect_char('{');
  while (true) {
    const std::string key = string_token();
    expect_char(':');
    std::string value;
    if (i < s.size() && s[i] == '"') {
      value = string_token();
    } else {
      const std::size_t start = i;
      while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || std::strchr("+-.eE", s[i]) != nullptr)) ++i;
      value = s.substr(start, i - start);
      if (value.empty()) throw std::runtime_error("JSON: no value for " + key);
      (void)std::stod(value);
    }
    if (!out.emplace(key, value).second) throw std::runtime_error("JSON: duplicate key " + key);
    if (i < s.size() && s[i] == ',') {
      ++i;
      continue;
    }
    expect_char('}');
    break;
  }
  if (i != s.size()) throw std::runtime_error("JSON: trailing characters");
  return out;
}

std::map<std::string, std::string> stats(int device)
{
  const std::size_t need = strata_memory_stats_json(device, nullptr, 0);
  std::string buf(need + 1, '\0');
  const std::size_t wrote = strata_memory_stats_json(device, buf.data(), buf.size());
  if (wrote != need) throw std::runtime_error("memory_stats_json changed length between calls");
  buf.resize(need);
  return parse_flat_json(buf);
}

long long stat(int device, const std::string& key)
{
  const auto m = stats(device);
  const auto it = m.find(key);
  if (it == m.end()) throw std::runtime_error("memory_stats has no key " + key);
  return std::stoll(it->second);
}

bool mentions(const std::string& text) { return std::strstr(strata_last_error(), text.c_str()) != nullptr; }

/// A pinned pool lending the sleep/wake backup (strata_set_backup_lender), as strata's PyTorch host allocator
/// does: it counts what it lends and what comes back, keeps what is out readable, and refuses on demand.
struct counting_lender {
  int takes = 0;
  int gives = 0;
  bool refuse = false;
  std::map<void*, std::size_t> out;  ///< lent now: address, bytes

  static void* take(void* ctx, size_t bytes)
  {
    auto& l = *static_cast<counting_lender*>(ctx);
    if (l.refuse) return nullptr;
    void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (p == nullptr) return nullptr;
    ++l.takes;
    l.out.emplace(p, bytes);
    return p;
  }
  static void give(void* ctx, void* p, size_t bytes)
  {
    auto& l = *static_cast<counting_lender*>(ctx);
    const auto it = l.out.find(p);
    if (it == l.out.end() || it->second != bytes) std::abort();  // never lent, or given back at another size
    l.out.erase(it);
    ++l.gives;
    std::free(p);
  }
  int lend() { return strata_set_backup_lender(this, &take, &give); }
  std::size_t bytes_out() const
  {
    std::size_t n = 0;
    for (const auto& [p, bytes] : out) n += bytes;
    return n;
  }
  /// The one block lent now (null unless exactly one is out).
  unsigned char* lent_block() const { return out.size() == 1 ? static_cast<unsigned char*>(out.begin()->first) : nullptr; }
};

/// An allocation on `device` carrying `tag`.
void* tagged_malloc(unsigned tag, std::size_t bytes, int device, cudaStream_t stream)
{
  strata_tag_begin(tag);
  void* p = strata_malloc(bytes, device, stream);
  strata_tag_end();
  return p;
}

/// Fills `bytes` at p with a pattern that tells each byte's place apart.
void stamp(unsigned char* p, std::size_t bytes, unsigned seed)
{
  for (std::size_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>((i / 4096) * 31 + i + seed);
}
bool stamped(const unsigned char* p, std::size_t bytes, unsigned seed)
{
  for (std::size_t i = 0; i < bytes; ++i)
    if (p[i] != static_cast<unsigned char>((i / 4096) * 31 + i + seed)) return false;
  return true;
}

constexpr std::size_t MiB = std::size_t{1} << 20;

} // namespace

TEST_CASE("C API: malloc and free on simulated streams, counted in memory_stats with PyTorch's keys")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_is_in_use() == 0);
          EXPECT(strata_configure("stack=simulated,sim_capacity=1GiB") == 0);
          EXPECT(strata_is_in_use() == 0);  // configuring builds nothing
          cudaStream_t a = strata_sim_stream_create(0), b = strata_sim_stream_create(0);
          EXPECT(a != nullptr && b != nullptr && a != b);
          void* p = strata_malloc(1000, 0, a);
          void* q = strata_malloc(3 * MiB, 0, b);
          void* r = strata_malloc(4096, 0, a);
          EXPECT(p != nullptr && q != nullptr && r != nullptr);
          EXPECT(p != q && p != r && q != r);
          EXPECT(reinterpret_cast<std::uintptr_t>(p) % 256 == 0 && reinterpret_cast<std::uintptr_t>(q) % 256 == 0);
          EXPECT(strata_is_in_use() == 1);

          const auto m = stats(0);
          for (const char* key : {"allocated_bytes.all.current", "allocated_bytes.all.peak", "active_bytes.all.current",
                                  "reserved_bytes.all.current", "reserved_bytes.all.peak", "allocation.all.current",
                                  "allocation.all.allocated", "allocation.all.freed", "segment.all.current", "num_alloc_retries",
                                  "num_ooms", "strata.fragmentation", "strata.largest_free", "strata.stack"})
            EXPECT(m.count(key) == 1);
          EXPECT(m.at("strata.stack") == "simulated");
          EXPECT(stat(0, "allocated_bytes.all.current") == 1000 + 3 * MiB + 4096);
          EXPECT(stat(0, "allocation.all.current") == 3);
          EXPECT(stat(0, "allocation.all.allocated") == 3);
          EXPECT(stat(0, "reserved_bytes.all.current") >= static_cast<long long>(3 * MiB + 4096));

          strata_free(q, 3 * MiB, 0, b);
          EXPECT(stat(0, "allocated_bytes.all.current") == 1000 + 4096);
          EXPECT(stat(0, "allocated_bytes.all.peak") == 1000 + 3 * MiB + 4096);
          EXPECT(stat(0, "allocation.all.freed") == 1);
          strata_reset_peak_stats(0);
          EXPECT(stat(0, "allocated_bytes.all.peak") == 1000 + 4096);
          strata_free(p, 1000, 0, a);
          strata_free(r, 4096, 0, a);
          EXPECT(stat(0, "allocated_bytes.all.current") == 0);
          EXPECT(stat(0, "allocation.all.current") == 0);
          EXPECT(stat(0, "num_ooms") == 0);
          EXPECT(strata_malloc(0, 0, a) == nullptr);  // zero bytes: null, not a failure
          EXPECT(stat(0, "num_ooms") == 0);
        }) == "");
}

TEST_CASE("C API: memory_stats counts the page calls the stack made, and empty_cache's unmaps")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated,sim_capacity=1GiB") == 0);
          EXPECT(stat(0, "strata.calls.page_maps") == 0);  // nothing built yet
          void* p = strata_malloc(3 * MiB, 0, nullptr);
          EXPECT(p != nullptr);
          const long long maps = stat(0, "strata.calls.page_maps");
          EXPECT(maps >= 1);
          EXPECT(stat(0, "strata.calls.page_creates") == maps);  // each mapping is one physical allocation
          EXPECT(stat(0, "strata.calls.page_access") >= 1);
          strata_free(p, 3 * MiB, 0, nullptr);
          void* q = strata_malloc(3 * MiB, 0, nullptr);  // the same pages again: no new call
          EXPECT(q != nullptr);
          EXPECT(stat(0, "strata.calls.page_maps") == maps);
          EXPECT(stat(0, "strata.calls.page_unmaps") == 0);
          strata_free(q, 3 * MiB, 0, nullptr);
          strata_reset();  // empty_cache: one device wait, then every idle mapping goes
          EXPECT(stat(0, "strata.calls.page_unmaps") == maps);
          EXPECT(stat(0, "strata.calls.page_releases") == maps);
          EXPECT(stat(0, "strata.calls.page_device_waits") >= 1);
          EXPECT(stat(0, "strata.calls.relocations") == 0);
          EXPECT(stat(0, "strata.calls.events") == 0);  // one stream: nothing to order against
          EXPECT(stat(0, "strata.calls.stream_waits") == 0);
          EXPECT(stat(0, "strata.calls.policy") == 2);  // one stream's frees go straight back to the policy
        }) == "");
}

TEST_CASE("C API: memory_stats_json writes only when the buffer fits, and always says the length")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated") == 0);
          EXPECT(strata_malloc(MiB, 0, nullptr) != nullptr);
          const std::size_t need = strata_memory_stats_json(0, nullptr, 0);
          EXPECT(need > 100);
          std::string small(10, 'x');
          EXPECT(strata_memory_stats_json(0, small.data(), small.size()) == need);
          EXPECT(small == std::string(10, 'x'));
          std::string exact(need, 'x');  // no room for the NUL: untouched
          EXPECT(strata_memory_stats_json(0, exact.data(), exact.size()) == need);
          EXPECT(exact == std::string(need, 'x'));
          // A device never used reports zeros without building a stack.
          EXPECT(stat(5, "allocated_bytes.all.current") == 0);
          EXPECT(strata_memory_stats_json(-1, nullptr, 0) == 0);
          EXPECT(mentions("out of range"));
        }) == "");
}

TEST_CASE("C API: empty_cache (strata_reset) hands idle memory back")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated,sim_capacity=1GiB") == 0);
          cudaStream_t a = strata_sim_stream_create(0);
          std::vector<void*> blocks;
          for (int i = 0; i < 16; ++i) blocks.push_back(strata_malloc(8 * MiB, 0, a));
          for (void* p : blocks) EXPECT(p != nullptr);
          EXPECT(stat(0, "reserved_bytes.all.current") >= static_cast<long long>(128 * MiB));
          for (void* p : blocks) strata_free(p, 8 * MiB, 0, a);
          strata_reset();
          EXPECT(stat(0, "reserved_bytes.all.current") == 0);
          EXPECT(stat(0, "reserved_bytes.all.peak") >= static_cast<long long>(128 * MiB));
          EXPECT(strata_malloc(8 * MiB, 0, a) != nullptr);  // still usable
        }) == "");
}

TEST_CASE("C API: each empty_cache and each retry after out of memory counts one wait for every pending free")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated,sim_capacity=64MiB") == 0);
          cudaStream_t a = strata_sim_stream_create(0);
          void* p = strata_malloc(8 * MiB, 0, a);
          EXPECT(stat(0, "num_sync_all_streams") == 0);
          strata_free(p, 8 * MiB, 0, a);
          strata_reset();
          EXPECT(stat(0, "num_sync_all_streams") == 1);
          EXPECT(strata_reset_device(0) == 0);
          EXPECT(stat(0, "num_sync_all_streams") == 2);
          EXPECT(strata_malloc(128 * MiB, 0, a) == nullptr);  // released idle memory and retried: one more
          EXPECT(stat(0, "num_alloc_retries") == 1);
          EXPECT(stat(0, "num_sync_all_streams") == 3);
          strata_device_figures f{};
          EXPECT(strata_device_figures_get(0, &f) == 0);
          EXPECT(f.syncs_all_streams == 3);
        }) == "");
}

TEST_CASE("C API: grant_peer lets a peer reach a page-mapped stack's memory once; bad devices are named")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated,sim_capacity=1GiB") == 0);
          cudaStream_t s = strata_sim_stream_create(0);
          void* p = strata_malloc(3 * MiB, 0, s);
          EXPECT(p != nullptr);
          EXPECT(strata_grant_peer(0, 1) == 1);
          EXPECT(strata_grant_peer(0, 1) == 0);  // granted already
          EXPECT(strata_grant_peer(0, 0) == 0);  // its own device
          EXPECT(strata_grant_peer(0, -1) == -1);
          EXPECT(mentions("peer device -1"));
          EXPECT(strata_grant_peer(4096, 0) == -1);
          EXPECT(mentions("device 4096"));
          void* q = strata_malloc(64 * MiB, 0, s);  // memory mapped after the grant
          EXPECT(q != nullptr);
          strata_free(q, 64 * MiB, 0, s);
          strata_free(p, 3 * MiB, 0, s);
        }) == "");
}

TEST_CASE("C API: out of memory is null, counted, and the process keeps working")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated,sim_capacity=64MiB") == 0);
          cudaStream_t a = strata_sim_stream_create(0);
          void* keep = strata_malloc(16 * MiB, 0, a);
          EXPECT(keep != nullptr);
          EXPECT(strata_malloc(128 * MiB, 0, a) == nullptr);
          EXPECT(mentions("out of memory") || mentions("out_of_memory"));
          EXPECT(stat(0, "num_ooms") == 1);
          EXPECT(stat(0, "num_alloc_retries") == 1);  // released idle memory and tried once more
          EXPECT(stat(0, "allocated_bytes.all.current") == static_cast<long long>(16 * MiB));
          void* more = strata_malloc(32 * MiB, 0, a);
          EXPECT(more != nullptr);
          strata_free(more, 32 * MiB, 0, a);
          strata_free(keep, 16 * MiB, 0, a);
          EXPECT(stat(0, "allocated_bytes.all.current") == 0);
          // The throwing entry point (for change_current_allocator): std::bad_alloc with the message.
          bool threw = false;
          try {
            (void)strata_malloc_or_throw(128 * MiB, 0, a);
          } catch (const std::bad_alloc&) {
            threw = true;
          }
          EXPECT(threw);
          EXPECT(stat(0, "num_ooms") == 2);
          EXPECT(strata_malloc_or_throw(MiB, 0, a) != nullptr);
          // A framework's handler throws its own type instead (libstrata_torch_hooks: c10::OutOfMemoryError).
          struct framework_oom {
            std::string message;
          };
          strata_set_oom_handler([](const char* message) { throw framework_oom{message}; });
          std::string seen;
          try {
            (void)strata_malloc_or_throw(128 * MiB, 0, a);
          } catch (const framework_oom& e) {
            seen = e.message;
          }
          EXPECT(seen.find("out of memory allocating 134217728 bytes") != std::string::npos);
          strata_set_oom_handler(nullptr);
          threw = false;
          try {
            (void)strata_malloc_or_throw(128 * MiB, 0, a);
          } catch (const std::bad_alloc&) {
            threw = true;
          }
          EXPECT(threw);
          strata_report_error("set by a companion library");
          EXPECT(std::strcmp(strata_last_error(), "set by a companion library") == 0);
        }) == "");
}

TEST_CASE("C API: an out of memory served after all is taken back from num_ooms; one the caller saw stays")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated,sim_capacity=64MiB") == 0);
          EXPECT(strata_oom_served(0) == -1);  // no stack yet
          cudaStream_t a = strata_sim_stream_create(0);
          void* keep = strata_malloc(16 * MiB, 0, a);
          EXPECT(strata_oom_served(0) == -1);  // nothing counted
          EXPECT(mentions("no out of memory"));
          EXPECT(strata_malloc(128 * MiB, 0, a) == nullptr);
          EXPECT(strata_malloc(128 * MiB, 0, a) == nullptr);
          EXPECT(stat(0, "num_ooms") == 2);
          EXPECT(strata_oom_served(0) == 0);  // the second one a use_on_oom pool served
          EXPECT(stat(0, "num_ooms") == 1);
          strata_device_figures f{};
          EXPECT(strata_device_figures_get(0, &f) == 0);
          EXPECT(f.ooms == 1);
          strata_free(keep, 16 * MiB, 0, a);
        }) == "");
}

TEST_CASE("C API: release_on_oom=false fails without the retry")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated,sim_capacity=64MiB,release_on_oom=false") == 0);
          EXPECT(strata_malloc(128 * MiB, 0, nullptr) == nullptr);
          EXPECT(stat(0, "num_ooms") == 1);
          EXPECT(stat(0, "num_alloc_retries") == 0);
        }) == "");
}

TEST_CASE("C API: limit= and set_memory_fraction cap the bytes in use")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated,sim_capacity=1GiB,limit=16MiB") == 0);
          cudaStream_t a = strata_sim_stream_create(0);
          void* p = strata_malloc(10 * MiB, 0, a);
          EXPECT(p != nullptr);
          EXPECT(strata_malloc(10 * MiB, 0, a) == nullptr);
          EXPECT(mentions("limit 16777216"));
          EXPECT(stat(0, "num_ooms") == 1);
          EXPECT(stat(0, "strata.limit_bytes") == static_cast<long long>(16 * MiB));
          strata_free(p, 10 * MiB, 0, a);
          EXPECT(strata_malloc(10 * MiB, 0, a) != nullptr);

          // The stack was built with the configured limit as its physical cap: a fraction cannot raise it.
          strata_set_memory_fraction(0.5, 0);
          EXPECT(mentions("above the configured limit"));
          EXPECT(stat(0, "strata.limit_bytes") == static_cast<long long>(16 * MiB));
          strata_set_memory_fraction(1.0 / 128, 0);  // 8 MiB of the 1 GiB device: lower is fine
          EXPECT(stat(0, "strata.limit_bytes") == static_cast<long long>(8 * MiB));
        }) == "");
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated,sim_capacity=1GiB") == 0);
          cudaStream_t a = strata_sim_stream_create(0);
          EXPECT(strata_malloc(MiB, 0, a) != nullptr);
          strata_set_memory_fraction(0.5, 0);  // torch.cuda.set_per_process_memory_fraction
          EXPECT(stat(0, "strata.limit_bytes") == static_cast<long long>(512 * MiB));
          EXPECT(strata_malloc(400 * MiB, 0, a) != nullptr);
          EXPECT(strata_malloc(200 * MiB, 0, a) == nullptr);
          EXPECT(mentions("limit 536870912"));
          strata_set_memory_fraction(1.5, 0);
          EXPECT(mentions("1.5"));
          EXPECT(stat(0, "strata.limit_bytes") == static_cast<long long>(512 * MiB));  // unchanged
          strata_set_memory_fraction(1.0, 0);
          EXPECT(strata_malloc(200 * MiB, 0, a) != nullptr);
        }) == "");
}

namespace {

/// What a capped run saw: which of its operations succeeded, and the most the stack held at any point.
struct capped_run {
  std::string outcomes;
  long long reserved_peak = 0;
  long long most_held = 0;
  int successes = 0;
};

/// Random allocations on two streams, some with a recorded use on the other stream (held after their free
/// until that stream finishes), under a cap of 256 MiB given as limit= (`use_fraction` false) or as
/// set_memory_fraction (true) on a 1 GiB simulated device. Checks after every call that the stack never holds
/// more than the cap.
capped_run run_capped(expectations& ex, bool use_fraction)
{
  const std::size_t cap = 256 * MiB;
  EXPECT(strata_configure(use_fraction ? "stack=simulated,sim_capacity=1GiB" : "stack=simulated,sim_capacity=1GiB,limit=256MiB") == 0);
  cudaStream_t a = strata_sim_stream_create(0), b = strata_sim_stream_create(0);
  if (use_fraction) {
    void* first = strata_malloc(MiB, 0, a);  // builds the stack with no cap, as PyTorch's first tensor does
    strata_free(first, MiB, 0, a);
    strata_set_memory_fraction(0.25, 0);
  }
  capped_run run;
  std::mt19937 rng(7);
  struct live {
    void* p;
    std::size_t n;
  };
  std::vector<live> blocks;
  for (int i = 0; i < 400; ++i) {
    if (blocks.empty() || rng() % 3 != 0) {
      const std::size_t n = (1 + rng() % 96) * MiB;
      void* p = strata_malloc(n, 0, a);
      run.outcomes += p != nullptr ? '+' : '-';
      if (p != nullptr) {
        ++run.successes;
        if (rng() % 2 == 0) {
          strata_record_stream(p, b);  // b's work reads it: its memory stays held after the free
          EXPECT(strata_sim_launch(b) == 0);
        }
        blocks.push_back({p, n});
      }
    } else {
      const std::size_t k = rng() % blocks.size();
      strata_free(blocks[k].p, blocks[k].n, 0, a);
      blocks.erase(blocks.begin() + static_cast<std::ptrdiff_t>(k));
      ++run.successes;
      if (rng() % 4 == 0) EXPECT(strata_sim_finish(b) == 0);
    }
    strata_device_figures f{};
    EXPECT(strata_device_figures_get(0, &f) == 0);
    EXPECT(f.reserved <= cap);
    EXPECT(f.limit == cap);
    run.most_held = std::max(run.most_held, static_cast<long long>(f.reserved));
  }
  run.reserved_peak = stat(0, "reserved_bytes.all.peak");
  EXPECT(run.reserved_peak <= static_cast<long long>(cap));
  EXPECT(run.outcomes.find('-') != std::string::npos);  // the cap was reached...
  EXPECT(run.most_held > static_cast<long long>(cap * 3 / 4));  // ...by what the stack held
  return run;
}

} // namespace

TEST_CASE("C API: limit= and set_memory_fraction cap what the stack holds, alike, never exceeded")
{
  std::string failures;
  for (const bool use_fraction : {false, true}) {
    const std::string child = in_child([&](expectations& ex) {
      const capped_run run = run_capped(ex, use_fraction);
      EXPECT(run.successes > 200);
      // The outcome travels to the parent as a failure line prefixed "run:" and is compared there.
      ex.failures += "run:" + run.outcomes + ":" + std::to_string(run.reserved_peak) + "\n";
    });
    failures += (use_fraction ? "fraction " : "limit ") + child;
  }
  // Each child reports its run as one line "run:OUTCOMES:PEAK" and nothing else; the two runs match operation
  // for operation.
  INFO(failures);
  auto run_line = [&](const std::string& label) {
    const std::size_t at = failures.find(label + "run:");
    REQUIRE(at != std::string::npos);
    return failures.substr(at + label.size(), failures.find('\n', at) - at - label.size());
  };
  CHECK(run_line("limit ") == run_line("fraction "));
  CHECK(std::count(failures.begin(), failures.end(), '\n') == 2);
}

TEST_CASE("C API: a fraction lowered below what the stack holds refuses growth; raised again, the stack grows")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated,sim_capacity=1GiB") == 0);
          cudaStream_t a = strata_sim_stream_create(0);
          void* big = strata_malloc(300 * MiB, 0, a);
          EXPECT(big != nullptr);
          strata_set_memory_fraction(0.25, 0);  // 256 MiB, below the 300 MiB in use
          EXPECT(strata_malloc(MiB, 0, a) == nullptr);
          strata_free(big, 300 * MiB, 0, a);
          void* p = strata_malloc(200 * MiB, 0, a);  // served from what the stack holds: no growth
          EXPECT(p != nullptr);
          strata_device_figures f{};
          EXPECT(strata_device_figures_get(0, &f) == 0);
          EXPECT(f.reserved <= 300 * MiB);
          strata_reset();  // empty_cache: the idle mappings above the cap go back
          EXPECT(strata_device_figures_get(0, &f) == 0);
          EXPECT(f.reserved <= 256 * MiB);
          EXPECT(strata_malloc(100 * MiB, 0, a) == nullptr);
          strata_set_memory_fraction(1.0, 0);
          void* q = strata_malloc(600 * MiB, 0, a);
          EXPECT(q != nullptr);
          EXPECT(strata_device_figures_get(0, &f) == 0);
          EXPECT(f.reserved >= 800 * MiB);
        }) == "");
}

TEST_CASE("C API: bytes held elsewhere shrink the stack's share of the cap, never passed")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated,sim_capacity=1GiB") == 0);
          cudaStream_t a = strata_sim_stream_create(0);
          strata_set_memory_fraction(0.5, 0);  // a cap of 512 MiB
          void* p = strata_malloc(300 * MiB, 0, a);
          EXPECT(p != nullptr);
          strata_free(p, 300 * MiB, 0, a);  // idle now: held until something needs the room
          // A MemPool's own allocator's segments, taken where they fit beside what strata holds: 312 MiB left.
          EXPECT(strata_set_held_elsewhere(0, 200 * MiB) == 0);
          strata_device_figures f{};
          EXPECT(strata_device_figures_get(0, &f) == 0);
          EXPECT(f.limit == 512 * MiB);  // the cap reported is the whole cap
          void* q = strata_malloc(250 * MiB, 0, a);  // from the idle memory
          EXPECT(q != nullptr);
          // 290 MiB in use: served within the share, from the idle rest or after it went back.
          void* r = strata_malloc(40 * MiB, 0, a);
          EXPECT(r != nullptr);
          EXPECT(strata_device_figures_get(0, &f) == 0);
          EXPECT(f.reserved <= 312 * MiB);
          EXPECT(stat(0, "num_ooms") == 0);
          EXPECT(strata_malloc(30 * MiB, 0, a) == nullptr);  // 320 MiB in use would pass the share
          EXPECT(mentions("held elsewhere"));
          EXPECT(stat(0, "num_ooms") == 1);
          EXPECT(strata_device_figures_get(0, &f) == 0);
          EXPECT(f.reserved <= 312 * MiB);
          EXPECT(strata_set_held_elsewhere(0, 0) == 0);  // handed back to their allocator
          void* t = strata_malloc(30 * MiB, 0, a);
          EXPECT(t != nullptr);
          strata_free(t, 30 * MiB, 0, a);
          strata_free(r, 40 * MiB, 0, a);
          strata_free(q, 250 * MiB, 0, a);
          EXPECT(strata_set_held_elsewhere(-1, 0) == -1);
          EXPECT(mentions("out of range"));
        }) == "");
  CHECK(in_child([](expectations& ex) {  // the share counts against growth: held memory goes back first
          EXPECT(strata_configure("stack=simulated,sim_capacity=1GiB") == 0);
          cudaStream_t a = strata_sim_stream_create(0), b = strata_sim_stream_create(0);
          strata_set_memory_fraction(0.5, 0);  // 512 MiB
          void* p = strata_malloc(200 * MiB, 0, a);
          EXPECT(p != nullptr);
          strata_record_stream(p, b);
          EXPECT(strata_sim_launch(b) == 0);  // b still reads it: held at the free, not reusable
          strata_free(p, 200 * MiB, 0, a);
          EXPECT(strata_set_held_elsewhere(0, 250 * MiB) == 0);  // 262 MiB left to the stack
          void* q = strata_malloc(100 * MiB, 0, a);  // growing to 300 MiB would pass it: the held block goes back first
          EXPECT(q != nullptr);
          EXPECT(stat(0, "num_alloc_retries") == 1);
          EXPECT(stat(0, "num_ooms") == 0);
          strata_device_figures f{};
          EXPECT(strata_device_figures_get(0, &f) == 0);
          EXPECT(f.reserved <= 262 * MiB);
          strata_free(q, 100 * MiB, 0, a);
        }) == "");
  CHECK(in_child([](expectations& ex) {  // while a pool is being allocated to, nothing is released to make room
          EXPECT(strata_configure("stack=simulated,sim_capacity=1GiB") == 0);
          cudaStream_t a = strata_sim_stream_create(0), b = strata_sim_stream_create(0);
          strata_set_memory_fraction(0.5, 0);
          void* p = strata_malloc(200 * MiB, 0, a);
          strata_record_stream(p, b);
          EXPECT(strata_sim_launch(b) == 0);
          strata_free(p, 200 * MiB, 0, a);
          EXPECT(strata_set_held_elsewhere(0, 250 * MiB) == 0);
          strata_begin_allocate_to_pool(0, {1, 0}, [](cudaStream_t) { return false; });
          EXPECT(strata_malloc(100 * MiB, 0, a) == nullptr);
          EXPECT(stat(0, "num_alloc_retries") == 0);
          EXPECT(stat(0, "num_ooms") == 1);
          strata_end_allocate_to_pool(0, {1, 0});
          EXPECT(strata_sim_finish(b) == 0);
          void* q = strata_malloc(100 * MiB, 0, a);  // no pool allocated to: the held block may go back now
          EXPECT(q != nullptr);
          strata_free(q, 100 * MiB, 0, a);
        }) == "");
  CHECK(in_child([](expectations& ex) {  // inside the device's section (as strata's PyTorch backend calls it)
          EXPECT(strata_configure("stack=simulated,sim_capacity=1GiB,limit=64MiB") == 0);
          EXPECT(strata_device_lock(0) == 0);
          EXPECT(strata_set_held_elsewhere(0, 60 * MiB) == 0);  // builds the stack here, inside the section
          cudaStream_t a = strata_sim_stream_create(0);
          EXPECT(strata_malloc(8 * MiB, 0, a) == nullptr);
          void* p = strata_malloc(2 * MiB, 0, a);
          EXPECT(p != nullptr);
          EXPECT(strata_set_held_elsewhere(0, 0) == 0);
          EXPECT(strata_malloc(8 * MiB, 0, a) != nullptr);
          strata_device_unlock(0);
          strata_free(p, 2 * MiB, 0, a);
        }) == "");
  CHECK(in_child([](expectations& ex) {  // a fraction set afterwards keeps the share; more held elsewhere than the cap
          EXPECT(strata_configure("stack=simulated,sim_capacity=1GiB") == 0);
          cudaStream_t a = strata_sim_stream_create(0);
          EXPECT(strata_set_held_elsewhere(0, 100 * MiB) == 0);
          strata_set_memory_fraction(0.125, 0);  // 128 MiB: 28 MiB left to the stack
          EXPECT(strata_malloc(32 * MiB, 0, a) == nullptr);
          void* p = strata_malloc(16 * MiB, 0, a);
          EXPECT(p != nullptr);
          strata_free(p, 16 * MiB, 0, a);
          EXPECT(strata_set_held_elsewhere(0, 200 * MiB) == 0);  // past the whole cap: nothing is left
          EXPECT(strata_malloc(4096, 0, a) == nullptr);
          EXPECT(mentions("held elsewhere"));
        }) == "");
}

TEST_CASE("C API: a fraction of 0 refuses every allocation; a fraction of bytes over the total caps at exactly those bytes")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated,sim_capacity=1GiB") == 0);
          cudaStream_t a = strata_sim_stream_create(0);
          strata_set_memory_fraction(0.0, 0);
          EXPECT(std::string(strata_last_error()).find("[0, 1]") == std::string::npos);
          EXPECT(strata_malloc(MiB, 0, a) == nullptr);
          strata_device_figures f{};
          EXPECT(strata_device_figures_get(0, &f) == 0);
          EXPECT(f.limit == 0);
          strata_set_memory_fraction(-0.5, 0);
          EXPECT(mentions("[0, 1]"));
          // A fraction computed as bytes / total (PyTorch's tests do so) gives back exactly those bytes, where
          // truncating the product would fall a byte short of them.
          const std::size_t total = f.device_memory;
          for (std::size_t bytes : {238 * MiB, 120 * MiB + 118 * MiB + 1, 3 * MiB + 7}) {
            strata_set_memory_fraction(static_cast<double>(bytes) / static_cast<double>(total), 0);
            EXPECT(strata_device_figures_get(0, &f) == 0);
            EXPECT(f.limit == bytes);
          }
          strata_set_memory_fraction(1.0, 0);
          void* p = strata_malloc(MiB, 0, a);
          EXPECT(p != nullptr);
          strata_free(p, MiB, 0, a);
        }) == "");
}

TEST_CASE("C API: device_prepare builds a device's stack before its first allocation, with PyTorch's fraction applied")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated,sim_capacity=1GiB") == 0);
          EXPECT(strata_apply_torch_conf("per_process_memory_fraction:0") == 0);
          strata_device_figures f{};
          EXPECT(strata_device_figures_get(0, &f) == 1);  // nothing built yet
          EXPECT(strata_device_prepare(0) == 0);
          EXPECT(strata_device_figures_get(0, &f) == 0);
          EXPECT(f.limit == 0 && f.device_memory == 1024 * MiB);
          EXPECT(strata_device_prepare(0) == 0);  // built before: nothing more
          EXPECT(strata_device_prepare(-1) == -1);
          EXPECT(mentions("device -1"));
        }) == "");
}

TEST_CASE("C API: PyTorch's per_process_memory_fraction caps what the stack holds; settings without effect are said")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated,sim_capacity=1GiB") == 0);
          EXPECT(strata_apply_torch_conf("per_process_memory_fraction:0.25") == 0);
          cudaStream_t a = strata_sim_stream_create(0);
          void* p = strata_malloc(200 * MiB, 0, a);
          EXPECT(p != nullptr);
          EXPECT(strata_malloc(100 * MiB, 0, a) == nullptr);
          strata_device_figures f{};
          EXPECT(strata_device_figures_get(0, &f) == 0);
          EXPECT(f.limit == 256 * MiB);
          EXPECT(f.reserved <= 256 * MiB);
          // Applied again once the stack is built: the built stack follows.
          EXPECT(strata_apply_torch_conf("per_process_memory_fraction:0.5,max_split_size_mb:64") == 1);
          EXPECT(mentions("max_split_size_mb:64 has no effect under strata"));
          EXPECT(strata_device_figures_get(0, &f) == 0);
          EXPECT(f.limit == 512 * MiB);
          void* q = strata_malloc(300 * MiB, 0, a);
          EXPECT(q != nullptr);
          // A refusal applies nothing.
          EXPECT(strata_apply_torch_conf("per_process_memory_fraction:0.125,garbage_collection_threshold:0.5") == -1);
          EXPECT(mentions("garbage_collection_threshold:0.5"));
          EXPECT(strata_device_figures_get(0, &f) == 0);
          EXPECT(f.limit == 512 * MiB);
        }) == "");
  CHECK(in_child([](expectations& ex) {  // with limit= as well, the smaller cap holds
          EXPECT(strata_configure("stack=simulated,sim_capacity=1GiB,limit=128MiB") == 0);
          EXPECT(strata_apply_torch_conf("per_process_memory_fraction:0.5") == 0);
          cudaStream_t a = strata_sim_stream_create(0);
          EXPECT(strata_malloc(100 * MiB, 0, a) != nullptr);
          EXPECT(strata_malloc(100 * MiB, 0, a) == nullptr);
          strata_device_figures f{};
          EXPECT(strata_device_figures_get(0, &f) == 0);
          EXPECT(f.limit == 128 * MiB);
        }) == "");
}

TEST_CASE("C API: the figures say how much idle memory empty_cache would hand back")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated,sim_capacity=1GiB") == 0);
          cudaStream_t a = strata_sim_stream_create(0);
          void* keep = strata_malloc(3 * MiB, 0, a);
          void* p = strata_malloc(64 * MiB, 0, a);
          EXPECT(keep != nullptr && p != nullptr);
          strata_device_figures f{};
          EXPECT(strata_device_figures_get(0, &f) == 0);
          const std::size_t releasable_live = f.releasable;
          EXPECT(f.releasable <= f.reserved - f.in_use);
          strata_free(p, 64 * MiB, 0, a);
          EXPECT(strata_device_figures_get(0, &f) == 0);
          EXPECT(f.releasable >= releasable_live + 64 * MiB);
          EXPECT(f.releasable <= f.reserved - f.in_use);
          const std::size_t before = f.reserved, releasable = f.releasable;
          strata_reset();
          EXPECT(strata_device_figures_get(0, &f) == 0);
          EXPECT(f.reserved == before - releasable);
          EXPECT(f.releasable == 0);
          strata_free(keep, 3 * MiB, 0, a);
        }) == "");
}

TEST_CASE("C API: record_stream holds a block until the recorded stream's work is done")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated") == 0);
          cudaStream_t a = strata_sim_stream_create(0), b = strata_sim_stream_create(0);
          void* p = strata_malloc(MiB, 0, a);
          strata_record_stream(p, b);
          EXPECT(strata_sim_launch(b) == 0);  // b's work reads the block
          strata_free(p, MiB, 0, a);
          EXPECT(stat(0, "allocated_bytes.all.current") == 0);
          EXPECT(stat(0, "strata.held_for_other_streams_bytes") == static_cast<long long>(MiB));
          EXPECT(stat(0, "active_bytes.all.current") == static_cast<long long>(MiB));
          void* q = strata_malloc(MiB, 0, a);
          EXPECT(q != p);  // not reused while b may still read it
          EXPECT(strata_sim_finish(b) == 0);
          void* r = strata_malloc(4096, 0, a);  // any allocation gives back what is done
          EXPECT(r != nullptr);
          EXPECT(stat(0, "strata.held_for_other_streams_bytes") == 0);
          // An unknown pointer is reported, not recorded.
          int local = 0;
          strata_record_stream(&local, b);
          EXPECT(mentions("not a strata block"));
        }) == "");
}

TEST_CASE("C API: empty_cache waits for held blocks too")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated") == 0);
          cudaStream_t a = strata_sim_stream_create(0), b = strata_sim_stream_create(0);
          void* p = strata_malloc(8 * MiB, 0, a);
          strata_record_stream(p, b);
          EXPECT(strata_sim_launch(b) == 0);
          strata_free(p, 8 * MiB, 0, a);
          EXPECT(stat(0, "strata.held_for_other_streams_bytes") == static_cast<long long>(8 * MiB));
          strata_reset();
          EXPECT(stat(0, "strata.held_for_other_streams_bytes") == 0);
          EXPECT(stat(0, "reserved_bytes.all.current") == 0);
        }) == "");
}

TEST_CASE("C API: a bad configuration names the key; no silent default")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=bogus") != 0);
          EXPECT(mentions("stack=bogus"));
          EXPECT(strata_configure("stack=simulated,limt=0.5") != 0);
          EXPECT(mentions("unknown key 'limt'"));
          EXPECT(strata_is_in_use() == 0);
          EXPECT(strata_configure("stack=simulated") == 0);  // a good one after bad ones
          EXPECT(strata_malloc(MiB, 0, nullptr) != nullptr);
        }) == "");
  CHECK(in_child([](expectations& ex) {
          setenv("STRATA_ALLOC_CONF", "stack=simulated,limit=7", 1);
          EXPECT(strata_check_env() != 0);
          EXPECT(mentions("limit=7"));
          for (int i = 0; i < 2; ++i) {  // every use fails the same way
            EXPECT(strata_malloc(MiB, 0, nullptr) == nullptr);
            EXPECT(mentions("limit=7"));
          }
          EXPECT(strata_is_in_use() == 0);
          setenv("STRATA_ALLOC_CONF", "stack=simulated,limit=0.5", 1);
          EXPECT(strata_check_env() == 0);
        }) == "");
  CHECK(in_child([](expectations& ex) {
          setenv("STRATA_ALLOC_CONF", "stack=simulated,sim_capacity=256MiB", 1);
          EXPECT(strata_malloc(128 * MiB, 0, nullptr) != nullptr);  // the environment's configuration, read on first use
          EXPECT(strata_malloc(192 * MiB, 0, nullptr) == nullptr);
        }) == "");
}

TEST_CASE("C API: configure after first use is refused")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated") == 0);
          EXPECT(strata_configure("stack=simulated,limit=0.5") == 0);  // still before first use: replaces it
          void* p = strata_malloc(MiB, 0, nullptr);
          EXPECT(p != nullptr);
          EXPECT(strata_configure("stack=simulated") != 0);
          EXPECT(mentions("in use"));
          EXPECT(stat(0, "strata.limit_bytes") == static_cast<long long>(40 * (std::size_t{1} << 30)));  // 0.5 of 80 GiB
          strata_free(p, MiB, 0, nullptr);
        }) == "");
}

TEST_CASE("C API: devices are separate; a device that does not exist is an error")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated,sim_devices=2") == 0);
          cudaStream_t s1 = strata_sim_stream_create(1);
          void* p = strata_malloc(2 * MiB, 1, s1);
          EXPECT(p != nullptr);
          EXPECT(stat(1, "allocated_bytes.all.current") == static_cast<long long>(2 * MiB));
          EXPECT(stat(0, "allocated_bytes.all.current") == 0);
          EXPECT(strata_malloc(MiB, 2, nullptr) == nullptr);
          EXPECT(mentions("device 2 does not exist"));
          EXPECT(strata_malloc(MiB, 64, nullptr) == nullptr);
          EXPECT(mentions("out of range"));
          strata_free(p, 2 * MiB, 1, s1);
          EXPECT(stat(1, "allocated_bytes.all.current") == 0);
        }) == "");
}

TEST_CASE("C API: the CUDA stacks fail cleanly without a GPU")
{
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) {
    (void)cudaGetLastError();
    MESSAGE("a GPU is present: the no-GPU path is not exercised here");
    return;
  }
  for (const char* conf : {"stack=default", "stack=coalescing", "stack=default,limit=0.5,peers=all"}) {
    CAPTURE(conf);
    CHECK(in_child([conf](expectations& ex) {
            EXPECT(strata_configure(conf) == 0);
            EXPECT(strata_malloc(MiB, 0, nullptr) == nullptr);
            EXPECT(mentions("no CUDA device"));
            EXPECT(strata_malloc(MiB, 0, nullptr) == nullptr);  // again: same answer, no crash
            EXPECT(mentions("no CUDA device"));
            strata_reset();                                 // nothing built: nothing to do
            EXPECT(stat(0, "allocated_bytes.all.current") == 0);
            EXPECT(strata_sim_stream_create(0) == nullptr);
            EXPECT(mentions("only with stack=simulated"));
          }) == "");
  }
}

TEST_CASE("C API: CuPy's entry points remember size and stream")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated") == 0);
          cudaStream_t a = strata_sim_stream_create(0);
          strata_cupy_set_stream(a);
          void* p = strata_cupy_malloc(nullptr, 5000, 0);
          EXPECT(p != nullptr);
          EXPECT(stat(0, "allocated_bytes.all.current") == 5000);
          EXPECT(strata_cupy_malloc(nullptr, 0, 0) == nullptr);
          strata_cupy_free(nullptr, p, 0);
          EXPECT(stat(0, "allocated_bytes.all.current") == 0);
          strata_cupy_free(nullptr, p, 0);  // a second free is reported, not passed on
          EXPECT(mentions("not allocated through strata_cupy_malloc"));
          EXPECT(stat(0, "allocation.all.freed") == 1);
          EXPECT(strata_cupy_malloc(nullptr, std::size_t{1} << 40, 0) == nullptr);  // out of memory: null
          EXPECT(stat(0, "num_ooms") == 1);
          // Another thread has its own stream (the legacy default until it sets one).
          std::thread([&ex] {
            void* q = strata_cupy_malloc(nullptr, 1000, 0);
            EXPECT(q != nullptr);
            strata_cupy_free(nullptr, q, 0);
          }).join();
          EXPECT(stat(0, "allocated_bytes.all.current") == 0);
        }) == "");
}

TEST_CASE("C API: snapshot JSON lists the pool's segments")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated") == 0);
          std::string empty(64, '\0');
          EXPECT(strata_snapshot_json(0, empty.data(), empty.size()) > 0);  // nothing built yet
          void* p = strata_malloc(3 * MiB, 0, nullptr);
          EXPECT(p != nullptr);
          const std::size_t need = strata_snapshot_json(0, nullptr, 0);
          std::string buf(need + 1, '\0');
          EXPECT(strata_snapshot_json(0, buf.data(), buf.size()) == need);
          buf.resize(need);
          EXPECT(buf.find("\"box\":\"mapped_pool\"") != std::string::npos);
          EXPECT(buf.find("\"segments\":[{") != std::string::npos);
          EXPECT(buf.find("\"size\":3145728") != std::string::npos);
        }) == "");
}

TEST_CASE("C API: device figures agree with memory_stats and count held blocks")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated,sim_capacity=1GiB,limit=512MiB") == 0);
          strata_device_figures f{};
          EXPECT(strata_device_figures_get(0, &f) == 1);  // nothing built yet: zeros
          EXPECT(f.reserved == 0 && f.limit == 0);
          EXPECT(strata_device_figures_get(0, nullptr) == -1);
          EXPECT(strata_device_figures_get(64, &f) == -1);
          EXPECT(mentions("out of range"));
          cudaStream_t a = strata_sim_stream_create(0), b = strata_sim_stream_create(0);
          void* p = strata_malloc(3 * MiB, 0, a);
          void* q = strata_malloc(1000, 0, a);
          EXPECT(p != nullptr && q != nullptr);
          EXPECT(strata_device_figures_get(0, &f) == 0);
          EXPECT(static_cast<long long>(f.reserved) == stat(0, "reserved_bytes.all.current"));
          EXPECT(static_cast<long long>(f.allocated) == stat(0, "allocated_bytes.all.current"));
          EXPECT(static_cast<long long>(f.chunks) == stat(0, "segment.all.current"));
          EXPECT(static_cast<long long>(f.largest_free) == stat(0, "strata.largest_free"));
          EXPECT(static_cast<long long>(f.device_allocs) == stat(0, "strata.calls.page_creates"));
          EXPECT(f.device_allocs >= 1 && f.device_frees == 0);
          EXPECT(static_cast<long long>(f.page_maps) == stat(0, "strata.calls.page_maps"));
          EXPECT(f.page_maps >= 1 && f.page_unmaps == 0);
          EXPECT(f.in_use >= 3 * MiB + 1000 && f.in_use <= f.reserved);
          EXPECT(f.limit == 512 * MiB);
          EXPECT(f.device_memory == 1024 * MiB);
          strata_record_stream(p, b);
          EXPECT(strata_sim_launch(b) == 0);
          strata_free(p, 3 * MiB, 0, a);
          EXPECT(strata_device_figures_get(0, &f) == 0);
          EXPECT(f.held_bytes == 3 * MiB && f.held_blocks == 1);
          EXPECT(f.allocated == 1000);
          EXPECT(strata_sim_finish(b) == 0);
          strata_free(q, 1000, 0, a);
          strata_reset();
          EXPECT(strata_device_figures_get(0, &f) == 0);
          EXPECT(f.held_bytes == 0 && f.held_blocks == 0 && f.in_use == 0);
          EXPECT(f.device_frees == f.device_allocs);
          EXPECT(static_cast<long long>(f.page_unmaps) == stat(0, "strata.calls.page_unmaps"));
          EXPECT(f.page_unmaps == f.page_maps);
          EXPECT(strata_malloc(600 * MiB, 0, a) == nullptr);  // above limit=
          EXPECT(strata_device_figures_get(0, &f) == 0);
          EXPECT(static_cast<long long>(f.ooms) == stat(0, "num_ooms"));
          EXPECT(f.ooms == 1);
          EXPECT(static_cast<long long>(f.alloc_retries) == stat(0, "num_alloc_retries"));
        }) == "");
}

TEST_CASE("C API: the observed allocation and free fill the figures the same call left, equal to a separate read")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated,sim_capacity=1GiB,limit=512MiB") == 0);
          cudaStream_t a = strata_sim_stream_create(0), b = strata_sim_stream_create(0);
          auto same = [](const strata_device_figures& x, const strata_device_figures& y) {
            return x.reserved == y.reserved && x.in_use == y.in_use && x.largest_free == y.largest_free && x.chunks == y.chunks &&
                   x.free_blocks == y.free_blocks && x.held_bytes == y.held_bytes && x.held_blocks == y.held_blocks &&
                   x.allocated == y.allocated && x.limit == y.limit && x.device_memory == y.device_memory &&
                   x.device_allocs == y.device_allocs && x.device_frees == y.device_frees && x.alloc_retries == y.alloc_retries &&
                   x.ooms == y.ooms && x.page_maps == y.page_maps && x.page_unmaps == y.page_unmaps;
          };
          strata_device_figures seen{}, read{};
          void* p = strata_malloc_or_throw_observed(3 * MiB, 0, a, &seen);
          EXPECT(p != nullptr);
          EXPECT(strata_device_figures_get(0, &read) == 0);
          EXPECT(same(seen, read));
          EXPECT(seen.allocated == 3 * MiB && seen.reserved >= 3 * MiB && seen.device_allocs >= 1);
          void* q = strata_malloc_or_throw_observed(1000, 0, a, nullptr);  // null: no figures asked for
          EXPECT(q != nullptr);
          strata_record_stream(p, b);
          EXPECT(strata_sim_launch(b) == 0);
          strata_free_observed(p, 3 * MiB, 0, a, &seen);
          EXPECT(strata_device_figures_get(0, &read) == 0);
          EXPECT(same(seen, read));
          EXPECT(seen.allocated == 1000 && seen.held_bytes == 3 * MiB && seen.held_blocks == 1);
          EXPECT(strata_sim_finish(b) == 0);
          bool refused = false;
          try {
            (void)strata_malloc_or_throw_observed(600 * MiB, 0, a, &seen);  // above limit=
          } catch (const std::bad_alloc&) {
            refused = true;
          }
          EXPECT(refused);
          EXPECT(seen.ooms == 1 && seen.allocated == 1000);  // filled before the exception left
          EXPECT(strata_device_figures_get(0, &read) == 0);
          EXPECT(same(seen, read));
          strata_free_observed(q, 1000, 0, a, &seen);
          EXPECT(seen.allocated == 0);
          EXPECT(strata_malloc_or_throw_observed(0, 0, a, &seen) == nullptr);  // size 0: null, figures as they stand
          EXPECT(strata_device_figures_get(0, &read) == 0);
          EXPECT(same(seen, read));
          strata_free_observed(q, 1000, 5, a, &seen);  // a device without a stack: nothing freed, zeros, a message
          EXPECT(seen.reserved == 0 && seen.allocated == 0);
          EXPECT(mentions("no stack"));
        }) == "");
}

TEST_CASE("C API: a thread holding a device's lock calls the entry points inside; other threads' calls wait")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated,sim_capacity=1GiB") == 0);
          EXPECT(strata_device_lock(0) == 0);  // before the stack exists: it is built inside
          void* p = strata_malloc(MiB, 0, nullptr);
          EXPECT(p != nullptr);
          strata_device_figures f{};
          EXPECT(strata_device_figures_get(0, &f) == 0);
          EXPECT(strata_device_lock(0) == 0);  // nested: no second lock taken
          strata_free_observed(p, MiB, 0, nullptr, &f);
          strata_device_unlock(0);
          EXPECT(f.allocated == 0);
          strata_device_unlock(0);

          EXPECT(strata_device_lock(0) == 0);  // the stack is built now: its own lock is held too
          std::atomic<bool> served{false};
          std::thread other([&served] {
            void* q = strata_malloc(MiB, 0, nullptr);
            strata_free(q, MiB, 0, nullptr);
            served = q != nullptr;
          });
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          EXPECT(!served.load());  // waiting for the section
          void* r = strata_malloc_or_throw_observed(MiB, 0, nullptr, &f);  // this thread goes on inside it
          EXPECT(r != nullptr && f.allocated == MiB);
          strata_free(r, MiB, 0, nullptr);
          strata_device_unlock(0);
          other.join();
          EXPECT(served.load());

          EXPECT(strata_device_lock(64) == -1);
          EXPECT(mentions("out of range"));
          strata_device_unlock(1);  // not held: reported, nothing unlocked
          EXPECT(mentions("does not hold"));
        }) == "");
}

TEST_CASE("C API: record=PATH writes the recorder's trace, flushed on demand and at exit")
{
  const std::string path = "/tmp/strata_plugin_test_trace_" + std::to_string(getpid()) + ".csv";
  CHECK(in_child([&path](expectations& ex) {
          EXPECT(strata_configure(("stack=simulated,sim_devices=2,record=" + path).c_str()) == 0);
          cudaStream_t a = strata_sim_stream_create(0);
          void* p = strata_malloc(1000, 0, a);
          strata_free(p, 1000, 0, a);
          EXPECT(strata_record_flush() == 0);
          std::ifstream in(path);
          std::stringstream text;
          text << in.rdbuf();
          EXPECT(text.str().rfind("op,id,bytes,stream\na,0,1000,1\nf,0,1000,1\n", 0) == 0);
          (void)strata_malloc(2000, 1, nullptr);  // device 1: its own file, flushed at exit
        },
                 /*run_atexit=*/true) == "");
  std::ifstream dev1(path + ".1");
  std::stringstream text;
  text << dev1.rdbuf();
  CHECK(text.str() == "op,id,bytes,stream\na,0,2000,0\n");
  std::remove(path.c_str());
  std::remove((path + ".1").c_str());
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated,record=/nonexistent-dir/trace.csv") == 0);
          EXPECT(strata_malloc(MiB, 0, nullptr) == nullptr);
          EXPECT(mentions("cannot open the trace file"));
        }) == "");
}

TEST_CASE("C API: threads allocate and free concurrently, each on its own stream")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated,sim_capacity=4GiB") == 0);
          constexpr int threads = 4, steps = 2000;
          std::vector<cudaStream_t> streams;
          for (int t = 0; t < threads; ++t) streams.push_back(strata_sim_stream_create(0));
          std::vector<long> done(threads, 0);
          std::vector<std::thread> pool;
          for (int t = 0; t < threads; ++t)
            pool.emplace_back([&, t] {
              std::mt19937 rng(static_cast<unsigned>(t));
              std::vector<std::pair<void*, std::size_t>> live;
              for (int i = 0; i < steps; ++i) {
                if (live.empty() || rng() % 3 != 0) {
                  const std::size_t n = 256 + rng() % (256 << 10);
                  if (void* p = strata_malloc(n, 0, streams[t])) {
                    live.emplace_back(p, n);
                    ++done[t];
                  }
                } else {
                  const std::size_t k = rng() % live.size();
                  strata_free(live[k].first, live[k].second, 0, streams[t]);
                  live.erase(live.begin() + static_cast<long>(k));
                  ++done[t];
                }
              }
              for (auto [p, n] : live) strata_free(p, n, 0, streams[t]);
            });
          for (auto& th : pool) th.join();
          long total = 0;
          for (long d : done) total += d;
          EXPECT(total == threads * steps);  // every allocation succeeded (4 GiB is plenty)
          EXPECT(stat(0, "allocated_bytes.all.current") == 0);
          EXPECT(stat(0, "allocation.all.current") == 0);
          EXPECT(stat(0, "num_ooms") == 0);
        }) == "");
}

TEST_CASE("C API: out of memory under a capture is out of memory (std::bad_alloc), counted once, the capture intact")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated,sim_capacity=64MiB") == 0);
          cudaStream_t a = strata_sim_stream_create(0), c = strata_sim_stream_create(0);
          // Idle memory held for another stream's work, which a release would have to wait for.
          void* held = strata_malloc(16 * MiB, 0, a);
          strata_record_stream(held, c);
          EXPECT(strata_sim_launch(c) == 0);
          strata_free(held, 16 * MiB, 0, a);
          static cudaStream_t captured = nullptr;
          captured = c;
          const std::pair<unsigned long long, unsigned long long> pool{1, 0};
          strata_begin_allocate_to_pool(0, pool, [](cudaStream_t s) { return s == captured; });
          EXPECT(strata_sim_capture(c, 1) == 0);
          std::string kind;
          try {
            (void)strata_malloc_or_throw(56 * MiB, 0, c);
            kind = "served";
          } catch (const std::bad_alloc&) {
            kind = "out of memory";
          } catch (const std::exception& e) {
            kind = std::string("other: ") + e.what();
          }
          EXPECT(kind == "out of memory");
          EXPECT(stat(0, "num_ooms") == 1);
          EXPECT(stat(0, "num_alloc_retries") == 0);  // no release: it would wait for the device
          void* small = strata_malloc(MiB, 0, c);  // the capture goes on
          EXPECT(small != nullptr);
          EXPECT(strata_sim_capture(c, 0) == 0);
          strata_end_allocate_to_pool(0, pool);
          strata_free(small, MiB, 0, c);
          strata_release_pool(0, pool);
          EXPECT(strata_sim_finish(c) == 0);
        }) == "");
}

TEST_CASE("C API: graph-pool hooks route a stream's allocations to a private pool until it is released")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated") == 0);
          cudaStream_t a = strata_sim_stream_create(0), c = strata_sim_stream_create(0);
          static cudaStream_t captured = nullptr;  // what PyTorch's filter accepts: the capturing stream
          captured = c;
          const std::pair<unsigned long long, unsigned long long> pool{1, 0};
          strata_begin_allocate_to_pool(0, pool, [](cudaStream_t s) { return s == captured; });
          void* p = strata_malloc(MiB, 0, c);  // into the pool
          EXPECT(p != nullptr);
          strata_free(p, MiB, 0, c);           // freed inside the graph: reusable by the pool only
          void* q = strata_malloc(MiB, 0, a);  // another stream, outside the pool
          EXPECT(q != nullptr && q != p);
          void* r = strata_malloc(MiB, 0, c);  // the pool's own later allocation may take it back
          EXPECT(r != nullptr);
          strata_end_allocate_to_pool(0, pool);
          void* after_end = strata_malloc(MiB, 0, c);  // routing stopped: from the common pool
          EXPECT(after_end != nullptr && after_end != r);
          strata_free(q, MiB, 0, a);
          strata_free(after_end, MiB, 0, c);
          strata_free(r, MiB, 0, c);  // a live pool block freed: it stays the pool's
          strata_release_pool(0, pool);  // the graph is gone
          strata_reset();
          EXPECT(stat(0, "reserved_bytes.all.current") == 0);  // every pool block came back and was released
          EXPECT(stat(0, "allocated_bytes.all.current") == 0);
          // A user MemPool's id {0, n} is another pool than the graph pool {n, 0}.
          strata_begin_allocate_to_pool(0, {0, 1}, [](cudaStream_t) { return true; });
          EXPECT(strata_malloc(MiB, 0, a) != nullptr);
          strata_end_allocate_to_pool(0, {0, 1});
          strata_release_pool(0, {1, 0});  // releasing the other one (gone already) changes nothing
          EXPECT(stat(0, "allocated_bytes.all.current") == static_cast<long long>(MiB));
        }) == "");
}

TEST_CASE("C API: empty_cache releases nothing and reports nothing on a device with an allocation to a pool under way")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated,sim_devices=2") == 0);
          cudaStream_t a = strata_sim_stream_create(0), c = strata_sim_stream_create(0), d = strata_sim_stream_create(1);
          void* idle0 = strata_malloc(8 * MiB, 0, a);
          void* idle1 = strata_malloc(8 * MiB, 1, d);
          strata_free(idle0, 8 * MiB, 0, a);
          strata_free(idle1, 8 * MiB, 1, d);
          const long long held0 = stat(0, "reserved_bytes.all.current");
          EXPECT(held0 >= static_cast<long long>(8 * MiB));
          static cudaStream_t captured = nullptr;
          captured = c;
          strata_begin_allocate_to_pool(0, {1, 0}, [](cudaStream_t s) { return s == captured; });
          strata_report_error("");
          EXPECT(strata_reset_device(0) == 0);  // a capture may be running: no host wait, no error
          EXPECT(std::string(strata_last_error()).empty());
          EXPECT(stat(0, "reserved_bytes.all.current") == held0);
          strata_reset();                                      // every device: device 1 releases, device 0 waits
          EXPECT(std::string(strata_last_error()).empty());
          EXPECT(stat(0, "reserved_bytes.all.current") == held0);
          EXPECT(stat(1, "reserved_bytes.all.current") == 0);
          strata_end_allocate_to_pool(0, {1, 0});
          EXPECT(strata_reset_device(0) == 0);
          EXPECT(stat(0, "reserved_bytes.all.current") == 0);
          EXPECT(strata_reset_device(5) == 0);  // nothing built there: nothing held
          strata_release_pool(0, {1, 0});
        }) == "");
}

TEST_CASE("C API: record_stream of one device's block, callable inside the device's lock")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated,sim_devices=2") == 0);
          cudaStream_t a = strata_sim_stream_create(0), b = strata_sim_stream_create(0);
          void* p = strata_malloc(MiB, 0, a);
          EXPECT(strata_sim_launch(b) == 0);  // b's work reads the block (the pretend GPU's lock: outside the section)
          EXPECT(strata_device_lock(0) == 0);
          strata_record_stream_on(0, p, b);
          strata_free(p, MiB, 0, a);
          strata_device_unlock(0);
          EXPECT(stat(0, "strata.held_for_other_streams_bytes") == static_cast<long long>(MiB));
          void* q = strata_malloc(MiB, 0, a);
          EXPECT(q != p);  // not reused while b may still read it
          EXPECT(strata_sim_finish(b) == 0);
          EXPECT(strata_malloc(4096, 0, a) != nullptr);
          EXPECT(stat(0, "strata.held_for_other_streams_bytes") == 0);
          strata_report_error("");
          strata_record_stream_on(1, q, b);  // device 1's stack is not built: q is not its block
          EXPECT(mentions("not strata's"));
          (void)strata_malloc(MiB, 1, strata_sim_stream_create(1));
          strata_record_stream_on(1, q, b);
          EXPECT(mentions("not a strata block of device 1"));
        }) == "");
}

TEST_CASE("C API: free of a pointer on a device that never allocated is reported, not passed on")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated") == 0);
          int local = 0;
          strata_free(&local, 4, 3, nullptr);
          EXPECT(mentions("no stack"));
          EXPECT(strata_base_alloc(&local, nullptr) == &local);
        }) == "");
}

TEST_CASE("C API: sleep and wake by tag on the simulated stack (tag_begin/end, pause, resume, the backup, bad use)")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated,sim_capacity=256MiB") == 0);
          cudaStream_t a = strata_sim_stream_create(0);
          EXPECT(strata_current_tag() == 0);
          strata_tag_begin(3);
          EXPECT(strata_current_tag() == 3);
          void* weights = strata_malloc(40 * MiB, 0, a);
          strata_tag_begin(4);
          void* cache = strata_malloc(100 * MiB, 0, a);
          strata_tag_end();
          strata_tag_end();
          EXPECT(strata_current_tag() == 0);
          strata_tag_end();  // one too many: an error, nothing changes
          EXPECT(mentions("no strata_tag_begin"));
          EXPECT(weights != nullptr && cache != nullptr);
          const long long reserved = stat(0, "reserved_bytes.all.current");
          EXPECT(strata_reserve_backup(0, 40 * MiB) == 0);
          const unsigned trainer[] = {3};
          strata_tag_figures running{};
          EXPECT(strata_tag_figures_get(0, 3, &running) == 0);
          EXPECT(running.in_use == 40 * MiB && running.physical >= 40 * MiB && running.paused == 0 && running.paused_bytes == 0);
          EXPECT(strata_pause(trainer, 1, 1) == 0);
          EXPECT(stat(0, "reserved_bytes.all.current") <= reserved - static_cast<long long>(40 * MiB));
          strata_tag_figures asleep{};
          EXPECT(strata_tag_figures_get(0, 3, &asleep) == 0);
          EXPECT(asleep.physical == 0 && asleep.in_use == 0 && asleep.paused == 1 && asleep.paused_bytes == 40 * MiB);
          strata_tag_figures cache_tag{};
          EXPECT(strata_tag_figures_get(0, 4, &cache_tag) == 0);
          EXPECT(cache_tag.in_use == 100 * MiB && cache_tag.paused == 0);
          EXPECT(strata_tag_figures_get(0, 1024, &cache_tag) == -1);
          EXPECT(mentions("tag 1024"));
          EXPECT(strata_tag_figures_get(1, 3, &cache_tag) == 1);  // device 1 has no stack yet
          EXPECT(cache_tag.physical == 0 && cache_tag.paused == 0);
          EXPECT(strata_pause(trainer, 1, 1) == -1);  // already paused
          EXPECT(mentions("already paused"));
          strata_tag_begin(3);
          EXPECT(strata_malloc(1000, 0, a) == nullptr);  // allocating into a sleeping tag
          EXPECT(mentions("paused"));
          strata_tag_end();
          // The other tag fills the device: waking the trainer does not fit, and says so.
          strata_tag_begin(4);
          void* more = strata_malloc(120 * MiB, 0, a);
          strata_tag_end();
          EXPECT(more != nullptr);
          EXPECT(strata_resume(trainer, 1) == -1);
          EXPECT(mentions("tag 3"));
          strata_free(more, 120 * MiB, 0, a);
          EXPECT(strata_resume(trainer, 1) == 0);
          EXPECT(strata_resume(trainer, 1) == -1);  // running
          EXPECT(strata_release_backup() == 40 * MiB);
          strata_free(weights, 40 * MiB, 0, a);
          strata_free(cache, 100 * MiB, 0, a);
          const unsigned unknown[] = {9};
          EXPECT(strata_pause(unknown, 1, 0) == -1);
          EXPECT(mentions("never used"));
        }) == "");
}

TEST_CASE("C API: a tag pauses and resumes on the devices it lives on, the others untouched")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated,sim_devices=2,sim_capacity=256MiB") == 0);
          cudaStream_t on0 = strata_sim_stream_create(0), on1 = strata_sim_stream_create(1);
          strata_tag_begin(5);
          void* weights = strata_malloc(40 * MiB, 0, on0);  // tag 5 on device 0 alone
          strata_tag_end();
          void* other = strata_malloc(8 * MiB, 1, on1);  // device 1 built, tag 0 only
          EXPECT(weights != nullptr && other != nullptr);
          const unsigned five[] = {5};
          EXPECT(strata_pause(five, 1, 1) == 0);
          EXPECT(stat(1, "allocated_bytes.all.current") == static_cast<long long>(8 * MiB));
          EXPECT(strata_pause(five, 1, 1) == -1);  // paused on device 0: refused there, nothing changed
          EXPECT(mentions("already paused"));
          EXPECT(strata_resume(five, 1) == 0);
          EXPECT(strata_resume(five, 1) == -1);
          EXPECT(mentions("not paused on any device"));
          strata_free(weights, 40 * MiB, 0, on0);
          strata_free(other, 8 * MiB, 1, on1);
        }) == "");
}

TEST_CASE("C API: share_block exports only page-mapped device memory; other pointers are not its to share")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_share_block(nullptr, nullptr, nullptr, nullptr, 0) == 0);
          int local = 0;
          EXPECT(strata_share_block(&local, nullptr, nullptr, nullptr, 0) == 0);  // no stack built yet
          EXPECT(strata_configure("stack=simulated,sim_capacity=1GiB") == 0);
          cudaStream_t s = strata_sim_stream_create(0);
          void* p = strata_malloc(3 * MiB, 0, s);
          EXPECT(p != nullptr);
          std::size_t offset = 7, sizes[4] = {};
          int fds[4] = {-1, -1, -1, -1};
          // Simulated pages stand for no memory another process could map: nothing is exported.
          EXPECT(strata_share_block(p, &offset, sizes, fds, 4) == 0);
          EXPECT(offset == 7 && fds[0] == -1);
          EXPECT(strata_share_block(&local, &offset, sizes, fds, 4) == 0);
          strata_free(p, 3 * MiB, 0, s);
        }) == "");
}

TEST_CASE("C API: a pause borrows its backup from the lender, which a resume gets back at once; the stack pins none of its own")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated,sim_capacity=256MiB") == 0);
          counting_lender lender;
          EXPECT(lender.lend() == 1);  // before any stack is built: the stacks built later borrow
          cudaStream_t a = strata_sim_stream_create(0);
          void* weights = tagged_malloc(3, 40 * MiB, 0, a);
          EXPECT(weights != nullptr);
          const unsigned trainer[] = {3};
          EXPECT(strata_pause(trainer, 1, 1) == 0);
          EXPECT(lender.takes == 1 && lender.bytes_out() == 40 * MiB);  // the backup is the lender's memory
          // The backup the lender holds goes back to the device at resume: a pattern written into it comes back
          // in the next pause's backup, so the copies went through the lent memory both ways.
          unsigned char* backup = lender.lent_block();
          EXPECT(backup != nullptr);
          if (backup != nullptr) stamp(backup, 40 * MiB, 7);
          EXPECT(strata_resume(trainer, 1) == 0);
          EXPECT(lender.gives == 1 && lender.out.empty());  // given back at once, not kept for the next pause
          EXPECT(strata_release_backup() == 0);             // nothing pinned of the stack's own
          EXPECT(strata_pause(trainer, 1, 1) == 0);
          EXPECT(lender.takes == 2 && lender.lent_block() != nullptr);
          EXPECT(lender.lent_block() != nullptr && stamped(lender.lent_block(), 40 * MiB, 7));
          EXPECT(strata_resume(trainer, 1) == 0);
          EXPECT(lender.gives == 2 && lender.out.empty());
          // Pinned ahead: taken from the lender too, and given back by release_backup.
          EXPECT(strata_reserve_backup(0, 16 * MiB) == 0);
          EXPECT(lender.takes == 3 && lender.bytes_out() == 16 * MiB);
          EXPECT(strata_release_backup() == 16 * MiB);
          EXPECT(lender.out.empty());
          EXPECT(strata_clear_backup_lender() == 0);
          strata_free(weights, 40 * MiB, 0, a);
        }) == "");
}

TEST_CASE("C API: a lender that lends nothing fails the pause as out of memory, the tag awake and its contents intact")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated,sim_capacity=256MiB") == 0);
          counting_lender lender;
          cudaStream_t a = strata_sim_stream_create(0);
          void* weights = tagged_malloc(3, 40 * MiB, 0, a);
          EXPECT(lender.lend() == 1);  // the stack is built: it borrows from here on
          const unsigned trainer[] = {3};
          EXPECT(strata_pause(trainer, 1, 1) == 0);
          if (unsigned char* backup = lender.lent_block()) stamp(backup, 40 * MiB, 9);
          EXPECT(strata_resume(trainer, 1) == 0);  // the pattern is on the device
          lender.refuse = true;
          EXPECT(strata_pause(trainer, 1, 1) == -1);
          EXPECT(mentions("out of memory") && mentions("lent nothing"));
          strata_tag_figures awake{};
          EXPECT(strata_tag_figures_get(0, 3, &awake) == 0);
          EXPECT(awake.paused == 0 && awake.in_use == 40 * MiB && awake.physical >= 40 * MiB);
          EXPECT(lender.out.empty() && strata_release_backup() == 0);
          void* more = tagged_malloc(3, MiB, 0, a);  // the tag still serves allocations
          EXPECT(more != nullptr);
          strata_free(more, MiB, 0, a);
          lender.refuse = false;
          EXPECT(strata_pause(trainer, 1, 1) == 0);
          EXPECT(lender.lent_block() != nullptr && stamped(lender.lent_block(), 40 * MiB, 9));  // nothing lost
          EXPECT(strata_resume(trainer, 1) == 0);
          strata_free(weights, 40 * MiB, 0, a);
        }) == "");
}

TEST_CASE("C API: the lender is not switched while backup memory is out; every device switches, built before or after")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=simulated,sim_devices=2,sim_capacity=256MiB") == 0);
          counting_lender first, second;
          EXPECT(strata_set_backup_lender(&first, &counting_lender::take, nullptr) == -1);
          EXPECT(mentions("both take and give"));
          cudaStream_t on0 = strata_sim_stream_create(0);
          void* weights = tagged_malloc(3, 40 * MiB, 0, on0);
          EXPECT(first.lend() == 1);
          const unsigned trainer[] = {3};
          EXPECT(strata_pause(trainer, 1, 1) == 0);
          EXPECT(first.bytes_out() == 40 * MiB);
          // A paused tag's backup is the first lender's: switching to another lender or to the stack's own pins is refused.
          EXPECT(second.lend() == -1);
          EXPECT(mentions("device 0 holds 41943040 bytes") && mentions("strata_release_backup()"));
          EXPECT(strata_clear_backup_lender() == -1);
          EXPECT(mentions("resume"));
          EXPECT(first.lend() == 1);  // the lender already set: nothing to switch
          EXPECT(strata_resume(trainer, 1) == 0);
          EXPECT(first.out.empty() && first.gives == 1);  // the refused switches left it lending
          // Backup pinned ahead (the stack's own, without a lender) is out too.
          EXPECT(strata_clear_backup_lender() == 0);
          EXPECT(strata_reserve_backup(0, 8 * MiB) == 0);
          EXPECT(first.takes == 1);  // pinned by the stack itself
          EXPECT(second.lend() == -1);
          EXPECT(mentions("strata_reserve_backup"));
          EXPECT(strata_release_backup() == 8 * MiB);
          EXPECT(second.lend() == 1);
          // Device 1's stack is built after the lender was set: its pause borrows from it as well.
          cudaStream_t on1 = strata_sim_stream_create(1);
          void* cache = tagged_malloc(5, 24 * MiB, 1, on1);
          const unsigned both[] = {3, 5};
          EXPECT(strata_pause(both, 2, 1) == 0);
          EXPECT(second.takes == 2 && second.bytes_out() == 64 * MiB && first.out.empty());
          EXPECT(strata_resume(both, 2) == 0);
          EXPECT(second.out.empty() && second.gives == 2);
          EXPECT(strata_clear_backup_lender() == 0);
          EXPECT(strata_pause(trainer, 1, 1) == 0);  // pins its own again: the lenders see nothing
          EXPECT(first.takes == 1 && second.takes == 2);
          EXPECT(strata_resume(trainer, 1) == 0);
          EXPECT(strata_release_backup() == 40 * MiB);
          // A tag paused without its backup holds none, and still refuses the switch: its resume must find the
          // pins where its pause left them.
          EXPECT(strata_pause(trainer, 1, 0) == 0);
          EXPECT(first.lend() == -1);
          EXPECT(mentions("tag 3 paused"));
          EXPECT(strata_resume(trainer, 1) == 0);
          EXPECT(first.lend() == 1);
          EXPECT(strata_clear_backup_lender() == 0);
          strata_free(weights, 40 * MiB, 0, on0);
          strata_free(cache, 24 * MiB, 1, on1);
        }) == "");
}

TEST_CASE("C API: a stack that cannot sleep borrows nothing, and setting a lender for it is no error")
{
  CHECK(in_child([](expectations& ex) {
          EXPECT(strata_configure("stack=coalescing") == 0);
          counting_lender lender;
          EXPECT(lender.lend() == 0);
          EXPECT(strata_clear_backup_lender() == 0);
        }) == "");
}
