// The session's handle table (session_handles.h): the identity, one set per kind.
#include "worker/session_handles.h"

namespace tf::worker {
namespace {
int Index(HandleKind k) {
  const int i = static_cast<int>(k);
  return i > 0 && i < kHandleKinds ? i : 0;
}
}  // namespace

uint64_t HandleTable::Publish(HandleKind k, uint64_t real) {
  if (real != 0 && Index(k) != 0) live_[Index(k)].insert(real);
  return real;
}

bool HandleTable::Resolve(HandleKind k, uint64_t wire, uint64_t* real) const {
  if (wire == 0 || Index(k) == 0 || live_[Index(k)].count(wire) == 0) return false;
  *real = wire;
  return true;
}

bool HandleTable::Retire(HandleKind k, uint64_t wire) {
  return Index(k) != 0 && live_[Index(k)].erase(wire) != 0;
}

bool HandleTable::WireOf(HandleKind k, uint64_t real, uint64_t* wire) const {
  if (real == 0 || Index(k) == 0 || live_[Index(k)].count(real) == 0) return false;
  *wire = real;
  return true;
}

}  // namespace tf::worker
