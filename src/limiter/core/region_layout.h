// The byte layout of the per-physical-GPU shared-memory region, layout_version 9.
//
// docs/shm-layout.md is the prose version of this file (offsets, units, writers, locking); the
// static_asserts at the bottom pin every documented offset so the two cannot drift silently.
// Changing any field, size or meaning REQUIRES bumping kLayoutVersion: attach refuses a mismatch.
// (Reserved bytes given a meaning for which zero, what every earlier writer left there, means
// "nothing" are the one exception: both versions keep working on the same region.)
//
// Everything here lives in a MAP_SHARED mapping used by unrelated processes, so:
//  - only fixed-width fields; std::atomic only of always-lock-free types (asserted below);
//  - no pointers, no virtuals, no C++ objects with heap state;
//  - every array element and every independently written group starts on its own cache line.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace tf::limiter {

inline constexpr char kRegionMagic[8] = {'T', 'F', 'V', 'G', 'P', 'U', '0', '1'};
inline constexpr uint32_t kLayoutVersion = 9;
inline constexpr uint32_t kMaxVgpus = 64;
inline constexpr uint32_t kMaxProcesses = 512;
inline constexpr size_t kCacheLine = 64;
inline constexpr size_t kVgpuIdBytes = 64;    // NUL-terminated, so at most 63 characters
inline constexpr size_t kGpuUuidBytes = 64;   // "GPU-xxxxxxxx-...", NUL-terminated
inline constexpr size_t kGpuNameBytes = 96;   // "NVIDIA H100 80GB HBM3", NUL-terminated
inline constexpr uint64_t kShareWholeGpuPpm = 1'000'000;  // compute_share_ppm of a whole GPU
inline constexpr uint32_t kMaxQos = 3;                     // 0 low, 1 medium, 2 high, 3 critical

enum SlotState : uint32_t { kSlotFree = 0, kSlotActive = 1 };

// Offset 0, 512 bytes. Written once by the creator before the file becomes visible (link(2)),
// except capacity_mtflops which the owner may update atomically.
struct alignas(kCacheLine) RegionHeader {
  char magic[8];                   // "TFVGPU01", no NUL
  uint32_t layout_version;         // kLayoutVersion
  uint32_t header_size;            // sizeof(RegionHeader)
  uint32_t vgpu_slot_size;         // sizeof(VgpuSlot)
  uint32_t process_slot_size;      // sizeof(ProcessSlot)
  uint32_t lease_block_size;       // sizeof(LeaseBlock)
  uint32_t max_vgpus;              // kMaxVgpus
  uint32_t max_processes;          // kMaxProcesses
  uint32_t mutex_size;             // sizeof(pthread_mutex_t) of the creator's libc
  uint64_t total_size;             // bytes of the whole layout (the file may be longer, never shorter)
  uint64_t vgpu_array_offset;      // bytes from the start of the file
  uint64_t process_array_offset;
  uint64_t lease_offset;
  uint64_t total_vram_bytes;       // physical VRAM of the GPU, bytes
  std::atomic<uint64_t> capacity_mtflops;  // FP16 dense capacity, milli-TFLOPS
  uint64_t created_unix_ns;        // CLOCK_REALTIME at creation, for `tfusion smi`
  uint8_t reserved0[32];
  char gpu_uuid[kGpuUuidBytes];    // offset 128
  char gpu_name[kGpuNameBytes];    // offset 192
  uint8_t reserved1[32];
  // Offset 320. Robust, process-shared. Guards slot allocation: vGPU create/remove and process
  // attach/detach/reap. Lock order: table_mutex before any VgpuSlot::mutex.
  alignas(kCacheLine) pthread_mutex_t table_mutex;
  uint8_t reserved2[512 - 320 - sizeof(pthread_mutex_t)];
};

// 256 bytes each, kMaxVgpus of them.
struct alignas(kCacheLine) VgpuSlot {
  // Line 0: identity and limits. state flips under table_mutex; limits are atomic stores by the
  // owner (CreateOrUpdateVgpu) and may be read by anyone at any time.
  std::atomic<uint32_t> state;            // SlotState
  std::atomic<uint32_t> qos;              // 0..kMaxQos: who borrows idle capacity first
  std::atomic<uint64_t> vram_limit_bytes;
  // The compute request (guaranteed under contention). 1,000,000 = whole GPU; request and limit
  // both >= that: unthrottled (the launch path skips all accounting).
  std::atomic<uint64_t> compute_share_ppm;
  // Written only under `mutex`; read lock-free (a momentary value) by Used() and Snapshot().
  // Invariant at every unlock: vram_used_bytes == sum of vram_bytes of active ProcessSlots
  // whose vgpu_index is this slot.
  std::atomic<uint64_t> vram_used_bytes;
  std::atomic<uint64_t> drift_events;     // Release() of more than was held (clamped at zero)
  std::atomic<uint64_t> oom_total;        // Reserve() refusals
  std::atomic<uint64_t> compute_limit_ppm;  // the ceiling, >= compute_share_ppm
  // Shared mode: of throttled_ns_total, the ns held over the request while another vGPU was owed
  // its own or a higher QoS borrowed (and any hold of no other reason). Lock-free adds per held
  // tick; the other two reasons are in line 2.
  std::atomic<uint64_t> held_others_ns_total;
  // Line 1: identity string, written before state becomes active, then immutable.
  char id[kVgpuIdBytes];
  // Line 2. Shared mode: of throttled_ns_total, the ns held waiting for another vGPU's turn and
  // at the vGPU's limit (lock-free adds per held tick, compute_share.cc; the third reason is in
  // line 0). Before the mutex, so that their offsets do not depend on its size (40 bytes on
  // x86-64 glibc, 48 on aarch64).
  alignas(kCacheLine) std::atomic<uint64_t> held_turn_ns_total;
  std::atomic<uint64_t> held_limit_ns_total;
  // Robust, process-shared; guards vram_used_bytes and the vram_bytes of its processes.
  pthread_mutex_t mutex;
  // Line 3: compute token bucket and counters, updated lock-free by lease holders and waiters.
  // The limit bucket: GPU-busy ns this vGPU may still use, refilled at compute_limit_ppm; may be
  // negative (debt). (Exclusive-lease mode: the only bucket, refilled at compute_share_ppm.)
  alignas(kCacheLine) std::atomic<int64_t> tokens_ns;
  std::atomic<int64_t> last_refill_ns;      // CLOCK_MONOTONIC ns of the last refill
  std::atomic<uint64_t> busy_ns_total;      // GPU-busy ns charged to this vGPU
  std::atomic<uint64_t> throttled_ns_total; // ns processes of this vGPU were held back
  std::atomic<uint64_t> launches_total;     // kernel launches reported by the hook layer
  std::atomic<uint64_t> leases_total;       // leases granted (exclusive mode) / holds (shared mode)
  // The request bucket, refilled at compute_share_ppm and charged only while another vGPU
  // wants the GPU (borrowed idle capacity is not debt): <= 0 means "over what it is owed".
  std::atomic<int64_t> request_tokens_ns;
  std::atomic<int64_t> last_demand_ns;      // CLOCK_MONOTONIC ns a process of it last had work
                                            // in flight or was held back; 0 = never
};

// 64 bytes each, kMaxProcesses of them.
struct alignas(kCacheLine) ProcessSlot {
  std::atomic<uint32_t> state;        // SlotState; flips under table_mutex (and the vGPU mutex to free)
  std::atomic<uint32_t> vgpu_index;   // set before state becomes active, then immutable
  std::atomic<int32_t> pid;           // in the PID namespace of the process that attached it
  std::atomic<uint32_t> last_hold;    // shared mode: the ShareHold of its last verdict (0 = run)
  std::atomic<uint64_t> start_time_ticks;  // /proc/<pid>/stat field 22 (clock ticks since boot)
  std::atomic<uint64_t> vram_bytes;        // VRAM this process holds; written under the vGPU mutex
  std::atomic<uint64_t> throttled_ns;      // ns this process waited for the lease
  std::atomic<int64_t> wait_since_ns;      // CLOCK_MONOTONIC ns it started waiting; 0 = not waiting
  std::atomic<int64_t> active_until_ns;    // shared mode: it has GPU work in flight until at least
                                           // this CLOCK_MONOTONIC ns (refreshed per tick); 0 = idle
  std::atomic<uint64_t> host_kept_bytes;   // tiering: pinned host copies kept after a swap-in for
                                           // its next swap-out (counted in host_used_bytes)
};

// 64 bytes, one per GPU. The compute lease: at most one throttled process submits at a time.
struct alignas(kCacheLine) LeaseBlock {
  // One atomic snapshot of the lease, so a steal decision and its CAS see the same state:
  //   bits 63..54  owner process slot + 1 (0 = FREE)
  //   bits 53..32  deadline, CLOCK_MONOTONIC milliseconds modulo 2^22 (compared with wrap-around)
  //   bits 31..0   generation, bumped on every release and steal. It is the futex word waiters
  //                sleep on (little-endian: the low half sits at the word's own address).
  std::atomic<uint64_t> word;
  // Informational copies for waiters and `tfusion smi`, stored just after a grant; the
  // authoritative deadline is the one in `word`.
  std::atomic<int64_t> lease_start_ns;     // CLOCK_MONOTONIC ns the current lease was granted
  std::atomic<int64_t> lease_deadline_ns;  // start + quantum; kNoDeadline while FREE
  // Fairness hint. High 16 bits: target process slot + 1 (0 = none); low 48 bits: hint expiry in
  // CLOCK_MONOTONIC microseconds. While it is unexpired only the target may acquire.
  std::atomic<uint64_t> handoff;
  std::atomic<uint32_t> waiters;           // processes inside WaitForLease (skip FUTEX_WAKE at 0)
  std::atomic<uint32_t> wanting;           // process slots with wait_since_ns != 0 (skip the
                                           // handoff scan at 0)
  std::atomic<uint64_t> steals_total;      // leases taken from dead or overdue holders
  uint8_t reserved1[16];
};

// 64 bytes, one per GPU, after the lease block. Shared (concurrent) mode, informational: the
// contention seen by the last governor tick (ShareTick writes it; `tfusion smi` shows it).
struct alignas(kCacheLine) ShareBlock {
  std::atomic<uint64_t> scale_ppm;         // 1,000,000 / processes with work in flight
  std::atomic<uint32_t> active_processes;  // processes with work in flight at the last tick
  uint32_t reserved0;
  std::atomic<uint64_t> ticks_total;       // governor ticks reported
  // Layout 6: saturating tenants take turns (compute_share.cc). High 8 bits: the vGPU index + 1
  // holding the turn (0 = free); low 56 bits: CLOCK_MONOTONIC ns / 1024 when it took it.
  std::atomic<uint64_t> turn;
  std::atomic<uint64_t> turns_total;       // turns taken
  std::atomic<uint64_t> saturating;        // bit i: a process of vGPU i saturates (its last tick)
  uint8_t reserved[16];
};

// ---- VRAM tiering (layout 3): after the ShareBlock, one TierHeader, then a VgpuTier per vGPU
// slot and a ProcessTier per process slot (same indices).

// Where a process's movable VRAM is (ProcessTier::state).
enum TierState : uint32_t {
  kTierOff = 0,          // the process does not use movable allocations
  kTierResident = 1,     // every range is in VRAM
  kTierSwappingOut = 2,  // quiescing and copying out
  kTierSwapped = 3,      // its movable ranges are in the host tier, their VRAM released
  kTierSwappingIn = 4,   // restoring
  kTierOnDisk = 5,       // swapped, and its copies moved on from host memory to the disk tier
  // Reported only (RegionSnapshot), never stored in ProcessTier::state: swapped, and the rest of
  // the process (context, fixed memory) checkpointed by the driver (ProcessZero::state).
  kTierCheckpointed = 6,
};

// 64 bytes, one per GPU. The host tier's budget for the swapped copies of every process of this
// GPU; host_used_bytes is reserved before a swap-out copies and returned after the swap-in (or by
// the reap of a process that died while swapped).
struct alignas(kCacheLine) TierHeader {
  std::atomic<uint64_t> host_budget_bytes;  // 0 = no host tier (swap-out refused)
  std::atomic<uint64_t> host_used_bytes;
  std::atomic<uint64_t> swaps_out_total;    // completed swap-outs, every process
  std::atomic<uint64_t> swaps_in_total;
  std::atomic<uint64_t> bytes_out_total;
  std::atomic<uint64_t> bytes_in_total;
  std::atomic<uint64_t> swap_failures_total;
  std::atomic<uint32_t> reclaim_gen;        // bumped by a swap-out short of budget: processes
                                            // keeping pinned host copies free them while the
  std::atomic<uint32_t> reclaim_need_mib;   // budget left is below what it needs (MiB)
};

// 64 bytes per vGPU slot. Written by the vGPU's owner (policy) and by freeze/thaw requests; read by
// the tier thread in each of the vGPU's processes. Reset when the vGPU slot is created.
struct alignas(kCacheLine) VgpuTier {
  std::atomic<uint32_t> enabled;           // 1: its processes allocate movable VRAM
  std::atomic<uint32_t> freeze_gen;        // bumped by each freeze request
  std::atomic<uint32_t> thaw_gen;          // bumped by each thaw request
  // Layout 4. 1 while the vGPU's allocation is suspended by a preemption: its processes swap out
  // and their GPU calls wait (never swap in) until it is 0 again. Written by the node agent.
  std::atomic<uint32_t> held;
  std::atomic<uint64_t> idle_swap_ms;      // swap out after this long without GPU calls; 0 = never
  std::atomic<uint64_t> idle_disk_ms;      // swapped and idle this long: move on to the disk tier
                                           // (processes started with TFUSION_TIER_DIR); 0 = never
  std::atomic<uint32_t> api_freeze_gen;    // node agent: the allocation's API freeze requests passed on
  std::atomic<uint32_t> api_thaw_gen;      // node agent: its API thaw requests passed on
  // Layout 5, scale to zero. Swapped and idle this long: the vGPU's zero keeper (tfusion run, the
  // node agent) hands the process to the driver's checkpoint; 0 = never. Longer than idle_swap_ms.
  std::atomic<uint64_t> idle_zero_ms;
  std::atomic<uint32_t> zero_gen;          // bumped by a zero request: checkpoint after the swap-out
  std::atomic<uint32_t> zero_done_gen;     // the zero keeper: the last zero_gen it carried out
  std::atomic<uint32_t> api_zero_gen;      // node agent: the allocation's API zero requests passed on
  // Layout 7. The freeze_gen of the last freeze asked for by another tenant short of VRAM (memory
  // pressure), so that the swap-out it causes is reported as such. Written just before that bump.
  std::atomic<uint32_t> pressure_freeze_gen;
};

// 64 bytes per process slot, written only by the limiter of that process (its tier thread and
// its swap paths); read by `tfusion smi`, the node agent and freeze/thaw waiters. Reset when the
// process slot is attached.
struct alignas(kCacheLine) ProcessTier {
  std::atomic<uint32_t> state;             // TierState
  std::atomic<uint32_t> last_error;        // CUresult of the last failed swap (0 = none)
  std::atomic<uint32_t> freeze_done_gen;   // the last VgpuTier::freeze_gen it acted on
  std::atomic<uint32_t> thaw_done_gen;     // the last VgpuTier::thaw_gen it acted on
  std::atomic<int64_t> last_active_ns;     // CLOCK_MONOTONIC ns of its last GPU call seen
  std::atomic<uint64_t> movable_bytes;     // bytes of movable ranges (resident or not)
  std::atomic<uint64_t> host_bytes;        // bytes of them now in the host tier
  std::atomic<uint64_t> fixed_bytes;       // charged VRAM that cannot move (pools, arrays, ...)
  std::atomic<uint32_t> swaps_out;         // completed swap-outs
  std::atomic<uint32_t> swaps_in;          // completed swap-ins
  std::atomic<uint32_t> last_out_us;       // duration of the last swap-out
  std::atomic<uint32_t> last_in_us;        // duration of the last swap-in
};

// ---- Scale to zero (layout 4): after the ProcessTier array, one ProcessZero per process slot.

// Where a swapped process stands with the driver's checkpoint (ProcessZero::state). Transitions
// are compare-and-swap, each by one party:
//   none -> park requested        checkpointer (tfusion freeze --zero, the node agent)
//   park requested -> parked      the process's limiter: every call is held at our layer
//   park requested -> none        the process's limiter: it is not swapped or not quiet (refused)
//   parked -> checkpointing       checkpointer, then lock + checkpoint with the driver
//   checkpointing -> checkpointed | none (failed: the process stays swapped and resumes normally)
//   checkpointed -> restoring     restorer (tfusion run, the node agent, tfusion thaw)
//   restoring -> none | checkpointed (failed: the waiting call gets last_error)
enum ZeroState : uint32_t {
  kZeroNone = 0,
  kZeroParkRequested = 1,
  kZeroParked = 2,
  kZeroCheckpointing = 3,
  kZeroCheckpointed = 4,
  kZeroRestoring = 5,
};

// 64 bytes per process slot. Reset when the process slot is attached.
struct alignas(kCacheLine) ProcessZero {
  std::atomic<uint32_t> state;               // ZeroState
  std::atomic<uint32_t> wake_gen;            // bumped by the process: a call needs the driver
  std::atomic<uint32_t> wake_done_gen;       // restorer: the last wake_gen it acted on
  std::atomic<uint32_t> last_error;          // CUresult of the last failed checkpoint or restore
  std::atomic<int32_t> actor_pid;            // the checkpointer or restorer acting now
  std::atomic<uint32_t> checkpoints;         // completed checkpoints
  std::atomic<uint32_t> restores;            // completed restores
  std::atomic<uint32_t> last_checkpoint_us;  // lock + checkpoint
  std::atomic<uint32_t> last_restore_us;     // restore + unlock
  uint32_t reserved0;
  // Who acts now, as one word so that it is read and taken over whole: the pid of the checkpointer
  // (from its park request on) or restorer in the low 32 bits, the inode number of its PID
  // namespace in the high 32; 0 = none known. Another party takes over (compare-and-swap) only
  // from an actor that is gone in its own namespace, so that a checkpointer or restorer killed
  // outright does not leave the process parked, locked or checkpointed for good.
  std::atomic<uint64_t> actor;
  uint8_t reserved[16];
};

// ---- Swap events (layout 7): after the ProcessZero array, one ProcessTierLog per process slot.
// Each completed swap-out, swap-in and move to the disk tier of the process, so that the node agent
// can log it with its cause. Written only by the limiter of the process; read by anyone, who must
// treat every field as untrusted (another process wrote it).

enum TierEventKind : uint32_t {
  kTierEventSwapOut = 1,  // VRAM -> host memory
  kTierEventSwapIn = 2,   // host memory and the disk tier -> VRAM
  kTierEventToDisk = 3,   // host memory -> the disk tier (swapped and idle)
};

// Why it happened, where the process knows it.
enum TierEventCause : uint32_t {
  kTierCauseUnknown = 0,
  kTierCauseIdle = 1,        // the idle timeout (idle_swap_ms, idle_disk_ms)
  kTierCauseFreeze = 2,      // a freeze request (tfusion freeze, the API, the node agent)
  kTierCausePressure = 3,    // another tenant of the GPU was short of VRAM
  kTierCausePreemption = 4,  // the vGPU is held by a preemption (VgpuTier::held)
  kTierCauseThaw = 5,        // a thaw request (tfusion thaw, the API, the end of a hold)
  kTierCauseCall = 6,        // a call of the tenant that needs the GPU
  kTierCauseMax = 6,
};

// 16 bytes. A seqlock of one word: `tag` is 0 while the record is being written, then
// (event number & 0xFFFFFF) << 8 | cause << 4 | kind, stored last with release.
struct TierEventRecord {
  std::atomic<uint32_t> tag;
  std::atomic<uint32_t> duration_us;  // the whole event
  std::atomic<uint32_t> host_mib;     // MiB written to (swap-out) or read from (swap-in) host memory
  std::atomic<uint32_t> disk_mib;     // MiB written to (to disk) or read from (swap-in) the disk tier
};

inline constexpr uint32_t kTierLogDepth = 3;

// 64 bytes per process slot. Event n (1, 2, ...) is in ring[(n - 1) % kTierLogDepth]; `events`
// is stored after its record is complete. Reset when the process slot is attached.
struct alignas(kCacheLine) ProcessTierLog {
  std::atomic<uint32_t> events;  // events completed
  uint32_t reserved0[3];
  TierEventRecord ring[kTierLogDepth];
};

inline constexpr int64_t kNoDeadline = INT64_MAX;

inline constexpr uint64_t kVgpuArrayOffset = sizeof(RegionHeader);
inline constexpr uint64_t kProcessArrayOffset = kVgpuArrayOffset + kMaxVgpus * sizeof(VgpuSlot);
inline constexpr uint64_t kLeaseOffset = kProcessArrayOffset + kMaxProcesses * sizeof(ProcessSlot);
inline constexpr uint64_t kShareOffset = kLeaseOffset + sizeof(LeaseBlock);
inline constexpr uint64_t kTierHeaderOffset = kShareOffset + sizeof(ShareBlock);
inline constexpr uint64_t kVgpuTierOffset = kTierHeaderOffset + sizeof(TierHeader);
inline constexpr uint64_t kProcessTierOffset = kVgpuTierOffset + kMaxVgpus * sizeof(VgpuTier);
inline constexpr uint64_t kProcessZeroOffset = kProcessTierOffset + kMaxProcesses * sizeof(ProcessTier);
inline constexpr uint64_t kProcessTierLogOffset = kProcessZeroOffset + kMaxProcesses * sizeof(ProcessZero);
inline constexpr uint64_t kRegionTotalSize = kProcessTierLogOffset + kMaxProcesses * sizeof(ProcessTierLog);

static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<int32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<int64_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<uint64_t>) == 8 && sizeof(std::atomic<uint32_t>) == 4);
static_assert(sizeof(pthread_mutex_t) <= 64, "a robust mutex must fit in one cache line");
static_assert(std::is_standard_layout_v<RegionHeader> && std::is_standard_layout_v<VgpuSlot> &&
              std::is_standard_layout_v<ProcessSlot> && std::is_standard_layout_v<LeaseBlock>);
// Pinned by docs/shm-layout.md.
static_assert(sizeof(RegionHeader) == 512);
static_assert(offsetof(RegionHeader, gpu_uuid) == 128);
static_assert(offsetof(RegionHeader, gpu_name) == 192);
static_assert(offsetof(RegionHeader, table_mutex) == 320);
static_assert(sizeof(VgpuSlot) == 256);
static_assert(offsetof(VgpuSlot, id) == 64);
static_assert(offsetof(VgpuSlot, held_others_ns_total) == 56 && offsetof(VgpuSlot, held_turn_ns_total) == 128 &&
              offsetof(VgpuSlot, held_limit_ns_total) == 136);
static_assert(offsetof(VgpuSlot, mutex) == 144 && sizeof(pthread_mutex_t) <= 48,
              "the vGPU's mutex ends line 2 (40 bytes on x86-64 glibc, 48 on aarch64)");
static_assert(offsetof(VgpuSlot, tokens_ns) == 192);
static_assert(offsetof(ProcessSlot, last_hold) == 12);
static_assert(sizeof(ProcessSlot) == 64);
static_assert(offsetof(ProcessSlot, start_time_ticks) == 16 && offsetof(ProcessSlot, wait_since_ns) == 40);
static_assert(sizeof(LeaseBlock) == 64);
static_assert(offsetof(LeaseBlock, handoff) == 24 && offsetof(LeaseBlock, waiters) == 32 &&
              offsetof(LeaseBlock, steals_total) == 40);
static_assert(kVgpuArrayOffset == 512 && kProcessArrayOffset == 16896 && kLeaseOffset == 49664);
static_assert(sizeof(ShareBlock) == 64 && std::is_standard_layout_v<ShareBlock>);
static_assert(offsetof(VgpuSlot, qos) == 4 && offsetof(VgpuSlot, compute_limit_ppm) == 48);
static_assert(offsetof(VgpuSlot, request_tokens_ns) == 240 && offsetof(VgpuSlot, last_demand_ns) == 248);
static_assert(offsetof(ProcessSlot, active_until_ns) == 48 && offsetof(ProcessSlot, host_kept_bytes) == 56);
static_assert(offsetof(TierHeader, reclaim_gen) == 56 && offsetof(TierHeader, reclaim_need_mib) == 60);
static_assert(kShareOffset == 49728 && kTierHeaderOffset == 49792);
static_assert(sizeof(TierHeader) == 64 && sizeof(VgpuTier) == 64 && sizeof(ProcessTier) == 64);
static_assert(std::is_standard_layout_v<TierHeader> && std::is_standard_layout_v<VgpuTier> &&
              std::is_standard_layout_v<ProcessTier>);
static_assert(offsetof(ProcessTier, last_active_ns) == 16 && offsetof(ProcessTier, swaps_out) == 48);
static_assert(offsetof(VgpuTier, held) == 12 && offsetof(VgpuTier, api_freeze_gen) == 32);
static_assert(offsetof(VgpuTier, idle_zero_ms) == 40 && offsetof(VgpuTier, api_zero_gen) == 56);
static_assert(kVgpuTierOffset == 49856 && kProcessTierOffset == 53952);
static_assert(sizeof(ProcessZero) == 64 && std::is_standard_layout_v<ProcessZero>);
static_assert(offsetof(ProcessZero, actor_pid) == 16 && offsetof(ProcessZero, last_restore_us) == 32);
static_assert(offsetof(ProcessZero, actor) == 40);
static_assert(kProcessZeroOffset == 86720 && kProcessTierLogOffset == 119488);
static_assert(sizeof(TierEventRecord) == 16 && sizeof(ProcessTierLog) == 64 && std::is_standard_layout_v<ProcessTierLog>);
static_assert(offsetof(ProcessTierLog, ring) == 16 && offsetof(VgpuTier, pressure_freeze_gen) == 60);
static_assert(kRegionTotalSize == 152256);

}  // namespace tf::limiter
