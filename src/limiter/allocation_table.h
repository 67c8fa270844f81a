// AllocationTable: what this process holds against its vGPU's VRAM quota, keyed by the handle a
// later free names (device pointer, VMM handle, array, mipmapped array, graph node), so a free
// returns exactly what its allocation charged.
//
// Thread safety: all methods take one process-local mutex; they run on allocation paths only,
// never on the launch path. Sizes are bytes already rounded to the charge granule.
#pragma once

#include <pthread.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace tf::limiter {

// kGraphPtr: a stream-ordered allocation made while its stream captured a graph (a graph memory
// node the driver owns), keyed by its pointer like kDevicePtr.
enum class AllocKind : uint8_t { kDevicePtr, kVmmHandle, kArray, kMipmappedArray, kGraphNode, kGraphPtr };
inline constexpr int kAllocKinds = 6;

class AllocationTable {
 public:
  static AllocationTable& Instance();

  void Insert(AllocKind kind, uint64_t key, uint64_t charge);
  // Removes the entry and returns its charge; 0 when unknown (not ours, or allocated before the
  // process was bound).
  uint64_t Erase(AllocKind kind, uint64_t key);
  // Graph memory nodes also belong to their graph: destroying the graph releases them all.
  void AttachToGraph(uint64_t graph, uint64_t node);
  // Removes every node of the graph and returns the sum of their charges.
  uint64_t EraseGraph(uint64_t graph);
  // Bytes charged now for objects of `kind` (what VRAM tiering reports per kind).
  uint64_t Bytes(AllocKind kind);
  // A forked child starts with nothing: the parent's allocations are the parent's.
  void ResetAfterFork();

 private:
  static uint64_t Key(AllocKind kind, uint64_t key) {
    return (key * 0x9E3779B97F4A7C15ull) ^ static_cast<uint64_t>(kind);
  }
  struct Entry {
    AllocKind kind;
    uint64_t key;
    uint64_t charge;
  };
  pthread_mutex_t mu_ = PTHREAD_MUTEX_INITIALIZER;
  std::unordered_multimap<uint64_t, Entry> entries_;
  std::unordered_map<uint64_t, std::vector<uint64_t>> graph_nodes_;
  uint64_t bytes_[kAllocKinds] = {};
};

}  // namespace tf::limiter
