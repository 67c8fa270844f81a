// Compiled for another architecture by the region_layout_aarch64 test (tests/limiter/CMakeLists.txt):
// region_layout.h's static_asserts pin every offset of docs/shm-layout.md, so this compiling means
// the region is byte-for-byte the same layout there.
#include "src/limiter/core/region_layout.h"

static_assert(sizeof(void*) == 8, "the region is laid out for 64-bit processes");
