// What a default_pool allocate+free pair costs on one stream in each configuration of its stream layer, next to
// the driver queries that layer may make per call and the bare policy: how the stream is named (identified,
// a plain handle, the legacy default stream), whether every call looks for captures nobody announced
// (check_capture), and whether the stream's recent frees are kept for its next allocations (reuse_recent_frees).
// Medians of 5 timed loops, ns per call or pair.
//   pair_configs [--json FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <strata/default_pool.hpp>
#include "bench_common.hpp"

namespace {

std::string size_label(std::size_t bytes)
{
  if (bytes >= (std::size_t{1} << 30)) return std::to_string(bytes >> 30) + " GiB";
  if (bytes >= (std::size_t{1} << 20)) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes) + " B";
}

template <class F>
double median_ns(F&& f, int n)
{
  for (int i = 0; i < n / 10; ++i) f();
  std::vector<double> runs;
  for (int k = 0; k < 5; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) f();
    runs.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / n);
  }
  std::sort(runs.begin(), runs.end());
  return runs[2];
}

struct row {
  std::string name;
  double ns;
};

void driver_queries(cudaStream_t s, std::vector<row>& out)
{
  const auto is_capturing = strata::detail::driver_is_capturing();
  const auto stream_id = strata::detail::driver_stream_id();
  const auto context = strata::detail::driver_current_context();
  int status = 0;
  unsigned long long id = 0;
  void* ctx = nullptr;
  const int n = 1'000'000;
  out.push_back({"cuStreamIsCapturing (created stream)", median_ns([&] { is_capturing(s, &status); }, n)});
  out.push_back({"cuStreamIsCapturing (legacy stream)", median_ns([&] { is_capturing(cudaStreamLegacy, &status); }, n)});
  out.push_back({"cuStreamGetId (created stream)", median_ns([&] { stream_id(s, &id); }, n)});
  out.push_back({"cuStreamGetId (legacy stream)", median_ns([&] { stream_id(cudaStreamLegacy, &id); }, n)});
  out.push_back({"cuCtxGetCurrent", median_ns([&] { context(&ctx); }, n)});
}

void pairs(cudaStream_t s, std::vector<row>& out)
{
  const std::size_t sizes[] = {256, std::size_t{16} << 20, std::size_t{256} << 20, std::size_t{1} << 30};
  for (const std::size_t bytes : sizes) {
    strata::mapped_pool<strata::driver_pages> bare;
    out.push_back({"mapped_pool alone, " + size_label(bytes),
                   median_ns([&] { bare.deallocate(bare.allocate(bytes), bytes); }, 500'000)});
  }
  const strata::identified_stream identified = strata::identify(cuda::stream_ref{s});
  for (const bool recent : {false, true})
    for (const bool check : {true, false})
      for (const std::size_t bytes : sizes) {
        const std::string config = std::string(recent ? "recent frees kept" : "recent frees merged") +
                                   (check ? ", captures looked for" : ", captures announced") + ", " +
                                   size_label(bytes);
        auto run = [&](const char* how, auto stream) {
          strata::default_pool_options o;
          o.stream.check_capture = check;
          o.stream.reuse_recent_frees = recent;
          strata::default_pool pool = strata::make_default_pool(o);
          out.push_back({std::string("default_pool, ") + how + ", " + config,
                         median_ns([&] { pool.deallocate_async(pool.allocate_async(bytes, 256, stream), bytes, 256, stream); }, 500'000)});
        };
        run("identified stream", identified);
        run("stream handle", cuda::stream_ref{s});
        run("legacy stream", cuda::stream_ref{cudaStreamLegacy});
      }
}

} // namespace

int main(int argc, char** argv)
{
  const std::string json = strata::bench::option(argc, argv, "--json");
  if (!strata::bench::gpu_present("pair_configs")) return 0;
  cudaDeviceProp prop{};
  strata::bench::check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  cudaStream_t s = nullptr;
  strata::bench::check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  std::vector<row> rows;
  driver_queries(s, rows);
  pairs(s, rows);
  std::printf("\ndefault_pool pairs by stream-layer configuration on %s (ns per call or pair, median of 5)\n",
              prop.name);
  for (const row& r : rows) std::printf("%-100s %9.1f\n", r.name.c_str(), r.ns);
  if (!json.empty()) {
    std::ofstream f(json);
    f << "[";
    for (std::size_t i = 0; i < rows.size(); ++i) f << (i ? "," : "") << "{\"name\":\"" << rows[i].name << "\",\"ns\":" << rows[i].ns << "}";
    f << "]\n";
  }
  strata::bench::check(cudaStreamDestroy(s), "cudaStreamDestroy");
  return 0;
}
