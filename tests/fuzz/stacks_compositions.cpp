// The fuzzer's stacks: compositions of two and three boxes — routers over policies, stream_ordered inside and
// outside adaptors, per-thread caches, retries — the ways programs combine strata's boxes.
#include "fuzz/stack_makers.hpp"

namespace strata::testing::stacks {
namespace {

const auto arena_ = leaf<arena_t>();
const auto size_class = leaf<size_class_t>();
const auto buddy = leaf<buddy_t>();
const auto coalescing = leaf<coalescing_t>();
const auto mapped = leaf<mapped_t>();
/// mapped_pool mapping a tenth of what it holds ahead whenever it grows past its high-water mark.
const auto mapped_growing = [](fuzz_world& w) {
  return mapped_t(simulated_pages(std::size_t{2} << 20, w.upstream.capacity()),
                  mapped_t::options{.address_space = std::size_t{1} << 36, .growth_ahead_fraction = 0.1});
};

template <class Make>
auto so_of(Make m)
{
  return wrap<so<decltype(m(std::declval<fuzz_world&>()))>>(m);
}
template <template <class> class Box, class Make>
auto box(Make m)
{
  return wrap<Box<decltype(m(std::declval<fuzz_world&>()))>>(m);
}

const bool registered = [] {
  add("fallback<limit<arena>, coalescing_pool>", pair<fallback>(box<limit>(arena_), coalescing));
  add("fallback<buddy_pool, coalescing_pool>", pair<fallback>(buddy, coalescing));
  add("fallback<size_class_pool, buddy_pool>", pair<fallback>(size_class, buddy));
  add("fallback<limit<coalescing_pool>, mapped_pool>", pair<fallback>(box<limit>(coalescing), mapped));
  add("segregator<4096, size_class_pool, coalescing_pool>", split_at<4096>(size_class, coalescing));
  add("segregator<1 MiB, buddy_pool, mapped_pool>", split_at<(1 << 20)>(buddy, mapped));
  add("segregator<4096, stream_ordered<size_class_pool>, stream_ordered<coalescing_pool>>", split_at<4096>(so_of(size_class), so_of(coalescing)));
  add("stream_ordered<stream_ordered<coalescing_pool>>", so_of(so_of(coalescing)));
  add("statistics<stream_ordered<size_class_pool>{check_capture=false}>", box<statistics>(so_unchecked_of(size_class)));
  add("stream_ordered<mapped_pool>{reuse_recent_frees}", so_recent_of(mapped, true));
  add("stream_ordered<mapped_pool{growth_ahead_fraction=0.1}>", so_of(mapped_growing));
  add("checked<stream_ordered<coalescing_pool>{reuse_recent_frees, check_capture=false}>", box<checked>(so_recent_of(coalescing, false)));
  add("statistics<stream_ordered<size_class_pool>{reuse_recent_frees}>", box<statistics>(so_recent_of(size_class, true)));
  add("checked<stream_ordered<coalescing_pool>>", box<checked>(so_of(coalescing)));
  add("checked<stream_ordered<mapped_pool>>", box<checked>(so_of(mapped)));
  add("thread_cached<stream_ordered<coalescing_pool>>", box<thread_cached>(so_of(coalescing)));
  add("stream_ordered<thread_cached<coalescing_pool>>", so_of(box<thread_cached>(coalescing)));
  add("stream_ordered<limit<coalescing_pool>>", so_of(box<limit>(coalescing)));
  add("limit<stream_ordered<coalescing_pool>>", box<limit>(so_of(coalescing)));
  add("statistics<stream_ordered<mapped_pool>>", box<statistics>(so_of(mapped)));
  add("synchronized<stream_ordered<buddy_pool>>", box<synchronized>(so_of(buddy)));
  add("tracking<stream_ordered<size_class_pool>>", box<tracking>(so_of(size_class)));
  add("retry_on_oom<limit<coalescing_pool>>", box<retry_on_oom>(box<limit>(coalescing)));
  add("retry_on_oom<stream_ordered<coalescing_pool>>", box<retry_on_oom>(so_of(coalescing)));
  add("retry_on_oom<limit<stream_ordered<coalescing_pool>>>", box<retry_on_oom>(box<limit>(so_of(coalescing))));
  add("retry_on_oom<thread_cached<size_class_pool>>", box<retry_on_oom>(box<thread_cached>(size_class)));
  add("synchronized<thread_cached<coalescing_pool>>", box<synchronized>(box<thread_cached>(coalescing)));
  add("thread_cached<synchronized<coalescing_pool>>", box<thread_cached>(box<synchronized>(coalescing)));
  add("statistics<limit<buddy_pool>>", box<statistics>(box<limit>(buddy)));
  add("limit<fallback<arena, coalescing_pool>>", box<limit>(pair<fallback>(arena_, coalescing)));
  add("fallback<stream_ordered<buddy_pool>, stream_ordered<coalescing_pool>>", pair<fallback>(so_of(buddy), so_of(coalescing)));
  add("segregator<4096, thread_cached<size_class_pool>, limit<coalescing_pool>>", split_at<4096>(box<thread_cached>(size_class), box<limit>(coalescing)));
  add("checked<thread_cached<stream_ordered<coalescing_pool>>>", box<checked>(box<thread_cached>(so_of(coalescing))));
  add("stream_ordered<segregator<4096, size_class_pool, coalescing_pool>>", so_of(split_at<4096>(size_class, coalescing)));
  add("statistics<retry_on_oom<fallback<buddy_pool, mapped_pool>>>", box<statistics>(box<retry_on_oom>(pair<fallback>(buddy, mapped))));
  add("per_device<coalescing_pool>", [](fuzz_world& w) { return per_device_t(coalescing_per_device{&w.upstream}, simulated_devices::backend(w.devices)); });
  return true;
}();

} // namespace
} // namespace strata::testing::stacks
