// What the CUDA driver's virtual memory management calls cost on this GPU, the figures mapped_pool's design
// rests on: cuMemCreate and cuMemRelease for 2 to 128 MiB, cuMemMap of one page, cuMemSetAccess over runs of
// 1..512 pages, cuMemUnmap of one page and of a run of separately mapped pages in one call (whether the driver
// accepts that), a device synchronize with nothing running, and the sequences mapped_pool makes whole (a new
// mapping, an allocation a reclaim moves, allocations mapped back to back sharing one access call), and
// cudaMalloc and cudaFree of 2 MiB to 1 GiB, what PyTorch's caching allocator pays instead.
//   vmm_costs [--json FILE]
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

void check(CUresult r, const char* what)
{
  if (r != CUDA_SUCCESS) {
    const char* name = nullptr;
    cuGetErrorName(r, &name);
    std::fprintf(stderr, "%s failed: %s\n", what, name ? name : "?");
    std::exit(1);
  }
}

double micros_since(clock_type::time_point t) { return std::chrono::duration<double, std::micro>(clock_type::now() - t).count(); }

double median(std::vector<double> v)
{
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct row {
  std::string what;
  double micros;
};

} // namespace

int main(int argc, char** argv)
{
  std::string json;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--json") json = argv[i + 1];
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("vmm_costs: no GPU, nothing to measure\n");
    return 0;
  }
  cudaSetDevice(0);
  cudaFree(nullptr);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  std::size_t page = 0;
  check(cuMemGetAllocationGranularity(&page, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "granularity");
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  std::vector<row> rows;
  const int pages = 512;
  CUdeviceptr base = 0;
  check(cuMemAddressReserve(&base, pages * page * 2, page, 0, 0), "reserve");

  // Up to mapped_pool's largest mapping (128 MiB): does creating or releasing follow the bytes?
  for (std::size_t mult : {1, 4, 8, 16, 32, 64}) {
    std::vector<double> t, released;
    for (int i = 0; i < 50; ++i) {
      CUmemGenericAllocationHandle h;
      auto s = clock_type::now();
      check(cuMemCreate(&h, mult * page, &prop, 0), "create");
      t.push_back(micros_since(s));
      s = clock_type::now();
      check(cuMemRelease(h), "release");
      released.push_back(micros_since(s));
    }
    rows.push_back({"cuMemCreate " + std::to_string(mult * page >> 20) + " MiB", median(t)});
    rows.push_back({"cuMemRelease " + std::to_string(mult * page >> 20) + " MiB (never mapped)", median(released)});
  }

  std::vector<CUmemGenericAllocationHandle> handles(pages);
  std::vector<double> create_t, map_t, release_t;
  for (auto& h : handles) {
    auto s = clock_type::now();
    check(cuMemCreate(&h, page, &prop, 0), "create");
    create_t.push_back(micros_since(s));
  }
  for (int i = 0; i < pages; ++i) {
    auto s = clock_type::now();
    check(cuMemMap(base + i * page, page, 0, handles[i], 0), "map");
    map_t.push_back(micros_since(s));
  }
  rows.push_back({"cuMemCreate 2 MiB (512 in a row)", median(create_t)});
  rows.push_back({"cuMemMap one page", median(map_t)});
  for (int run : {1, 8, 64, 512}) {
    std::vector<double> t;
    for (int off = 0; off + run <= pages && t.size() < 16; off += run) {
      auto s = clock_type::now();
      check(cuMemSetAccess(base + off * page, run * page, &access, 1), "access");
      t.push_back(micros_since(s));
    }
    rows.push_back({"cuMemSetAccess run of " + std::to_string(run) + " pages", median(t)});
  }
  std::vector<double> unmap_t;
  for (int i = 0; i < 64; ++i) {
    auto s = clock_type::now();
    check(cuMemUnmap(base + i * page, page), "unmap");
    unmap_t.push_back(micros_since(s));
  }
  rows.push_back({"cuMemUnmap one page", median(unmap_t)});
  // A run of separately mapped pages unmapped by one call: accepted or not?
  for (int run : {8, 64}) {
    const int off = run == 8 ? 64 : 128;
    auto s = clock_type::now();
    const CUresult r = cuMemUnmap(base + off * page, run * page);
    const double us = micros_since(s);
    if (r == CUDA_SUCCESS) rows.push_back({"cuMemUnmap run of " + std::to_string(run) + " separately mapped pages (accepted)", us});
    else {
      rows.push_back({"cuMemUnmap run of " + std::to_string(run) + " separately mapped pages REFUSED", us});
      for (int i = 0; i < run; ++i) check(cuMemUnmap(base + (off + i) * page, page), "unmap");
    }
  }
  for (int i = 72; i < 128; ++i) check(cuMemUnmap(base + i * page, page), "unmap");
  for (int i = 192; i < pages; ++i) check(cuMemUnmap(base + i * page, page), "unmap");
  for (auto h : handles) {
    auto s = clock_type::now();
    check(cuMemRelease(h), "release");
    release_t.push_back(micros_since(s));
  }
  rows.push_back({"cuMemRelease 2 MiB", median(release_t)});
  // Whole handles of 2..64 MiB: does a page-run cost follow the bytes or the number of calls?
  for (std::size_t mult : {1, 4, 16, 32}) {
    std::vector<double> map_us, access_us, unmap_us;
    for (int i = 0; i < 8; ++i) {
      CUmemGenericAllocationHandle h;
      check(cuMemCreate(&h, mult * page, &prop, 0), "create");
      auto s = clock_type::now();
      check(cuMemMap(base, mult * page, 0, h, 0), "map");
      map_us.push_back(micros_since(s));
      s = clock_type::now();
      check(cuMemSetAccess(base, mult * page, &access, 1), "access");
      access_us.push_back(micros_since(s));
      s = clock_type::now();
      check(cuMemUnmap(base, mult * page), "unmap");
      unmap_us.push_back(micros_since(s));
      check(cuMemRelease(h), "release");
    }
    const std::string size = std::to_string(mult * page >> 20) + " MiB handle";
    rows.push_back({"cuMemMap whole " + size, median(map_us)});
    rows.push_back({"cuMemSetAccess whole " + size, median(access_us)});
    rows.push_back({"cuMemUnmap whole " + size, median(unmap_us)});
  }
  // One 2 MiB piece of a 32 MiB handle (mapping at an offset).
  {
    CUmemGenericAllocationHandle h;
    check(cuMemCreate(&h, 16 * page, &prop, 0), "create");
    std::vector<double> map_us, access_us, unmap_us;
    for (int i = 0; i < 16; ++i) {
      auto s = clock_type::now();
      if (cuMemMap(base + i * page, page, i * page, h, 0) != CUDA_SUCCESS) {
        rows.push_back({"cuMemMap of a 2 MiB piece at an offset of a larger handle REFUSED", micros_since(s)});
        for (int j = 0; j < i; ++j) check(cuMemUnmap(base + j * page, page), "unmap piece");
        access_us.clear();
        break;
      }
      map_us.push_back(micros_since(s));
      s = clock_type::now();
      check(cuMemSetAccess(base + i * page, page, &access, 1), "access piece");
      access_us.push_back(micros_since(s));
    }
    for (int i = 0; i < 16 && !access_us.empty(); ++i) {
      auto s = clock_type::now();
      check(cuMemUnmap(base + i * page, page), "unmap piece");
      unmap_us.push_back(micros_since(s));
    }
    check(cuMemRelease(h), "release");
    if (!access_us.empty()) {
      rows.push_back({"cuMemMap 2 MiB piece of a 32 MiB handle", median(map_us)});
      rows.push_back({"cuMemSetAccess 2 MiB piece of a 32 MiB handle", median(access_us)});
      rows.push_back({"cuMemUnmap 2 MiB piece of a 32 MiB handle", median(unmap_us)});
    }
  }
  // The sequences mapped_pool makes, whole: a new mapping (create, map, access), an idle allocation moved
  // by a reclaim (device wait, unmap, map elsewhere, access), and four allocations mapped back to back with
  // one access call for all of them.
  {
    std::vector<double> grow_us, move_us, four_us;
    for (int i = 0; i < 16; ++i) {
      CUmemGenericAllocationHandle h;
      auto s = clock_type::now();
      check(cuMemCreate(&h, 4 * page, &prop, 0), "create");
      check(cuMemMap(base, 4 * page, 0, h, 0), "map");
      check(cuMemSetAccess(base, 4 * page, &access, 1), "access");
      grow_us.push_back(micros_since(s));
      s = clock_type::now();
      cudaDeviceSynchronize();
      check(cuMemUnmap(base, 4 * page), "unmap");
      check(cuMemMap(base + 8 * page, 4 * page, 0, h, 0), "map");
      check(cuMemSetAccess(base + 8 * page, 4 * page, &access, 1), "access");
      move_us.push_back(micros_since(s));
      check(cuMemUnmap(base + 8 * page, 4 * page), "unmap");
      check(cuMemRelease(h), "release");
      std::array<CUmemGenericAllocationHandle, 4> four{};
      s = clock_type::now();
      for (std::size_t k = 0; k < four.size(); ++k) {
        check(cuMemCreate(&four[k], page, &prop, 0), "create");
        check(cuMemMap(base + k * page, page, 0, four[k], 0), "map");
      }
      check(cuMemSetAccess(base, four.size() * page, &access, 1), "access over four");
      four_us.push_back(micros_since(s));
      for (std::size_t k = 0; k < four.size(); ++k) {
        check(cuMemUnmap(base + k * page, page), "unmap");
        check(cuMemRelease(four[k]), "release");
      }
    }
    rows.push_back({"new 8 MiB mapping: create, map, access", median(grow_us)});
    rows.push_back({"8 MiB allocation moved: synchronize, unmap, map, access", median(move_us)});
    rows.push_back({"four 2 MiB allocations back to back, one access call", median(four_us)});
  }
  std::vector<double> sync_t;
  for (int i = 0; i < 100; ++i) {
    auto s = clock_type::now();
    cudaDeviceSynchronize();
    sync_t.push_back(micros_since(s));
  }
  rows.push_back({"cudaDeviceSynchronize, idle device", median(sync_t)});
  // What PyTorch's caching allocator pays per segment it takes from the device and gives back, the price
  // bench/driver_time.py sets against the page calls above.
  for (std::size_t mib : {2, 20, 128, 1024}) {
    std::vector<double> malloc_t, free_t;
    for (int i = 0; i < 30; ++i) {
      void* p = nullptr;
      auto s = clock_type::now();
      if (cudaMalloc(&p, mib << 20) != cudaSuccess) break;
      malloc_t.push_back(micros_since(s));
      s = clock_type::now();
      cudaFree(p);
      free_t.push_back(micros_since(s));
    }
    rows.push_back({"cudaMalloc " + std::to_string(mib) + " MiB", median(malloc_t)});
    rows.push_back({"cudaFree " + std::to_string(mib) + " MiB, idle device", median(free_t)});
  }
  check(cuMemAddressFree(base, pages * page * 2), "free");

  cudaDeviceProp dp{};
  cudaGetDeviceProperties(&dp, 0);
  std::printf("vmm_costs on %s (granularity %zu bytes), median microseconds:\n", dp.name, page);
  for (const auto& r : rows) std::printf("  %-60s %9.2f\n", r.what.c_str(), r.micros);
  if (!json.empty()) {
    std::ofstream out(json);
    out << "{\"device\":\"" << dp.name << "\",\"granularity\":" << page << ",\"rows\":[";
    for (std::size_t i = 0; i < rows.size(); ++i)
      out << (i ? "," : "") << "{\"what\":\"" << rows[i].what << "\",\"us\":" << rows[i].micros << "}";
    out << "]}\n";
  }
  return 0;
}
