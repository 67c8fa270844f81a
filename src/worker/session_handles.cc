#include "worker/session_handles.h"

#include <sys/random.h>
#include <time.h>
#include <unistd.h>

namespace tf::worker {

namespace {

uint64_t RandomSalt() {
  uint64_t v = 0;
  if (getrandom(&v, sizeof(v), GRND_NONBLOCK) == static_cast<ssize_t>(sizeof(v))) return v;
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (static_cast<uint64_t>(ts.tv_nsec) << 20) ^ static_cast<uint64_t>(ts.tv_sec) ^
         (static_cast<uint64_t>(getpid()) << 40);
}

// Successive generations of one slot step the check by an odd constant: 2^32 distinct checks.
constexpr uint32_t kGenerationStep = 0x9E3779B9u;

}  // namespace

HandleTable::HandleTable() : HandleTable(RandomSalt()) {}

HandleTable::HandleTable(uint64_t salt) : salt_(static_cast<uint32_t>(salt ^ (salt >> 32))) {}

uint64_t HandleTable::NameOf(HandleKind k, uint64_t idx, uint32_t generation) const {
  const uint32_t check = salt_ + generation * kGenerationStep;
  return ((kTag | static_cast<uint64_t>(k)) << 56) | (static_cast<uint64_t>(check) << kIndexBits) |
         idx;
}

uint64_t HandleTable::Publish(HandleKind k, uint64_t real) {
  if (real == 0 || (k == HandleKind::kStream && real <= 2)) return real;
  auto& by_real = by_real_[static_cast<size_t>(k)];
  auto it = by_real.find(real);
  if (it != by_real.end()) return slots_[it->second].wire;
  uint32_t idx;
  if (!free_.empty()) {
    idx = free_.front();
    free_.pop_front();
  } else {
    // 2^24 live handles in one session (never reached by real programs): beyond that the last
    // slot's object loses its name to the new one.
    idx = slots_.size() <= kIndexMask ? static_cast<uint32_t>(slots_.size())
                                      : static_cast<uint32_t>(kIndexMask);
    if (idx == slots_.size()) {
      slots_.emplace_back();
    } else {
      Slot& old = slots_[idx];
      by_real_[old.kind].erase(old.real);
      ++old.generation;
    }
  }
  Slot& s = slots_[idx];
  s.kind = static_cast<uint8_t>(k);
  s.wire = NameOf(k, idx, s.generation);
  s.real = real;
  by_real[real] = idx;
  return s.wire;
}

bool HandleTable::Retire(HandleKind k, uint64_t wire) {
  uint64_t real = 0;
  if (wire == 0 || (k == HandleKind::kStream && wire <= 2) || !Resolve(k, wire, &real)) return false;
  const uint32_t idx = static_cast<uint32_t>(wire & kIndexMask);
  Slot& s = slots_[idx];
  by_real_[static_cast<size_t>(k)].erase(real);
  s.wire = 0;
  s.real = 0;
  // A slot whose every generation was used is never reused: no name comes back.
  if (++s.generation != 0) free_.push_back(idx);
  return true;
}

bool HandleTable::RetireReal(HandleKind k, uint64_t real) {
  uint64_t wire = 0;
  return WireOf(k, real, &wire) && Retire(k, wire);
}

size_t HandleTable::RetireAll(HandleKind k) {
  std::vector<uint64_t> wires;
  for (const auto& [real, idx] : by_real_[static_cast<size_t>(k)]) wires.push_back(slots_[idx].wire);
  size_t n = 0;
  for (uint64_t w : wires) n += Retire(k, w) ? 1 : 0;
  return n;
}

bool HandleTable::WireOf(HandleKind k, uint64_t real, uint64_t* wire) const {
  if (k == HandleKind::kStream && real <= 2) {
    *wire = real;
    return true;
  }
  const auto& by_real = by_real_[static_cast<size_t>(k)];
  auto it = by_real.find(real);
  if (it == by_real.end()) return false;
  *wire = slots_[it->second].wire;
  return true;
}

}  // namespace tf::worker
