// rt_oom: cudaMalloc in 64 MiB chunks until refused or MAX_BYTES, through the static cudart.
// With a limit the total must stay within limit + 2 MiB, the error must be
// cudaErrorMemoryAllocation, and freeing one chunk must make room for another.
//
//   rt_oom LIMIT_BYTES(0: native) MAX_BYTES
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: rt_oom LIMIT_BYTES MAX_BYTES\n");
    return 2;
  }
  const unsigned long long limit = std::strtoull(argv[1], nullptr, 10);
  const unsigned long long cap = std::strtoull(argv[2], nullptr, 10);
  constexpr unsigned long long kChunk = 64ull << 20;
  constexpr unsigned long long kGranule = 2ull << 20;
  std::vector<void*> chunks;
  unsigned long long total = 0;
  cudaError_t error = cudaSuccess;
  while (total + kChunk <= cap) {
    void* p = nullptr;
    error = cudaMalloc(&p, kChunk);
    if (error != cudaSuccess) break;
    chunks.push_back(p);
    total += kChunk;
  }
  cudaGetLastError();  // clear the non-sticky allocation error
  std::printf("RESULT total_bytes=%llu\nRESULT total_mib=%llu\n", total, total >> 20);
  std::printf("RESULT error=%s\nRESULT error_code=%d\n", cudaGetErrorName(error), static_cast<int>(error));
  bool realloc_ok = false;
  if (!chunks.empty()) {
    cudaFree(chunks.back());
    chunks.pop_back();
    void* p = nullptr;
    realloc_ok = cudaMalloc(&p, kChunk) == cudaSuccess;
    if (realloc_ok) chunks.push_back(p);
  }
  std::printf("RESULT realloc=%s\n", realloc_ok ? "ok" : "failed");
  for (void* p : chunks) cudaFree(p);
  const char* why = nullptr;
  if (!realloc_ok) why = "realloc_after_free_failed";
  if (limit == 0) {
    if (error != cudaSuccess && error != cudaErrorMemoryAllocation) why = "unexpected_error";
  } else {
    if (error != cudaErrorMemoryAllocation) why = "not_refused_with_memory_allocation";
    if (total > limit + kGranule) why = "exceeded_limit";
    if (total < limit / 2) why = "less_than_half_the_limit";
  }
  if (why != nullptr) std::printf("RESULT reason=%s\n", why);
  std::printf("RESULT verdict=%s\n", why == nullptr ? "PASS" : "FAIL");
  return why == nullptr ? 0 : 1;
}
