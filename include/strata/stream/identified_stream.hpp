#pragma once
// Telling streams apart costs a driver call (cuStreamGetId, about 25 ns on an H200 host; the runtime's
// cudaStreamGetId about 60-85 ns), as much as a whole cached allocate+free in stream_ordered. A stream created
// once and used for many allocations can carry its id.
#include <cstdint>

#include <strata/core/config.hpp>
#include <strata/detail/cuda_check.hpp>

namespace strata {

/// A stream with the id that tells it apart from every other stream, looked up once. Valid while the stream
/// lives (the same contract as its handle). stream_ordered's overloads taking it make no CUDA call on a hit.
class identified_stream {
public:
  identified_stream(cuda::stream_ref stream, std::uint64_t id) noexcept : stream_(stream), id_(id) {}

  cuda::stream_ref stream() const noexcept { return stream_; }
  std::uint64_t id() const noexcept { return id_; }
  operator cuda::stream_ref() const noexcept { return stream_; }

private:
  cuda::stream_ref stream_;
  std::uint64_t id_;
};

namespace detail {

/// The driver's cuStreamGetId, reached through the runtime's entry-point table (no link to libcuda): it skips
/// the runtime's own layer, about half the cost of cudaStreamGetId. Null where the driver lacks it.
using stream_id_fn = int (*)(cudaStream_t, unsigned long long*);
inline stream_id_fn driver_stream_id() noexcept
{
  static const stream_id_fn fn = [] {
    void* symbol = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuStreamGetId", &symbol, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      clear_last_error();
      return stream_id_fn{nullptr};
    }
    return reinterpret_cast<stream_id_fn>(symbol);
  }();
  return fn;
}

} // namespace detail

/// The id of a real CUDA stream. Handle 0 goes to cudaStreamGetId, which resolves it as this translation unit
/// was compiled (legacy or per-thread default stream); other handles, including cudaStreamLegacy and
/// cudaStreamPerThread, to the driver directly, falling back to the runtime if the driver refuses.
inline identified_stream identify(cuda::stream_ref stream)
{
  unsigned long long id = 0;
  if (stream.get() != nullptr) {
    if (const auto driver = detail::driver_stream_id(); driver != nullptr && driver(stream.get(), &id) == 0) return {stream, id};
  }
  detail::cuda_check(cudaStreamGetId(stream.get(), &id), "cudaStreamGetId");
  return {stream, id};
}

} // namespace strata
