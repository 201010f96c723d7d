#pragma once
// Umbrella header: everything strata has.
#include <strata/core/alignment.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/devices.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/properties.hpp>
#include <strata/core/ref.hpp>
#include <strata/core/snapshot.hpp>
#include <strata/core/tags.hpp>
#include <strata/core/usage.hpp>

#include <strata/source/async_source.hpp>
#include <strata/source/device_source.hpp>
#include <strata/source/host_source.hpp>
#include <strata/source/managed_source.hpp>
#include <strata/source/pinned_source.hpp>
#include <strata/source/pinning_source.hpp>
#include <strata/source/registered_host_source.hpp>
#include <strata/source/simulated_devices.hpp>
#include <strata/source/simulated_source.hpp>

#include <strata/pages/driver_pages.hpp>
#include <strata/pages/page_backend.hpp>
#include <strata/pages/simulated_pages.hpp>

#include <strata/pinned/host_pinning.hpp>
#include <strata/pinned/pinned_host_pool.hpp>
#include <strata/pinned/pinning_backend.hpp>
#include <strata/pinned/simulated_pinning.hpp>

#include <strata/policy/arena.hpp>
#include <strata/policy/buddy_pool.hpp>
#include <strata/policy/coalescing_pool.hpp>
#include <strata/policy/mapped_pool.hpp>
#include <strata/policy/size_class_pool.hpp>

#include <strata/stream/cuda_events.hpp>
#include <strata/stream/identified_stream.hpp>
#include <strata/stream/simulated_streams.hpp>
#include <strata/stream/stream_ordered.hpp>

#include <strata/adaptor/checked.hpp>
#include <strata/adaptor/fallback.hpp>
#include <strata/adaptor/limit.hpp>
#include <strata/adaptor/per_device.hpp>
#include <strata/adaptor/prefetch.hpp>
#include <strata/adaptor/recorder.hpp>
#include <strata/adaptor/retry_on_oom.hpp>
#include <strata/adaptor/segregator.hpp>
#include <strata/adaptor/statistics.hpp>
#include <strata/adaptor/synchronized.hpp>
#include <strata/adaptor/thread_cached.hpp>
#include <strata/adaptor/tracking.hpp>

#include <strata/default_pool.hpp>

#include <strata/ipc/block_handle.hpp>
#include <strata/ipc/export_block.hpp>
#include <strata/ipc/fd_passing.hpp>
#include <strata/ipc/imported_block.hpp>

#include <strata/interop/any_resource.hpp>
#include <strata/interop/pmr_adaptor.hpp>
// Thrust interop (thrust_allocator, thrust_temp_allocator, thrust_resource) is included on its own: it pulls in Thrust.
