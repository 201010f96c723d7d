#pragma once
// The differential fuzzer's engine: drives one stack with a random sequence of allocations, frees, moves,
// releases and refusals, and checks after every step what every box promises (docs/architecture.md, "Rules
// every box keeps"):
// - no two live blocks overlap, every pointer is aligned to max(alignment, 256), allocate(0) is null;
// - in_use equals the sum of good_size over the live blocks, and never exceeds reserved;
// - a call that throws changes neither in_use nor reserved nor what the upstream holds;
// - a bad alignment is std::invalid_argument (never out_of_memory, never a pointer);
// - release() with nothing live hands everything back to the upstream;
// - a move leaves the moved-from box empty and usable, a move assignment returns the assigned-to box's memory;
// - the upstream never sees a foreign, double or wrongly sized free;
// - memory is never handed out while work queued before its free may still use it: a block returned by
//   allocate_async on stream t only where every stream whose queued work could still touch the memory is t
//   itself, has completed that work, or t was made to wait for it; a block returned by a synchronous allocate
//   (ready for the host and every stream) only once that work has completed (stream_safety below).
// Every choice comes from an `entropy`: a seeded generator, or the bytes of a libFuzzer input.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <strata/core/alignment.hpp>
#include <strata/core/errors.hpp>
#include <strata/source/simulated_devices.hpp>
#include <strata/stream/simulated_streams.hpp>

#include "fuzz/adversarial_source.hpp"

namespace strata::testing {

struct fuzz_config {
  std::uint64_t seed = 1;
  std::size_t operations = 10'000;
  std::span<const std::uint8_t> input{};       ///< libFuzzer's bytes: when given, they drive every choice
  std::size_t capacity = 0;                      ///< what the upstream lets be live at once (0: drawn, 64 MiB .. 4 GiB)
  std::size_t max_live = 48;
};

struct fuzz_report {
  std::string stack;
  std::uint64_t seed = 0;
  std::size_t operations = 0, allocations = 0, frees = 0, refusals = 0, bad_alignments = 0, zero_sized = 0;
  std::size_t moves = 0, drains = 0, injected_refusals = 0, retries = 0, streams_replaced = 0;
  std::vector<std::string> violations;  // the first few; empty when every check held
  bool ok() const noexcept { return violations.empty(); }
  std::string summary() const;
};

/// The source of every choice: a seeded generator, or a byte string that ends.
class entropy {
public:
  explicit entropy(std::uint64_t seed) : rng_(seed) {}
  explicit entropy(std::span<const std::uint8_t> input) : input_(input), from_input_(true) {}
  std::uint64_t next() noexcept
  {
    if (!from_input_) return rng_();
    std::uint64_t v = 0;
    for (int k = 0; k < 4 && used_ < input_.size(); ++k) v = v << 8 | input_[used_++];
    return v * 0x9E3779B97F4A7C15ull;
  }
  std::uint64_t below(std::uint64_t n) noexcept { return n == 0 ? 0 : next() % n; }
  bool chance(unsigned percent) noexcept { return below(100) < percent; }
  bool exhausted() const noexcept { return from_input_ && used_ >= input_.size(); }

private:
  std::mt19937_64 rng_{};
  std::span<const std::uint8_t> input_{};
  std::size_t used_ = 0;
  bool from_input_ = false;
};

/// What a stack built for the fuzzer may call back into: retry_on_oom's callback frees a live block through
/// the stack itself, as a program that drops a cache would.
struct fuzz_hooks {
  std::function<bool(std::size_t bytes)> on_oom = [](std::size_t) { return false; };
};

/// The world a factory builds a stack in.
struct fuzz_world {
  adversarial_source& upstream;
  simulated_streams& streams;
  simulated_devices& devices;  ///< two pretend devices, for per_device; the fuzzer switches the current one
  fuzz_hooks& hooks;
};

namespace fuzz_detail {

template <class S>
concept reports_usage = requires(const S& s) { s.usage(); };
template <class S>
concept reports_good_size = requires(const S& s, std::size_t n) { { s.good_size(n, n) } -> std::convertible_to<std::size_t>; };
template <class S>
concept can_release = requires(S& s) { s.release(); };
template <class S>
concept stream_ordered_calls = requires(S& s, void* p, std::size_t n, cuda::stream_ref st) {
  s.allocate_async(n, n, st);
  s.deallocate_async(p, n, n, st);
};

struct live {
  std::size_t bytes, alignment, good;
  cuda::stream_ref stream{cudaStream_t{}};  // not the deprecated default: std::map default-builds entries
  bool on_stream;
};

} // namespace fuzz_detail

/// The fuzzer's model of who may still touch freed memory. Each freed range carries a fence: for each stream,
/// the work queued on it before the free (an allocate_async'd block's free: its own stream after its last use;
/// a synchronous free: every stream's queued work, as cudaFree waits for it all). A range handed out again is
/// checked against its fence and leaves the model; a range the upstream takes back leaves it too (a source's
/// free is the source's to order: cudaFree waits for the device).
class stream_safety {
public:
  explicit stream_safety(simulated_streams& world) : world_(&world) {}

  /// The range [p, p + bytes) was freed on `stream`, after the work queued on it so far.
  void freed_on(std::uintptr_t p, std::size_t bytes, cuda::stream_ref stream)
  {
    const std::uint64_t id = world_->id_of(stream);
    add(p, bytes, {{id, world_->enqueued(id)}});
  }
  /// The range was freed synchronously, as cudaFree frees: the queued work of every stream of the memory's
  /// device (the fuzzer's upstream is device 0's) may still use it. (Another device's stream that used it must
  /// be ordered by the program, as before cudaFree.)
  void freed_synchronously(std::uintptr_t p, std::size_t bytes, std::span<const cuda::stream_ref> streams)
  {
    std::vector<entry> fence;
    const auto note = [&](std::uint64_t id) {
      if (world_->completed(id) < world_->enqueued(id)) fence.push_back({id, world_->enqueued(id)});
    };
    note(world_->id_of(simulated_streams::legacy()));
    for (const auto s : streams)
      if (world_->device_of(s) == 0 && s.get() != cudaStreamLegacy) note(world_->id_of(s));
    add(p, bytes, std::move(fence));
  }

  /// Checks a hand-out of [p, p + bytes) to `stream` (`for_host`: to the host and every stream) and forgets the
  /// fences over the whole block, [p, p + footprint): its taker holds it all. Returns what was unsafe, or an
  /// empty string.
  std::string handed_out(std::uintptr_t p, std::size_t bytes, std::size_t footprint, cuda::stream_ref stream, bool for_host)
  {
    const std::uint64_t taker = for_host ? no_stream : world_->id_of(stream);
    const std::uintptr_t end = p + std::max(bytes, footprint);
    std::string unsafe;
    auto it = first_overlapping(p);
    while (it != ranges_.end() && it->first < end) {
      const bool touched = it->first < p + bytes;  // the slack past the request is never touched
      for (const entry& e : it->second.fence) {
        if (!touched || !unsafe.empty() || world_->completed(e.stream) >= e.ticket) continue;
        if (taker == e.stream || (taker != no_stream && world_->ordered_after(taker, e.stream) >= e.ticket)) continue;
        unsafe = "memory freed on stream " + std::to_string(e.stream) + " after its work " + std::to_string(e.ticket) +
                 " (completed: " + std::to_string(world_->completed(e.stream)) + ") handed out " +
                 (for_host ? std::string("to the host") : "to stream " + std::to_string(taker));
      }
      it = clip(it, p, end);
    }
    return unsafe;
  }
  /// The upstream took [p, p + bytes) back.
  void returned(std::uintptr_t p, std::size_t bytes)
  {
    auto it = first_overlapping(p);
    while (it != ranges_.end() && it->first < p + bytes) it = clip(it, p, p + bytes);
  }
  /// Every stream's work completed: no fence can bind.
  void all_complete() noexcept { ranges_.clear(); }
  std::size_t checked() const noexcept { return checked_; }

private:
  static constexpr std::uint64_t no_stream = ~std::uint64_t{0};
  struct entry {
    std::uint64_t stream, ticket;
  };
  struct range {
    std::uintptr_t end;
    std::vector<entry> fence;
  };
  using map = std::map<std::uintptr_t, range>;

  void add(std::uintptr_t p, std::size_t bytes, std::vector<entry> fence)
  {
    if (bytes == 0 || fence.empty()) return;
    ++checked_;
    ranges_[p] = range{p + bytes, std::move(fence)};  // disjoint: the range was live, so cut out of every fence
  }
  map::iterator first_overlapping(std::uintptr_t p)
  {
    auto it = ranges_.upper_bound(p);
    if (it != ranges_.begin() && std::prev(it)->second.end > p) return std::prev(it);
    return it;
  }
  /// Cuts [lo, hi) out of the range at `it`; returns the next range.
  map::iterator clip(map::iterator it, std::uintptr_t lo, std::uintptr_t hi)
  {
    const std::uintptr_t start = it->first;
    range r = std::move(it->second);
    it = ranges_.erase(it);
    if (r.end > hi) it = ranges_.emplace_hint(it, hi, range{r.end, r.fence});
    if (start < lo) ranges_.emplace_hint(it, start, range{lo, std::move(r.fence)});
    return it;
  }

  simulated_streams* world_;
  map ranges_;
  std::size_t checked_ = 0;
};

/// Runs `cfg.operations` random steps (or until the input ends) on the stack `make(world)` builds.
/// A call refused for bad input changes nothing. One refused for want of memory changes no figure but two
/// documented ones, which may only fall: a mapped_pool hands idle
/// mappings back to the device before it refuses (as release() would), and stream_ordered returns the blocks
/// its streams have freed to the policy before the policy is asked (a policy may hand free memory back as it
/// takes them). So in those stacks reserved and the upstream's holding may fall on a refused call, never rise;
/// in_use never moves.
template <class Stack, class Make>
fuzz_report fuzz_stack(std::string name, Make make, const fuzz_config& cfg)
{
  const bool refusal_hands_back_idle = name.find("mapped_pool") != std::string::npos || name.find("stream_ordered") != std::string::npos;
  using namespace fuzz_detail;
  fuzz_report report{.stack = std::move(name), .seed = cfg.seed};
  entropy rnd = cfg.input.empty() ? entropy(cfg.seed) : entropy(cfg.input);
  const std::size_t capacity = cfg.capacity != 0 ? cfg.capacity : rnd.chance(50) ? std::size_t{4} << 30 : std::size_t{64} << (20 + rnd.below(4));
  adversarial_source upstream(capacity);
  simulated_streams world;
  simulated_devices devices(2);
  fuzz_hooks hooks;
  fuzz_world w{upstream, world, devices, hooks};
  stream_safety safety(world);
  upstream.on_return = [&safety](std::uintptr_t p, std::size_t bytes) { safety.returned(p, bytes); };

  // Boxes live on the heap, not in std::optional: optional asks whether a box is default-constructible,
  // which for some stacks is not a question a compiler may answer.
  std::unique_ptr<Stack> slot_a(new Stack(make(w))), slot_b;
  Stack* stack = slot_a.get();
  std::map<std::uintptr_t, live> blocks;
  std::vector<cuda::stream_ref> streams{world.create(), world.create(), world.create()};
  // A third of the runs also call on the legacy default stream (a permanent stream: its owner frees carry no
  // event), first, so that a one-stream run is then the legacy stream's alone.
  if (rnd.chance(33)) streams.insert(streams.begin(), simulated_streams::legacy());
  // A quarter of the runs make every call on one stream, so that its owner keeps stream_ordered to itself
  // (the lone owner's short path where capture checks are off); the rest spread their calls over three.
  const bool one_stream = rnd.chance(25);
  bool in_callback_free = false;
  bool callback_frees = true;  // off while a move is checked: a freed block would move the upstream's figures
  std::size_t callback_freed = 0;

  auto fail = [&](const std::string& what) {
    if (report.violations.size() < 8)
      report.violations.push_back("step " + std::to_string(report.operations) + ": " + what);
  };
  auto good_size_of = [&](std::size_t bytes, std::size_t alignment) -> std::size_t {
    if constexpr (reports_good_size<Stack>) return stack->good_size(bytes, alignment);
    else return align_up(bytes, default_alignment);  // what a box without good_size promises to count
  };
  auto held = [&] { return upstream.live_bytes(); };
  auto free_block = [&](std::map<std::uintptr_t, live>::iterator it) {
    const std::uintptr_t it_address = it->first;
    void* p = reinterpret_cast<void*>(it_address);
    const live b = it->second;
    blocks.erase(it);
    if constexpr (stream_ordered_calls<Stack>) {
      // Mostly freed the way it was allocated; sometimes a stream's block is freed synchronously, or a
      // synchronous block is used and freed on a stream.
      const bool crossed = !one_stream && rnd.chance(10);  // one stream's frees stay its own: its owner keeps the layer
      if (b.on_stream != crossed) {
        const cuda::stream_ref on = b.on_stream ? b.stream : streams[rnd.below(streams.size())];
        world.launch(on);  // the block's last use, queued before its free
        safety.freed_on(it_address, b.bytes, on);
        if constexpr (requires { stack->record_use(p, on); }) stack->record_use(p, on);  // checked<>: a use it was told of
        stack->deallocate_async(p, b.bytes, b.alignment, on);
        return;
      }
      if (b.on_stream) {
        world.launch(b.stream);
        if (world.device_of(b.stream) != 0) world.finish(b.stream);  // the program orders another device's use
      }
    }
    safety.freed_synchronously(it_address, b.bytes, streams);
    stack->deallocate(p, b.bytes, b.alignment);
  };
  hooks.on_oom = [&](std::size_t) {
    if (blocks.empty() || !callback_frees) return false;
    auto it = blocks.begin();
    std::advance(it, static_cast<long>(rnd.below(blocks.size())));
    in_callback_free = true;
    free_block(it);
    in_callback_free = false;
    ++callback_freed;
    ++report.retries;
    return true;
  };

  auto check_accounts = [&] {
    if (upstream.bad_frees() != 0) fail(std::to_string(upstream.bad_frees()) + " frees the upstream never handed out (double, foreign or wrong size)");
    if constexpr (reports_usage<Stack>) {
      const auto u = stack->usage();
      if (u.in_use > u.reserved) fail("in_use " + std::to_string(u.in_use) + " above reserved " + std::to_string(u.reserved));
      {
        std::size_t sum = 0;
        for (const auto& [a, b] : blocks) sum += b.good;
        if (u.in_use != sum) fail("in_use " + std::to_string(u.in_use) + " but the live blocks' good sizes add up to " + std::to_string(sum));
      }
    }
  };

  auto pick_size = [&]() -> std::size_t {
    const auto r = rnd.below(100);
    if (r < 3) return 0;
    if (r < 5) {
      switch (rnd.below(4)) {
      case 0: return SIZE_MAX;
      case 1: return SIZE_MAX - 255;
      case 2: return capacity + 1;
      default: return capacity - rnd.below(capacity / 2);
      }
    }
    const unsigned log = static_cast<unsigned>(rnd.below(30));  // 1 B .. 512 MiB, log-uniform
    return (std::size_t{1} << log) + rnd.below(std::size_t{1} << log);
  };
  auto pick_alignment = [&]() -> std::size_t {
    const auto r = rnd.below(100);
    if (r < 70) return std::size_t{256} << rnd.below(4);         // 256 B .. 2 KiB
    if (r < 80) return std::size_t{1} << rnd.below(8);           // 1 .. 128
    if (r < 95) return std::size_t{1} << (8 + rnd.below(24));    // 256 B .. 2 GiB
    const std::size_t odd[] = {0, 3, 384, 1000, (std::size_t{1} << 20) + 256};
    return odd[rnd.below(5)];
  };

  auto allocate_once = [&] {
    const std::size_t bytes = pick_size(), alignment = pick_alignment();
    const bool bad_alignment = !is_power_of_two(alignment);
    const bool on_stream = stream_ordered_calls<Stack> && rnd.chance(one_stream ? 99 : 70);  // a one-stream run allocates synchronously now and then
    const cuda::stream_ref s = one_stream ? streams[0] : streams[rnd.below(streams.size())];
    if (rnd.chance(3)) {
      upstream.refuse_next(1);
      ++report.injected_refusals;
    }
    std::optional<strata::usage> before;
    if constexpr (reports_usage<Stack>) before = stack->usage();
    const std::size_t held_before = held();
    callback_freed = 0;
    void* p = nullptr;
    const auto described = [&] { return "allocate(" + std::to_string(bytes) + ", " + std::to_string(alignment) + ")"; };
    // Bad input is refused before anything moves; only out of memory may have handed free memory back.
    auto unchanged = [&](const char* how, bool out_of_memory) {
      if (callback_freed != 0) return;  // the callback freed blocks: the figures moved by design
      const bool may_fall = out_of_memory && refusal_hands_back_idle;
      if (held() != held_before && !(may_fall && held() < held_before))
        fail(described() + " " + how + " but the upstream's holding moved from " + std::to_string(held_before) + " to " + std::to_string(held()));
      if constexpr (reports_usage<Stack>) {
        const auto after = stack->usage();
        const bool reserved_kept = after.reserved == before->reserved || (may_fall && after.reserved < before->reserved);
        if (after.in_use != before->in_use || !reserved_kept)
          fail(described() + " " + how + " but in_use/reserved moved from " + std::to_string(before->in_use) + "/" +
               std::to_string(before->reserved) + " to " + std::to_string(after.in_use) + "/" + std::to_string(after.reserved));
      }
    };
    try {
      if constexpr (stream_ordered_calls<Stack>) p = on_stream ? stack->allocate_async(bytes, alignment, s) : stack->allocate(bytes, alignment);
      else p = stack->allocate(bytes, alignment);
    } catch (const std::invalid_argument&) {
      upstream.refuse_nothing();
      ++report.bad_alignments;
      if (!bad_alignment && alignment <= default_alignment) fail(described() + " threw invalid_argument for an alignment every box honours");
      unchanged("threw invalid_argument", false);
      return;
    } catch (const std::bad_alloc&) {
      upstream.refuse_nothing();
      ++report.refusals;
      if (bad_alignment && bytes != 0) fail(described() + ": an alignment that is not a power of two reported as out of memory");
      if (alignment > (std::size_t{1} << 30) && bytes <= (std::size_t{1} << 20))
        fail(described() + ": an alignment no box honours reported as out of memory");
      unchanged("threw out_of_memory", true);
      return;
    } catch (const std::exception& e) {
      upstream.refuse_nothing();
      fail(described() + " threw " + e.what());
      return;
    }
    upstream.refuse_nothing();
    if (bytes == 0) {
      ++report.zero_sized;
      if (p != nullptr) fail(described() + " returned a pointer");
      return;
    }
    if (bad_alignment) fail(described() + " accepted an alignment that is not a power of two");
    if (p == nullptr) return fail(described() + " returned null");
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    if (a % effective_alignment(alignment) != 0) fail(described() + " returned a misaligned " + std::to_string(a));
    auto next = blocks.lower_bound(a);
    if (next != blocks.end() && next->first < a + bytes) fail(described() + " overlaps a live block of " + std::to_string(next->second.bytes) + " bytes");
    if (next != blocks.begin() && std::prev(next)->first + std::prev(next)->second.bytes > a)
      fail(described() + " lies inside a live block of " + std::to_string(std::prev(next)->second.bytes) + " bytes");
    if (const std::string unsafe = safety.handed_out(a, bytes, good_size_of(bytes, alignment), s, !on_stream); !unsafe.empty())
      fail(described() + (on_stream ? " on a stream: " : " (synchronous): ") + unsafe);
    blocks[a] = live{bytes, alignment, good_size_of(bytes, alignment), s, on_stream};
    ++report.allocations;
  };

  // A program retires a stream: it frees some of the stream's blocks on it, destroys it, and hands the others
  // to a new stream, of either device, which may get the destroyed one's handle at once (as CUDA's driver
  // hands it out) and uses and frees them from then on.
  auto replace_stream = [&] {
    const std::size_t k = one_stream ? 0 : rnd.below(streams.size());  // a one-stream run retires the stream it uses
    const cuda::stream_ref old = streams[k];
    if (old.get() == cudaStreamLegacy) return;
    std::vector<std::uintptr_t> handed;
    for (auto it = blocks.begin(); it != blocks.end();) {
      const auto next = std::next(it);
      if (it->second.on_stream && it->second.stream.get() == old.get()) {
        if (rnd.chance(50)) free_block(it);
        else handed.push_back(it->first);
      }
      it = next;
    }
    if (!handed.empty()) world.finish(old);  // the program orders the successor after the old stream's use
    world.destroy(old);
    streams[k] = world.create(static_cast<int>(rnd.below(2)));
    for (const std::uintptr_t a : handed) {
      blocks.at(a).stream = streams[k];
      if constexpr (requires(void* q) { stack->record_use(q, streams[k]); })
        stack->record_use(reinterpret_cast<void*>(a), streams[k]);  // checked<>: a use it was told of
    }
    ++report.streams_replaced;
    // Sometimes the successor gives one block up at once and the host takes memory of its size (a staging
    // buffer): the hand-out must wait for the successor's use, whatever handle and device it has.
    if constexpr (stream_ordered_calls<Stack>) {
      if (handed.empty() || !rnd.chance(50)) return;
      const live b = blocks.at(handed.front());
      void* p = reinterpret_cast<void*>(handed.front());
      blocks.erase(handed.front());
      world.launch(b.stream);
      safety.freed_on(handed.front(), b.bytes, b.stream);
      stack->deallocate_async(p, b.bytes, b.alignment, b.stream);
      void* q = nullptr;
      try {
        q = stack->allocate(b.bytes, b.alignment);
      } catch (const std::bad_alloc&) {
        return;
      }
      const auto a = reinterpret_cast<std::uintptr_t>(q);
      if (const std::string unsafe = safety.handed_out(a, b.bytes, good_size_of(b.bytes, b.alignment), b.stream, /*for_host=*/true); !unsafe.empty())
        fail("allocate(" + std::to_string(b.bytes) + ") (synchronous, after a successor's free): " + unsafe);
      blocks[a] = live{b.bytes, b.alignment, good_size_of(b.bytes, b.alignment), b.stream, false};
      ++report.allocations;
    }
  };

  auto drain = [&] {
    while (!blocks.empty()) free_block(blocks.begin());
    ++report.drains;
    if constexpr (can_release<Stack>) {
      world.finish_all();
      safety.all_complete();
      stack->release();
      if (held() != 0) fail("release() with nothing live left " + std::to_string(held()) + " bytes at the upstream");
      if constexpr (reports_usage<Stack>) {
        const auto u = stack->usage();
        if (u.reserved != 0 || u.in_use != 0) fail("release() with nothing live left reserved/in_use " + std::to_string(u.reserved) + "/" + std::to_string(u.in_use));
      }
    }
  };

  auto move_around = [&] {
    if constexpr (std::is_move_constructible_v<Stack>) {
      std::unique_ptr<Stack>& from = stack == slot_a.get() ? slot_a : slot_b;
      std::unique_ptr<Stack>& to = stack == slot_a.get() ? slot_b : slot_a;
      const std::size_t held_before = held();
      callback_frees = false;
      if constexpr (std::is_move_assignable_v<Stack>) {
        if (rnd.chance(50)) {
          // Assign over a box that holds memory of its own: that memory must go back.
          to.reset(new Stack(make(w)));
          try {
            (void)to->allocate(4096);
          } catch (const std::bad_alloc&) {
          }
          *to = std::move(*from);
          if (held() != held_before) fail("a move assignment kept the assigned-to box's memory: upstream holds " + std::to_string(held()) + ", was " + std::to_string(held_before));
        } else {
          to.reset(new Stack(std::move(*from)));
        }
      } else {
        to.reset(new Stack(std::move(*from)));
      }
      if (held() != held_before) fail("a move changed what the upstream holds");
      stack = to.get();
      if constexpr (reports_usage<Stack>) {
        if (from->usage().reserved != 0 || from->usage().in_use != 0) fail("a moved-from box reports memory");
      }
      from.reset();
      callback_frees = true;
      ++report.moves;
    }
  };

  for (; cfg.input.empty() ? report.operations < cfg.operations : !rnd.exhausted(); ++report.operations) {
    const auto r = rnd.below(1000);
    if (r < 2) drain();
    else if (r < 4) move_around();
    else if (r < 6) devices.make_current(static_cast<int>(rnd.below(2)));
    else if (r < 30) {
      if constexpr (stream_ordered_calls<Stack>) {
        if (r < 15) world.finish(streams[rnd.below(streams.size())]);
        else if (r < 18) {
          world.finish_all();
          safety.all_complete();
        } else if (r < 19 || (one_stream && r < 26)) {  // a one-stream run retires its stream more often
          replace_stream();
        }
        else world.launch(streams[rnd.below(streams.size())]);
      }
    } else if (blocks.size() < cfg.max_live && (blocks.empty() || rnd.chance(55))) {
      allocate_once();
    } else if (!blocks.empty()) {
      auto it = blocks.begin();
      std::advance(it, static_cast<long>(rnd.below(blocks.size())));
      free_block(it);
      ++report.frees;
    }
    check_accounts();
    if (!report.violations.empty()) break;
  }
  if (report.ok()) drain();
  if (report.ok()) check_accounts();
  stack = nullptr;
  slot_a.reset();
  slot_b.reset();
  if (report.ok() && held() != 0) fail("the stack's destruction left " + std::to_string(held()) + " bytes at the upstream");
  (void)in_callback_free;
  return report;
}

inline std::string fuzz_report::summary() const
{
  std::string s = stack + " seed " + std::to_string(seed) + ": " + std::to_string(operations) + " steps, " +
                  std::to_string(allocations) + " allocations, " + std::to_string(frees) + " frees, " +
                  std::to_string(refusals) + " refusals, " + std::to_string(bad_alignments) + " bad alignments, " +
                  std::to_string(moves) + " moves, " + std::to_string(drains) + " drains";
  for (const auto& v : violations) s += "\n  " + v;
  return s;
}

/// Every stack the fuzzer knows, registered by the stacks_*.cpp files.
struct fuzz_target {
  std::string name;
  std::function<fuzz_report(const fuzz_config&)> run;
};
std::vector<fuzz_target>& fuzz_targets();

/// Registers `Stack` built by `make` under `name`.
template <class Stack, class Make>
bool register_stack(std::string name, Make make)
{
  fuzz_targets().push_back({name, [name, make](const fuzz_config& cfg) { return fuzz_stack<Stack>(name, make, cfg); }});
  return true;
}

} // namespace strata::testing
