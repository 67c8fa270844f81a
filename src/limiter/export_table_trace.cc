// cuGetExportTable in the limiter: a pass-through to the driver, with two diagnostics for the
// undocumented export tables ("dark API") that cudart, cuBLAS and cuDNN ask the driver for.
//
//   TFUSION_EXPORT_TRACE=UUID[,UUID...]|all   wrap the named tables (32 hex digits in memory
//       order, or a prefix of at least 8): every call through a slot is logged with its first six
//       integer arguments, the 32 bytes each readable pointer argument points to after the call,
//       and the result. The first request of every table logs its size word.
//   TFUSION_EXPORT_OVERRIDE=PREFIX[SLOT]=fail:N|out:V[,...]   with TFUSION_EXPORT_TRACE: answer
//       that slot without calling the driver, with CUresult N (fail:N) or by storing the 64-bit
//       V through its second argument and returning success (out:V), to learn what a library does
//       with the answers an emulation could give.
//   TFUSION_EXPORT_DENY=UUID[,UUID...]        answer the named tables with CUDA_ERROR_INVALID_VALUE
//       and a NULL table, as the remote stub does for tables it does not emulate, to learn
//       whether a library tolerates their absence on a real driver.
//
// Both are for learning what the remote client must emulate (docs/export-tables.md); neither is
// set in production. A wrapped slot forwards six integer registers and returns the 64-bit
// result, which is exact for every signature of six or fewer integer or pointer arguments (all
// slots seen so far).
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>

#include "limiter/export_support.h"
#include "limiter/guest_log.h"

namespace tf::limiter {
namespace {

constexpr int kMaxTables = 8;
constexpr int kMaxSlots = 128;

using Slot = uint64_t (*)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t);

struct Wrapped {
  CUuuid id{};
  const uint64_t* real = nullptr;
  size_t slots = 0;
  uint64_t table[kMaxSlots] = {};
};

Wrapped g_wrapped[kMaxTables];
int g_wrapped_count = 0;
std::mutex g_mu;

void Hex(const void* p, size_t n, char* out) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) snprintf(out + 2 * i, 3, "%02x", b[i]);
  out[2 * n] = '\0';
}

// A UUID list names `id` (full 32 hex digits or a prefix of >= 8).
bool Listed(const char* list, const CUuuid& id) {
  if (list == nullptr || list[0] == '\0') return false;
  if (strcmp(list, "all") == 0) return true;
  char text[33];
  Hex(id.bytes, 16, text);
  const char* p = list;
  while (*p != '\0') {
    const char* end = strchr(p, ',');
    size_t len = end ? static_cast<size_t>(end - p) : strlen(p);
    if (len >= 8 && len <= 32 && strncasecmp(p, text, len) == 0) return true;
    if (end == nullptr) break;
    p = end + 1;
  }
  return false;
}

// Whether n bytes at p are readable, without faulting: the kernel reports EFAULT instead.
bool Readable(uint64_t p, size_t n) {
  if (p < 4096 || n > 256) return false;
  static int fds[2] = {-1, -1};
  if (fds[0] < 0 && pipe(fds) != 0) return false;
  ssize_t w = write(fds[1], reinterpret_cast<const void*>(p), n);
  if (w <= 0) return false;
  char sink[256];
  if (static_cast<size_t>(w) > sizeof(sink)) return false;
  (void)!read(fds[0], sink, static_cast<size_t>(w));
  return static_cast<size_t>(w) == n;
}

// An override for "prefix[slot]" in TFUSION_EXPORT_OVERRIDE: 'f' (fail with value) or 'o' (store
// value through the second argument); 0 when none.
char OverrideOf(const char* uuid, int slot, uint64_t* value) {
  static const char* list = getenv("TFUSION_EXPORT_OVERRIDE");
  if (list == nullptr) return 0;
  const char* p = list;
  while (*p != '\0') {
    const char* br = strchr(p, '[');
    if (br == nullptr) return 0;
    size_t len = static_cast<size_t>(br - p);
    char* end = nullptr;
    long s = strtol(br + 1, &end, 10);
    if (len >= 8 && len <= 32 && strncasecmp(p, uuid, len) == 0 && s == slot && end &&
        strncmp(end, "]=", 2) == 0) {
      const char* mode = end + 2;
      if (strncmp(mode, "fail:", 5) == 0) {
        *value = strtoull(mode + 5, nullptr, 0);
        return 'f';
      }
      if (strncmp(mode, "out:", 4) == 0) {
        *value = strtoull(mode + 4, nullptr, 0);
        return 'o';
      }
      return 0;
    }
    const char* comma = strchr(p, ',');
    if (comma == nullptr) return 0;
    p = comma + 1;
  }
  return 0;
}

template <int T, int S>
uint64_t Trampoline(uint64_t a, uint64_t b, uint64_t c, uint64_t d, uint64_t e, uint64_t f) {
  const Wrapped& w = g_wrapped[T];
  auto real = reinterpret_cast<Slot>(w.real[S]);
  char uuid[33];
  Hex(w.id.bytes, 16, uuid);
  GuestLog("export %.8s[%d] call(%#lx, %#lx, %#lx, %#lx, %#lx, %#lx)", uuid, S, a, b, c, d, e, f);
  uint64_t value = 0;
  char mode = OverrideOf(uuid, S, &value);
  uint64_t r = 0;
  if (mode == 'f') {
    r = value;
  } else if (mode == 'o') {
    if (b != 0) *reinterpret_cast<uint64_t*>(b) = value;
  } else {
    r = real(a, b, c, d, e, f);
  }
  if (mode != 0) GuestLog("export %.8s[%d] overridden (%c %#lx)", uuid, S, mode, value);
  const uint64_t args[6] = {a, b, c, d, e, f};
  for (int i = 0; i < 6; ++i) {
    if (Readable(args[i], 32)) {
      char hex[65];
      Hex(reinterpret_cast<const void*>(args[i]), 32, hex);
      GuestLog("export %.8s[%d]   arg%d -> %s", uuid, S, i, hex);
    }
  }
  GuestLog("export %.8s[%d] -> %#lx", uuid, S, r);
  return r;
}

template <int T, size_t... S>
constexpr std::array<Slot, sizeof...(S)> TrampolinesOf(std::index_sequence<S...>) {
  return {&Trampoline<T, static_cast<int>(S)>...};
}

template <size_t... T>
constexpr std::array<std::array<Slot, kMaxSlots>, sizeof...(T)> AllTrampolines(
    std::index_sequence<T...>) {
  return {TrampolinesOf<static_cast<int>(T)>(std::make_index_sequence<kMaxSlots>())...};
}

const auto kTrampolines = AllTrampolines(std::make_index_sequence<kMaxTables>());

// The wrapped copy of a real table; the real table when it cannot be wrapped.
const void* Wrap(const void* real_table, const CUuuid& id) {
  std::lock_guard<std::mutex> lock(g_mu);
  for (int t = 0; t < g_wrapped_count; ++t) {
    if (memcmp(g_wrapped[t].id.bytes, id.bytes, 16) == 0) return g_wrapped[t].table;
  }
  char uuid[33];
  Hex(id.bytes, 16, uuid);
  const auto* real = static_cast<const uint64_t*>(real_table);
  uint64_t size = real[0];
  // Tables that start with their size in bytes (all but the context-local-storage one).
  if (size % 8 != 0 || size < 16 || size / 8 > kMaxSlots || g_wrapped_count == kMaxTables) {
    GuestLog("export %s: first word %#lx is not a size; not wrapped", uuid, size);
    return real_table;
  }
  Wrapped& w = g_wrapped[g_wrapped_count];
  w.id = id;
  w.real = real;
  w.slots = size / 8;
  w.table[0] = size;
  for (size_t s = 1; s < w.slots; ++s) {
    w.table[s] = reinterpret_cast<uint64_t>(kTrampolines[g_wrapped_count][s]);
  }
  GuestLog("export %s: %zu slots (size %lu), wrapped", uuid, w.slots, size);
  // The first bytes of each slot's code, to tell trivial slots (constant answers) from real ones.
  static const bool dump = getenv("TFUSION_EXPORT_CODE") != nullptr;
  for (size_t s = 1; dump && s < w.slots; ++s) {
    if (!Readable(real[s], 96)) continue;
    char hex[193];
    Hex(reinterpret_cast<const void*>(real[s]), 96, hex);
    GuestLog("export %.8s[%zu] code %#lx %s", uuid, s, real[s], hex);
  }
  ++g_wrapped_count;
  return w.table;
}

}  // namespace

CUresult Hook_cuGetExportTable(const void** table, const CUuuid* id) {
  TF_REAL_OR_MISSING(cuGetExportTable);
  if (table == nullptr || id == nullptr) return fn(table, id);
  static const char* deny = getenv("TFUSION_EXPORT_DENY");
  static const char* trace = getenv("TFUSION_EXPORT_TRACE");
  char uuid[33];
  Hex(id->bytes, 16, uuid);
  if (Listed(deny, *id)) {
    GuestLog("cuGetExportTable(%s): refused (TFUSION_EXPORT_DENY)", uuid);
    *table = nullptr;
    return CUDA_ERROR_INVALID_VALUE;
  }
  CUresult r = fn(table, id);
  if (Listed(trace, *id)) {
    GuestLog("cuGetExportTable(%s) -> %d, table=%p", uuid, static_cast<int>(r), *table);
    if (r == CUDA_SUCCESS && *table != nullptr) *table = Wrap(*table, *id);
  }
  return r;
}

}  // namespace tf::limiter
