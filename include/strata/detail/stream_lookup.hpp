#pragma once
// How a call on stream_ordered learns its stream's id and whether the stream is being captured, from the
// cheapest evidence that is enough: what the caller already knows (an identified_stream), and what the layer
// was told (a capture announced) or has seen.
#include <cstddef>
#include <cstdint>
#include <exception>

#include <strata/core/config.hpp>
#include <strata/detail/block_tags.hpp>
#include <strata/detail/stream_cache.hpp>
#include <strata/stream/cuda_events.hpp>

namespace strata::detail {

/// stream_ordered's per-call lookup (a base of the layer, which holds the state): the id a call files its
/// blocks under, and whether its stream captures. The capture query always comes before the id: the driver
/// refuses the id of a capturing stream and invalidates the capture for asking.
/// - While a capture may be under way (a route is open, or a capture was seen and is not known ended), every
///   call asks the capture query, as PyTorch's allocator does while its list of captures is not empty.
/// - Otherwise, with options::check_capture, every call asks the capture query: the only way to find a capture
///   nobody announced. Without it (captures announced with begin_allocate_to_pool, as PyTorch does) an
///   identified_stream needs no call at all.
/// - A plain handle costs the id lookup besides, asked with the capture query in one backend call where the
///   backend can (capture_then_id_backend: the capture query still first, no id for a capturing stream). A
///   handle is never taken for the stream it named before: see Note [A handle names whichever stream has it].
/// - The owner alone with the policy, with nothing to ask about captures or pools (quiet), needs nothing else
///   either: its allocate and free go straight to the policy (allocate_alone, free_alone), as one stream's
///   calls would without the layer, or, with reuse_recent_frees, its own recent free of the shape serves the
///   allocation. Asked about captures, its allocation is served the same way once the query answers
///   (alone_with).
/// Note [A handle names whichever stream has it]. Ids are never reused; handles are: the driver hands a
/// destroyed stream's handle to the next stream at once, while the old one's work still runs, and the next
/// stream may belong to another device. So every call on a plain handle asks its id: a handle that comes back
/// gets a new id and none of the old stream's blocks, and a free on it is filed as the new stream's, with its
/// device, never as the owner's it once was (a wait for the owner's devices would miss the new stream's work). Models nothing; holds nothing. Cost: while no capture may be under way, an identified
/// stream needs the capture query (check_capture) or nothing; a plain handle the id lookup besides, which a
/// free by the lone owner skips.
template <class Layer, class Backend>
class stream_lookup {
protected:
  /// An allocation by the owner alone, served by its own recent free of the shape or as the policy alone
  /// would serve it; null when the call needs more. Alone: no other stream has used the layer, no other
  /// stream's block is cached, nothing pending or set aside, so there is nothing else to reuse, reap or order
  /// after; and quiet (quiet()): no capture to ask about, no private pool to collect or serve from. A plain
  /// handle's id is asked here, the only time this call asks it (`looked_up`, and `known_id` then points to
  /// it). A sleeping tag is the policy's to refuse (its recent frees are never reused).
  void* allocate_alone(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream, const std::uint64_t*& known_id,
                       std::uint64_t& looked_up)
  {
    auto& m_ = m();
    if (!quiet() || bytes == 0 || bytes > Layer::largest_cached) return nullptr;
    if (known_id == nullptr) known_id = &(looked_up = m_.backend.id_of(stream));  // no capture to break: quiet
    if (!alone_with(*known_id)) return nullptr;
    m_.own.owner->handle = stream;
    const tag_id tag = m_.opts.reuse_recent_frees ? allocation_tag(m_.policy) : 0;  // read only where recent frees are kept
    const block_shape sh = m_.shapes.of(m_.policy, bytes, alignment, tag);
    if (void* p = l().reuse_recent(sh)) return p;
    l().give_back_recent_for(sh);
    ++m_.stats.misses;
    return m_.policy.allocate(sh.request, sh.align);
  }

  /// Whether stream `id` is the owner alone with the policy: no other stream has used the layer, nothing is
  /// cached, pending or set aside. Its allocation then has nothing to reuse, reap or order after: the policy
  /// serves it, as it would without the layer.
  bool alone_with(std::uint64_t id) const noexcept
  {
    const auto& m_ = l().m_;
    const auto* const o = m_.own.owner;
    return o != nullptr && o->id == id && !m_.own.shared && m_.cache.blocks() == 0 && m_.ledger.pending() == 0 &&
           m_.deferred.blocks.empty();
  }

  /// A free by the owner alone (as allocate_alone), straight back to the policy; false when the call needs
  /// more. A plain handle's id is asked here (Note [A handle names whichever stream has it]), the only time
  /// this call asks it (`looked_up`, and `known_id` then points to it).
  bool free_alone(void* p, std::size_t bytes, std::size_t alignment, cuda::stream_ref stream, const std::uint64_t*& known_id,
                  std::uint64_t& looked_up) noexcept
  {
    auto& m_ = m();
    auto* const o = m_.own.owner;
    if (!quiet() || o == nullptr || m_.own.shared) return false;
    if (known_id == nullptr) {
      try {
        known_id = &(looked_up = m_.backend.id_of(stream));  // no capture to break: quiet
      } catch (...) {
        return false;  // an unknown stream: the general path decides what is safe
      }
    }
    if (o->id != *known_id) return false;
    const block_shape sh = m_.shapes.of(m_.policy, bytes, alignment);
    o->handle = stream;
    ++o->recent_frees;
    l().owner_free(p, sh);
    return true;
  }

  /// The id an allocation on `stream` is filed under, in `id` (`known_id` when the caller knows it): true; or
  /// false when a private pool served it (the block in `out`). Throws usage_error under a capture nothing can
  /// serve, and the id lookup's error for an unknown stream. Inline where nothing is captured or routed.
  bool id_to_allocate(const block_shape& sh, cuda::stream_ref stream, const std::uint64_t* known_id, std::uint64_t& id, void*& out)
  {
    // The capture query comes before the id, even on a hit: a block handed to a capture without its pool
    // knowing could be reused while the graph lives.
    if constexpr (capture_then_id_backend<Backend>) {
      if (known_id == nullptr && asks_capture()) {  // both questions in one backend call
        auto& m_ = m();
        const stream_query q = m_.backend.capture_then_id(stream);
        if (q.capturing || m_.captures.any() || m_.graphs.routing()) [[unlikely]]
          return pool_or_id(sh, stream, q, id, out);
        id = q.id;
        return true;
      }
    }
    if (known_id != nullptr) {
      if (asks_capture() && l().routed(sh, stream, out)) return false;
      id = *known_id;
      return true;
    }
    return id_to_allocate_asked_apart(sh, stream, id, out);
  }

  /// The id a free on `stream` is filed under, in `id`: true; or false when the free was settled here: filed
  /// in a private pool, abandoned (under a capture, or when a capture query fails while one may go on: the
  /// graph may use the block whenever it runs), or returned after a device-wide wait (an unknown stream).
  bool id_to_free(void* p, const block_shape& sh, cuda::stream_ref stream, const std::uint64_t* known_id, std::uint64_t& id) noexcept
  {
    if (!asks_capture()) return id_to_free_asked_apart(p, sh, stream, known_id, id);
    if (known_id != nullptr) {  // the id known without asking: the capture query alone
      bool capturing = false;
      try {
        capturing = l().captures(stream);
      } catch (...) {
        return id_to_free_asked_apart(p, sh, stream, known_id, id);  // what a failed query allows is decided there
      }
      const std::uint64_t known = *known_id;
      if (capturing || !m().graphs.pools().empty()) [[unlikely]]
        return in_pools_or_id(p, sh, stream, capturing, known, id);
      id = known;
      return true;
    }
    if constexpr (capture_then_id_backend<Backend>) {  // both questions in one backend call
      auto& m_ = m();
      stream_query q;
      try {
        q = m_.backend.capture_then_id(stream);
      } catch (...) {
        return id_to_free_asked_apart(p, sh, stream, nullptr, id);  // which of the two failed decides what is safe
      }
      const bool capturing = m_.captures.saw(m_.backend, stream, q.capturing);
      if (capturing || !m_.graphs.pools().empty()) [[unlikely]]
        return in_pools_or_id(p, sh, stream, capturing, q.id, id);
      id = q.id;
      return true;
    }
    return id_to_free_asked_apart(p, sh, stream, known_id, id);
  }

private:
  /// An allocation whose stream captures, or while a capture may go on (a route is open, or one was seen):
  /// files what the capture query said, then serves it from a private pool or refuses it.
  [[gnu::noinline]] bool pool_or_id(const block_shape& sh, cuda::stream_ref stream, const stream_query& q, std::uint64_t& id, void*& out)
  {
    auto& m_ = m();
    if (l().routed_as(sh, stream, m_.captures.saw(m_.backend, stream, q.capturing), out)) return false;
    id = q.id;  // not capturing: routed_as refuses a capture it cannot serve
    return true;
  }

  /// id_to_allocate with the capture query and the id asked one after the other.
  [[gnu::noinline]] bool id_to_allocate_asked_apart(const block_shape& sh, cuda::stream_ref stream, std::uint64_t& id, void*& out)
  {
    if (asks_capture() && l().routed(sh, stream, out)) return false;
    try {
      id = m().backend.id_of(stream);
      return true;
    } catch (const std::exception&) {
      // A capture the query did not report (none was asked for, check_capture off) breaks the lookup: say so.
      bool capturing = false;
      try {
        capturing = l().checks_capture() && l().captures(stream);
      } catch (...) {  // not even that: an unknown stream, reported as the lookup's own error
      }
      if (capturing) l().refuse_capture("an allocation asked for its stream");
      throw;
    }
  }

  /// A free on a capturing stream, or while private pools exist: filed in a pool, abandoned, or given its id.
  [[gnu::noinline]] bool in_pools_or_id(void* p, const block_shape& sh, cuda::stream_ref stream, bool capturing, std::uint64_t asked,
                                        std::uint64_t& id) noexcept
  {
    if (l().free_in_pools(p, sh, stream, capturing)) return false;
    if (capturing) return abandoned(sh);  // the graph may use the block whenever it runs
    id = asked;
    return true;
  }

  /// id_to_free with the capture query and the id asked one after the other, each failure handled as its own.
  [[gnu::noinline]] bool id_to_free_asked_apart(void* p, const block_shape& sh, cuda::stream_ref stream, const std::uint64_t* known_id,
                                                std::uint64_t& id) noexcept
  {
    bool capturing = false;
    if (asks_capture()) {
      try {
        capturing = l().captures(stream);
      } catch (...) {
        if (l().capture_possible()) return abandoned(sh);
        // No capture known: an unknown stream, which the id lookup below reports.
      }
    }
    if ((capturing || !m().graphs.pools().empty()) && l().free_in_pools(p, sh, stream, capturing)) return false;
    if (capturing) return abandoned(sh);  // asking the id would break the capture
    if (known_id != nullptr) {
      id = *known_id;
      return true;
    }
    try {
      id = m().backend.id_of(stream);
      return true;
    } catch (...) {
    }
    l().return_unordered(p, sh);  // an unknown stream: nothing to order the reuse by
    return false;
  }

  Layer& l() noexcept { return static_cast<Layer&>(*this); }
  const Layer& l() const noexcept { return static_cast<const Layer&>(*this); }
  auto& m() noexcept { return l().m_; }

  /// Whether a call may skip capture queries and the private pools altogether: no capture is looked for
  /// (check_capture off), announced or seen, and no private pool exists. Then a released graph's pool cannot
  /// exist either, and its id waits for the next call that is not quiet (collecting it changes nothing else).
  bool quiet() const noexcept { return !l().m_.opts.check_capture && !l().capture_possible() && l().m_.graphs.pools().empty(); }

  /// Whether this call asks the capture query: while a capture may be under way, and on every stream with
  /// check_capture (the only way to find a capture nobody announced, identified streams included).
  bool asks_capture() const noexcept { return l().capture_possible() || l().m_.opts.check_capture; }

  bool abandoned(const block_shape& sh) noexcept
  {
    l().abandon(sh);
    return false;
  }
};

} // namespace strata::detail
