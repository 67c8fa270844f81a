#include "limiter/allocation_table.h"

namespace tf::limiter {

AllocationTable& AllocationTable::Instance() {
  static AllocationTable* table = new AllocationTable();  // never destroyed: used until exit
  return *table;
}

void AllocationTable::Insert(AllocKind kind, uint64_t key, uint64_t charge) {
  pthread_mutex_lock(&mu_);
  entries_.emplace(Key(kind, key), Entry{kind, key, charge});
  bytes_[static_cast<int>(kind)] += charge;
  pthread_mutex_unlock(&mu_);
}

uint64_t AllocationTable::Erase(AllocKind kind, uint64_t key) {
  uint64_t charge = 0;
  pthread_mutex_lock(&mu_);
  auto range = entries_.equal_range(Key(kind, key));
  for (auto it = range.first; it != range.second; ++it) {
    if (it->second.kind == kind && it->second.key == key) {
      charge = it->second.charge;
      bytes_[static_cast<int>(kind)] -= charge;
      entries_.erase(it);
      break;
    }
  }
  pthread_mutex_unlock(&mu_);
  return charge;
}

void AllocationTable::AttachToGraph(uint64_t graph, uint64_t node) {
  pthread_mutex_lock(&mu_);
  graph_nodes_[graph].push_back(node);
  pthread_mutex_unlock(&mu_);
}

uint64_t AllocationTable::EraseGraph(uint64_t graph) {
  std::vector<uint64_t> nodes;
  pthread_mutex_lock(&mu_);
  auto it = graph_nodes_.find(graph);
  if (it != graph_nodes_.end()) {
    nodes.swap(it->second);
    graph_nodes_.erase(it);
  }
  pthread_mutex_unlock(&mu_);
  uint64_t total = 0;
  for (uint64_t n : nodes) total += Erase(AllocKind::kGraphNode, n);
  return total;
}

uint64_t AllocationTable::Bytes(AllocKind kind) {
  pthread_mutex_lock(&mu_);
  const uint64_t bytes = bytes_[static_cast<int>(kind)];
  pthread_mutex_unlock(&mu_);
  return bytes;
}

void AllocationTable::ResetAfterFork() {
  // The mutex may have been held by a parent thread at fork time: re-create it.
  pthread_mutex_init(&mu_, nullptr);
  entries_.clear();
  graph_nodes_.clear();
  for (uint64_t& b : bytes_) b = 0;
}

}  // namespace tf::limiter
