// One ChunkAllocator per device-memory allocation path of the driver API. The VRAM tests
// allocate through one path in fixed chunks until the driver (or the limiter) refuses, so
// that every path the limiter must account is exercised the same way.
#ifndef TF_TESTS_GPU_CHUNK_ALLOCATORS_H_
#define TF_TESTS_GPU_CHUNK_ALLOCATORS_H_

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tf::gpu {

// Not thread-safe; one per test. Requires a current context for the device given at creation.
class ChunkAllocator {
 public:
  virtual ~ChunkAllocator() = default;

  // Allocates one chunk of about `bytes` (arrays round to their shapes). On success adds the
  // bytes really requested from the driver to *granted; on failure names the call that failed.
  virtual CUresult AllocOne(uint64_t bytes, uint64_t* granted, std::string* failed_call) = 0;
  // Frees the most recent chunk; returns its size in *released.
  virtual CUresult FreeLast(uint64_t* released) = 0;
  // Frees everything and gives cached memory back to the driver (pools, graph memory).
  virtual void FreeAll() = 0;
  virtual size_t count() const = 0;
};

// Paths: mem_alloc, pitch, async, pool_async, vmm, managed, array2d, array3d, mipmap, graph.
// Returns nullptr for an unknown name.
std::unique_ptr<ChunkAllocator> MakeChunkAllocator(const std::string& path, CUdevice device);
const std::vector<std::string>& ChunkAllocatorPaths();

}  // namespace tf::gpu

#endif  // TF_TESTS_GPU_CHUNK_ALLOCATORS_H_
