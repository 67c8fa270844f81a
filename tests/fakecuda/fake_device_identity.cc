#include "fake_device_identity.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace fakecuda {
namespace {

long EnvLong(const char* name, long fallback, long min, long max) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < min || value > max) return fallback;
  return value;
}

// Layout of one device's shared-memory object: a version word and a fixed array of slots.
constexpr uint32_t kBoardMagic = 0xfa4ec0d1;
constexpr int kSlots = 256;
struct Slot {
  // The holder: its pid in the low 32 bits (0: free), the low 32 bits of its start time in clock
  // ticks above them (0: unknown), claimed in one compare-and-swap.
  uint64_t owner;
  int64_t used_bytes;
};

// Low 32 bits of `pid`'s start time (field 22 of /proc/PID/stat), 0 when unreadable; *state (when
// given) gets its state letter (field 3; 0 when unreadable). A board outlives its processes, and a
// name built from a test's pid meets its board again once the pid is reused: a slot counts only
// while its holder is the very process that claimed it.
uint32_t StartTicks(int32_t pid, char* state = nullptr) {
  if (state != nullptr) *state = 0;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return 0;
  char text[1024];
  size_t n = std::fread(text, 1, sizeof(text) - 1, f);
  std::fclose(f);
  text[n] = '\0';
  const char* p = std::strrchr(text, ')');  // the command name may hold spaces and parentheses
  if (p == nullptr) return 0;
  if (state != nullptr && p[1] == ' ') *state = p[2];
  for (int field = 2; field < 22 && p != nullptr; ++field) p = std::strchr(p + 1, ' ');
  if (p == nullptr) return 0;
  return static_cast<uint32_t>(std::strtoull(p + 1, nullptr, 10));
}

int32_t OwnerPid(uint64_t owner) { return static_cast<int32_t>(owner & 0xffffffffu); }

// Whether the process that claimed a slot (its `owner` word) still runs. One that exited and was
// not reaped yet (a zombie: an orphan whose new parent does not wait for it) holds nothing, as the
// driver frees a process's memory when it exits.
bool HolderAlive(uint64_t owner) {
  int32_t pid = OwnerPid(owner);
  if (pid == 0) return false;
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  char state = 0;
  const uint32_t now_start = StartTicks(pid, &state);
  if (state == 'Z' || state == 'X') return false;
  uint32_t start = static_cast<uint32_t>(owner >> 32);
  return start == 0 || start == now_start;
}
struct Board {
  uint32_t magic;
  uint32_t pad;
  Slot slots[kSlots];
};

constexpr int kMaxBoards = 64;

class BoardMap {
 public:
  static BoardMap& Get() {
    static BoardMap* map = new BoardMap;  // leaked: used until process exit
    return *map;
  }
  Board* Open(int device) {
    if (device < 0 || device >= kMaxBoards) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    const char* prefix = std::getenv("FAKECUDA_SHM_NAME");
    char name[256];
    if (prefix != nullptr && *prefix != '\0') {
      std::snprintf(name, sizeof(name), "/%s-dev%d", prefix, device);
    } else {
      std::snprintf(name, sizeof(name), "/fakecuda-%u-dev%d", static_cast<unsigned>(getuid()),
                    device);
    }
    // The board of the name the environment gives now: a process that changes FAKECUDA_SHM_NAME
    // (a test binary running one test's fake GPU after another's) reads the new one. The old
    // mapping stays (a slot pointer may still be in use); this process's slot is claimed anew.
    if (boards_[device] != nullptr && names_[device] == name) return boards_[device];
    own_[device] = nullptr;
    int fd = shm_open(name, O_RDWR | O_CREAT, 0600);
    if (fd < 0) return nullptr;
    if (ftruncate(fd, sizeof(Board)) != 0) {
      close(fd);
      return nullptr;
    }
    void* mem = mmap(nullptr, sizeof(Board), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (mem == MAP_FAILED) return nullptr;
    auto* board = static_cast<Board*>(mem);
    uint32_t expected = 0;
    __atomic_compare_exchange_n(&board->magic, &expected, kBoardMagic, false, __ATOMIC_SEQ_CST,
                                __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&board->magic, __ATOMIC_SEQ_CST) != kBoardMagic) {
      munmap(mem, sizeof(Board));
      return nullptr;
    }
    boards_[device] = board;
    names_[device] = name;
    return board;
  }
  // This process's slot on `board`, claimed on first use (a free slot or one of a dead process).
  Slot* OwnSlot(int device, Board* board) {
    std::lock_guard<std::mutex> lock(mu_);
    if (own_[device] != nullptr) return own_[device];
    int32_t me = getpid();
    const uint64_t mine = (static_cast<uint64_t>(StartTicks(me)) << 32) | static_cast<uint32_t>(me);
    for (Slot& slot : board->slots) {
      uint64_t holder = __atomic_load_n(&slot.owner, __ATOMIC_SEQ_CST);
      bool claimable = OwnerPid(holder) == 0 || OwnerPid(holder) == me || !HolderAlive(holder);
      if (claimable &&
          __atomic_compare_exchange_n(&slot.owner, &holder, mine, false, __ATOMIC_SEQ_CST,
                                      __ATOMIC_SEQ_CST)) {
        __atomic_store_n(&slot.used_bytes, 0, __ATOMIC_SEQ_CST);
        own_[device] = &slot;
        return &slot;
      }
    }
    return nullptr;
  }

 private:
  std::mutex mu_;
  Board* boards_[kMaxBoards] = {};
  std::string names_[kMaxBoards];
  Slot* own_[kMaxBoards] = {};
};

}  // namespace

FakeTopology ReadTopologyFromEnv() {
  FakeTopology topology;
  topology.device_count = static_cast<int>(EnvLong("FAKECUDA_DEVICES", 1, 1, 64));
  topology.total_bytes =
      static_cast<uint64_t>(EnvLong("FAKECUDA_TOTAL_MIB", 16384, 1, 1L << 24)) << 20;
  return topology;
}

std::vector<int> VisibleDevices(int physical_count) {
  std::vector<int> out;
  const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
  if (env == nullptr) {
    for (int i = 0; i < physical_count; ++i) out.push_back(i);
    return out;
  }
  std::string list(env);
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    std::string entry = list.substr(start, comma - start);
    while (!entry.empty() && entry.front() == ' ') entry.erase(entry.begin());
    while (!entry.empty() && entry.back() == ' ') entry.pop_back();
    int found = -1;
    if (!entry.empty() && entry.find_first_not_of("0123456789") == std::string::npos) {
      if (entry.size() < 4) found = std::atoi(entry.c_str());
      if (found >= physical_count) found = -1;
    } else if (entry.rfind("GPU-", 0) == 0 && entry.size() > 4) {
      for (int i = 0; i < physical_count; ++i) {
        if (DeviceUuidString(i).rfind(entry, 0) != 0) continue;
        if (found >= 0) {  // an ambiguous prefix names no device
          found = -1;
          break;
        }
        found = i;
      }
    }
    bool repeated = false;
    for (int v : out) repeated = repeated || v == found;
    if (found < 0 || repeated) break;
    out.push_back(found);
    start = comma + 1;
  }
  return out;
}

void DeviceUuid(int index, unsigned char out[16]) {
  // A fixed pattern plus the index: stable across runs and processes, distinct per device.
  static constexpr unsigned char kBase[16] = {0xfa, 0x4e, 0xc0, 0xda, 0x00, 0x00, 0x40, 0x00,
                                              0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  for (int i = 0; i < 16; ++i) out[i] = kBase[i];
  out[12] = static_cast<unsigned char>((index >> 24) & 0xff);
  out[13] = static_cast<unsigned char>((index >> 16) & 0xff);
  out[14] = static_cast<unsigned char>((index >> 8) & 0xff);
  out[15] = static_cast<unsigned char>(index & 0xff);
}

std::string DeviceUuidString(int index) {
  unsigned char b[16];
  DeviceUuid(index, b);
  char text[64];
  std::snprintf(text, sizeof(text),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return text;
}

std::string DevicePciBusId(int index) {
  char text[32];
  std::snprintf(text, sizeof(text), "0000:%02x:00.0", (index + 0x18) & 0xff);
  return text;
}

void UsageBoard::Add(int device, int64_t delta) {
  Board* board = BoardMap::Get().Open(device);
  if (board == nullptr) return;
  Slot* slot = BoardMap::Get().OwnSlot(device, board);
  if (slot == nullptr) return;
  __atomic_add_fetch(&slot->used_bytes, delta, __ATOMIC_SEQ_CST);
}

uint64_t UsageBoard::Used(int device) {
  Board* board = BoardMap::Get().Open(device);
  if (board == nullptr) return 0;
  int64_t sum = 0;
  for (Slot& slot : board->slots) {
    uint64_t owner = __atomic_load_n(&slot.owner, __ATOMIC_SEQ_CST);
    if (!HolderAlive(owner)) continue;
    sum += __atomic_load_n(&slot.used_bytes, __ATOMIC_SEQ_CST);
  }
  return sum > 0 ? static_cast<uint64_t>(sum) : 0;
}

}  // namespace fakecuda
