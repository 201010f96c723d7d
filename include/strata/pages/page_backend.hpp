#pragma once
// What mapped_pool needs from a machine that maps physical pages into reserved address ranges: the
// page_backend and copying_page_backend concepts and page_counters, for a backend's author. They are
// defined with the pool's machinery (detail/pages/page_backend.hpp), whose parts name them below the public
// layers.
#include <strata/detail/pages/page_backend.hpp>
