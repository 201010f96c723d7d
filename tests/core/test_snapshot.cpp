// core/snapshot.hpp: a snapshot written as JSON.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <type_traits>

#include <strata/core/alignment.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/properties.hpp>
#include <strata/core/ref.hpp>
#include <strata/core/snapshot.hpp>
#include <strata/core/usage.hpp>
#include <strata/detail/cuda_check.hpp>
#include <strata/source/host_source.hpp>
#include <strata/source/simulated_source.hpp>

TEST_CASE("snapshot writes JSON")
{
  strata::snapshot s{.box = "pool \"a\"", .segments = {{.address = 4096, .size = 1024, .blocks = {{0, 512, false, -1}, {512, 512, true, 3}}, .mapped = {}}}};
  CHECK(s.reserved() == 1024);
  CHECK(strata::to_json(s) ==
        R"({"box":"pool \"a\"","segments":[{"address":4096,"size":1024,"blocks":[{"offset":0,"size":512,"free":false,"stream":-1},{"offset":512,"size":512,"free":true,"stream":3}]}]})");
}

TEST_CASE("snapshot JSON lists a page-mapped segment's mapped ranges, and only where it has them")
{
  strata::snapshot s{.box = "mapped_pool",
                     .segments = {{.address = std::uintptr_t{1} << 30, .size = 8 << 20, .blocks = {{0, 3 << 20, false, -1}}, .mapped = {{0, 2 << 20}, {2 << 20, 2 << 20}}},
                                  {.address = std::uintptr_t{2} << 30, .size = 4 << 20, .blocks = {}, .mapped = {}}}};
  CHECK(strata::to_json(s) ==
        R"({"box":"mapped_pool","segments":[{"address":1073741824,"size":8388608,"blocks":[{"offset":0,"size":3145728,"free":false,"stream":-1}],"mapped":[{"offset":0,"size":2097152},{"offset":2097152,"size":2097152}]},{"address":2147483648,"size":4194304,"blocks":[]}]})");
}
