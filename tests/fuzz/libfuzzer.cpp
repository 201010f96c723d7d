// libFuzzer's entry point (clang -fsanitize=fuzzer): the input's first two bytes pick the stack, the rest
// drive every choice of the fuzzer's engine. A violation aborts, so libFuzzer keeps the input that found it.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

#include "fuzz/stack_fuzzer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size)
{
  using namespace strata::testing;
  if (size < 3) return 0;
  const auto& targets = fuzz_targets();
  const fuzz_target& t = targets[(std::size_t{data[0]} << 8 | data[1]) % targets.size()];
  const fuzz_report r = t.run({.input = std::span(data + 2, size - 2)});
  if (!r.ok()) {
    std::fprintf(stderr, "%s\n", r.summary().c_str());
    std::abort();
  }
  return 0;
}
