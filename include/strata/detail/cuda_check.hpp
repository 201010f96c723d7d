#pragma once
// The CUDA error checks and the scoped device live in core/ (the devices and peer-access helpers there need
// them); this name stays for the headers that include it.
#include <strata/core/cuda_check.hpp>
