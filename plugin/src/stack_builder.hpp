#pragma once
// From the configuration to one device's stack: which stack (stack=), its caps (limit=), its peers, its
// stream layer's options and whether it records a trace (record=).
#include <cstddef>
#include <cstdint>
#include <memory>

#include <strata/stream/simulated_streams.hpp>

#include "alloc_conf.hpp"
#include "device_stack.hpp"

namespace strata::plugin {

/// A device's stack as built, with what the plug-in keeps beside it.
struct built_stack {
  std::unique_ptr<device_stack> stack;
  bool simulated = false;
  void* context = nullptr;          ///< the device's primary context (a real stack's), current when it was built
  std::size_t cap = SIZE_MAX;       ///< bytes the stack may hold from CUDA (limit=), so in use too
  std::size_t device_memory = 0;    ///< the device's total memory (sim_capacity for stack=simulated)
};

/// Builds `device`'s stack as `c` says. stack=simulated runs over `*world`, the simulated devices' one pretend
/// GPU (the caller holds its lock; unused by the other stacks); the others need a CUDA device, asked about with
/// a few runtime calls. Throws what refused it (no such device, no CUDA, a trace file that cannot be opened).
built_stack build_stack(const alloc_conf& c, int device, simulated_streams* world);

} // namespace strata::plugin
