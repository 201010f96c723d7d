// The fuzzer's stacks: every policy bare and under every single adaptor.
#include "fuzz/stack_makers.hpp"

namespace strata::testing::stacks {
namespace {

template <class P>
bool add_policy_with_adaptors(const std::string& name)
{
  const auto p = leaf<P>();
  using In = P;
  add((name).c_str(), p);
  add(("limit<" + name + ">").c_str(), wrap<limit<In>>(p));
  add(("statistics<" + name + ">").c_str(), wrap<statistics<In>>(p));
  add(("tracking<" + name + ">").c_str(), wrap<tracking<In>>(p));
  add(("recorder<" + name + ">").c_str(), wrap<recorder<In>>(p));
  add(("checked<" + name + ">").c_str(), wrap<checked<In>>(p));
  add(("retry_on_oom<" + name + ">").c_str(), wrap<retry_on_oom<In>>(p));
  add(("synchronized<" + name + ">").c_str(), wrap<synchronized<In>>(p));
  add(("thread_cached<" + name + ">").c_str(), wrap<thread_cached<In>>(p));
  add(("stream_ordered<" + name + ">").c_str(), wrap<so<In>>(p));
  add(("stream_ordered<" + name + ">{check_capture=false}").c_str(), so_unchecked_of(p));  // the lone owner's short path
  add(("stream_ordered<" + name + ">{reuse_recent_frees, check_capture=false}").c_str(), so_recent_of(p, false));
  return true;
}

const bool registered = add_policy_with_adaptors<arena_t>("arena") && add_policy_with_adaptors<size_class_t>("size_class_pool") &&
                        add_policy_with_adaptors<buddy_t>("buddy_pool") && add_policy_with_adaptors<coalescing_t>("coalescing_pool") &&
                        add_policy_with_adaptors<mapped_t>("mapped_pool");

} // namespace
} // namespace strata::testing::stacks
