// GpuRegion: one process's mapping of the shared-memory region of one physical GPU, and every
// operation on it (vGPU table, process table, VRAM ledger, compute lease, snapshot).
//
// One region per physical GPU: the file <dir>/gpu-<GPU UUID>.region (dir defaults to
// kDefaultRegionDir). The node agent (or `tfusion run` when no agent runs) creates it and the
// vGPUs; the limiter inside each tenant process attaches, registers its process and then calls
// the ledger and lease functions. Layout and protocol: region_layout.h, docs/shm-layout.md.
//
// Thread safety: a GpuRegion may be used by any number of threads of its process concurrently,
// except Create/Attach/Detach/move, which REQUIRE no concurrent use of that object. All
// cross-process coordination happens inside the region (robust mutexes, atomics, futex).
//
// Failure: nothing throws, nothing allocates, nothing logs; every fallible call returns a
// RegionError. No call blocks without a bound (robust locks time out after 2 s, lease waits take a
// timeout).
//
// Units: bytes for VRAM, parts-per-million of the whole GPU for compute shares, CLOCK_MONOTONIC
// nanoseconds for every *_ns time (MonotonicNowNs()).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

#include "limiter/core/region_error.h"
#include "limiter/core/region_layout.h"
#include "limiter/core/tier_defaults.h"

namespace tf::limiter {

inline constexpr const char* kDefaultRegionDir = "/dev/shm/tensorfusion";

// Why TryAcquireLease did not grant.
enum class LeaseDenial : uint8_t {
  kNone = 0,     // granted
  kNoTokens,     // this vGPU's bucket is empty (or in debt); retry_after_ns says when it is not
  kHeld,         // another process holds the lease; retry_after_ns is its remaining quantum
  kHandoff,      // the lease is reserved for a longer-waiting process for up to 200 us
  kError,        // invalid process slot (see error)
};

struct LeaseGrant {
  bool granted = false;
  bool unthrottled = false;      // share >= 100%: the lease is not used at all; submit freely
  LeaseDenial denial = LeaseDenial::kNone;
  RegionError error = RegionError::kOk;
  int64_t deadline_ns = 0;       // when granted: release by then (INT64_MAX when unthrottled)
  int64_t retry_after_ns = 0;    // when denied: a hint of how long to wait, >= 0
};

inline constexpr uint32_t kDefaultQos = 1;  // medium

// Shared compute mode: why ShareTick told a process to hold back.
enum class ShareHold : uint8_t {
  kRun = 0,        // submit
  kAtLimit,        // the vGPU's limit bucket is empty: at its ceiling
  kOwedElsewhere,  // over its request while another vGPU that wants the GPU is within its own
  kHigherQos,      // over its request while a higher-QoS vGPU is borrowing idle capacity too
  kTurn,           // saturating, and another saturating vGPU holds the turn
};

// Saturating tenants take turns (compute_share.cc): a process's own view, kept by its governor
// and passed to every ShareTick. Process-local; nothing here is shared.
struct ShareTurn {
  int64_t turn_ns = 0;          // length of a turn (the shortest, with period_ns); 0 = never take turns
  int64_t period_ns = 0;        // planned turns: a vGPU's turn is max(turn_ns, its share x period_ns),
                                //   taken with tokens for most of it; 0 = every turn turn_ns long
  int64_t limit_window_ns = 0;  // out of turns, the limit bucket holds share x this (0: the usual 100 ms)
  bool turns_per_second = true;  // the turns check also leaves turns on work per second (below;
                                  //   the governor's default)
  int64_t busy_avg_ppm = 0;     // share of the last ~10 ms it had work queued or was held
  int64_t turn_held_ns = 0;     // the current window of ticks holding the turn,
  int64_t turn_busy_ns = 0;    //   and how much of it it had work queued
  uint32_t gappy_windows = 0;   // windows of its turns in which it left the GPU idle, in a chain
  int64_t last_gappy_window_ns = 0;  //   each within 1 s of the last (compute_share.cc)
  int64_t gappy_until_ns = 0;   // holding turns it left the GPU idle (3 windows): no turns until then
  bool saturating = false;      // the last tick's verdict
  uint64_t held_word = 0;       // the turn word of the turn it holds (a new one restarts the window)
  // Do turns pay? (compute_share.cc, "Turns that do not pay".) The governor sets tick_launches
  // to the launches its process made since the last tick; the region adds them up, with the
  // time, while the process saturates beside others with turns in force and without.
  int64_t tick_launches = 0;
  int64_t with_turns_ns = 0, with_turns_launches = 0, with_turns_charged_ns = 0;
  int64_t last_with_tick_ns = 0;  // the last tick added to the sums with turns
  int64_t without_ns = 0, without_launches = 0, without_charged_ns = 0;
  int64_t next_probe_ns = 0;    // when the next comparison may start a probe without turns
  int64_t probe_until_ns = 0;   // the probe under way ends then (its saved turn tokens are kept)
  int64_t probe_span_ns = 0;    // the probes' length since the sums without turns were cleared,
  int64_t probe_alone_ns = 0;   //   and their ticks saturating with nobody else wanting the GPU
  bool reprobe = false;         // a probe found it saturating too little: the next check probes afresh
  uint32_t probes_unsaturated = 0;  // probes in which it had work queued less than half of the time
                                    //   others wanted the GPU
  int64_t last_contended_ns = 0;  // the last tick another vGPU wanted the GPU (a spell of contention
  uint32_t spell_checks = 0;      //   ends after kTurnsPaySpellGapNs without), and its comparisons
  uint32_t turns_unpaid = 0;    // how many comparisons found turns not paying, and paying (for the log)
  uint32_t turns_paid = 0;
  bool last_check_paid = false;  // the spell's last comparison kept turns (a narrow contrary one is made again)
  int64_t unpaid_since_ns = 0;   // the comparison that left turns (0: out of turns for no such verdict),
  uint32_t unpaid_extended = 0;  //   how often it stayed out without trying turns, and the last
  int64_t last_extend_permille = 0;  //   work per charge it read then against that comparison's with turns
  bool unpaid_by_second = false;  // the per-second rule held at that comparison (StillUnpaid), and
  int64_t last_extend_wall_permille = 0;  //   the work per second read at the last extension
  uint32_t checks_repeated = 0;  // narrow comparisons made again before turns were left (for the log)
  bool thinning = false;         // a narrow comparison on a thin sample with turns waits for more,
  uint32_t thin_waits = 0;       //   and how often one did (for the log)
  int64_t last_ratio_permille = 0;  // the last comparison: work per charge without turns / with, x 1000
  int64_t last_wall_permille = 0;   //   and work per second without turns / with, x 1000
  uint32_t comparisons = 0;         // comparisons made, and the sums the last one compared (for
  int64_t last_with[3] = {}, last_without[3] = {};  //   TFUSION_SHARE_DEBUG): ns, launches, charged ns
};
// A turn's length unless TFUSION_SHARE_TURN_MS says otherwise (0: off), and how long a
// tenant found gappy stays out of turns.
inline constexpr int64_t kShareTurnNs = 25'000'000;
// The period of planned turns unless TFUSION_SHARE_TURN_PERIOD_MS says otherwise (0: fixed turns
// of kShareTurnNs as before): each saturating hard slice runs its share of it in one turn, so two
// tenants hand the GPU over about ten times a second whatever their split.
inline constexpr int64_t kShareTurnPeriodNs = 200'000'000;
inline constexpr int64_t kShareGappyNs = 5'000'000'000;
// Turns that do not pay: a saturating process that starts contending measures its launches per
// GPU ns charged without turns (a probe of kTurnsPayProbeNs) and then with them; after
// kTurnsPayWindowNs with turns (with the per-second rule, whole cycles of its turns) it compares
// the two, and when it did more than kTurnsPayPermille / 1000 times as much without them it leaves
// turns for kTurnsUnpaidNs; when turns pay, it compares
// again after kTurnsPayRecheckNs. The first comparison of a spell of contention is repeated after
// kTurnsPayFirstRecheckNs when it kept turns on a reading below kTurnsPayStartUpPermille / 1000: it
// is made as the tenants start, and a start-up (autotuning, first launches of each kernel) may make
// the rate without turns look far lower than the tenant's loop gets. (On an H100 batch-1 tenants
// kept turns at 0.20-0.66, all before a fix of the governor's launch counting; since it every
// launch-bound first comparison seen read 0.97 or more.) A reading the GPU's switching loss
// explains (spin kernels: 0.81-1.02 at 108 first comparisons on an H100) stands until
// kTurnsPayRecheckNs: a recheck's probe time-slices every tenant for a period, and on an H100 it
// cost the 25% tenant of a 25/75 spin pair 15-20 ms of GPU time each time. A start-up that reads
// like the switching loss keeps turns until then.
// A spell ends after kTurnsPaySpellGapNs in which nobody else wanted the GPU; the next one starts
// with a fresh probe (a tenant out of turns that did not pay stays out: kTurnsUnpaidMaxNs).
inline constexpr int64_t kTurnsPayWindowNs = 300'000'000;
inline constexpr int64_t kTurnsPayFirstRecheckNs = 2'000'000'000;
inline constexpr int64_t kTurnsPayStartUpPermille = 750;
inline constexpr int64_t kTurnsPaySpellGapNs = 1'000'000'000;
inline constexpr int64_t kTurnsPayProbeNs = 300'000'000;
// A recheck's probe lasts one period of planned turns (kTurnsPayRecheckProbeNs with fixed turns or
// a period outside 100-300 ms): in a period every hard slice has its one turn, so a probe that
// replaces one leaves each tenant as many turns as it would have had. (A probe of 300 ms, half a
// period more, handed the next turn out of order, and one tenant lost a turn in that second.)
inline constexpr int64_t kTurnsPayRecheckProbeNs = 200'000'000;
inline constexpr int64_t kTurnsPayPermille = 1150;
// With ShareTurn::turns_per_second (the governor's default; TFUSION_SHARE_TURNS_PER_SECOND=0 turns
// it off) it also leaves them when it did kTurnsPayFloorPermille / 1000 times as much per charge and
// kTurnsPayWallPermille / 1000 times as much per second without them: a launch-bound tenant whose
// turns leave the GPU idle (on an H200 two batch-1 ResNet-50 tenants at 50% read 0.96-1.22 per
// charge and 1.00-1.47 per second at their comparisons, all but one 1.10 or more, and by the
// charge alone kept turns except at five comparisons of 1.15-1.22).
// Saturating spin tenants read 0.81-1.02 per charge at first comparisons on an H100; per second
// they read 0.70-1.73 until the rule measured whole cycles of turns and counted work over the time
// it was earned in (compute_share.cc, TurnsPayWindowNs), and since then, as per charge, below 1.
inline constexpr int64_t kTurnsPayFloorPermille = 1030;
inline constexpr int64_t kTurnsPayWallPermille = 1100;
inline constexpr int64_t kTurnsUnpaidNs = 60'000'000'000;
// Out of turns that did not pay, a tenant tries them again only when its work has changed: as
// kTurnsUnpaidNs ends it compares its launches per charge over that time (without turns) to what
// the comparison that left turns measured with them, and while that is still kTurnsPayConfirmPermille
// / 1000 times as much (or, where the per-second rule held at that comparison, while that rule still
// holds) it stays out another kTurnsUnpaidNs, up to kTurnsUnpaidMaxNs after that comparison (across
// spells of contention; the sums without turns are the current spell's). A turn alone is charged its
// whole length, so the rate with turns is the tenant's own; a change of its own work lowers the rate
// without them, new neighbours lower its launches and its charge alike and do not (per second they
// do: a tenant kept out by the per-second rule alone tries turns again beside them). Trying turns
// costs a launch-bound tenant most of that time's work (four ResNet-50 b1 tenants at 25% each run a
// quarter of their rate for 300 ms: about 0.4% of each minute, and several points of an 8 s
// benchmark round that a retry falls in).
inline constexpr int64_t kTurnsUnpaidMaxNs = 600'000'000'000;
// A comparison that finds turns not paying per charge by less than kTurnsPayConfirmPermille / 1000,
// after the spell's last comparison found them paying, is made once more before turns are left: it
// starts again (kTurnsPayConfirmNs with turns, then a probe). A recheck can read high: on an H100 a
// 4 x 25 group of spin tenants read 1.12-1.26 two seconds in (0.95-1.05 at its first comparison),
// and the one tenant past 1.15 stopped everyone's turns for a minute. The repeat is made by that
// tenant alone (the others keep their turns). The cost: a launch-bound pair whose first comparison
// was fooled by its start-up and that reads 1.15-1.3 at the recheck keeps turns 1.2 s longer
// (ResNet-50 b1 pairs read 1.15-1.21 at their first comparison); a tenant whose readings alternate
// around 1.15 keeps turns, with one more probe each 30 s.
inline constexpr int64_t kTurnsPayConfirmPermille = 1300;
// A comparison that would leave turns narrowly (below kTurnsPayConfirmPermille, per charge) while
// the tenant was charged less than half its limit's share of kTurnsPayWindowNs with turns is not
// made yet: the sums with turns go on until it has that much, or kTurnsPayThinMaxNs with turns.
// On an H100 the 25% tenant of a 25/75 spin pair read 1.15 at its first comparison (3.54 times as
// much per second): by those two ratios it was charged about 30 ms in its 300 ms with turns (most
// likely having spent its tokens in the probe; 49-52 ms in six other groups that day, which read
// 0.84-0.93), and time-sliced for a minute it got 20.6% of the GPU. Launch-bound tenants are thin
// but read by far: ResNet-50 b1 at N = 4 (13-15 ms charged at 25%) read 1.47-1.68; pairs at 50%
// are charged 113-138 ms, not thin.
inline constexpr int64_t kTurnsPayThinMaxNs = 1'000'000'000;
// The longest the per-second rule measures with turns (whole cycles of a small share's turns).
inline constexpr int64_t kTurnsPayCycleMaxNs = 1'000'000'000;
inline constexpr int64_t kTurnsPayConfirmNs = 1'000'000'000;
inline constexpr int64_t kTurnsPayRecheckNs = 30'000'000'000;
const char* ShareHoldName(ShareHold h);

struct ShareVerdict {
  ShareHold hold = ShareHold::kRun;
  RegionError error = RegionError::kOk;
  int64_t retry_after_ns = 0;    // when to look again at the latest (<= 20 ms): when holding, or
                                 //   when the turn this process holds ends
  int64_t charged_ns = 0;        // GPU-busy ns this tick charged to the vGPU
  uint64_t scale_ppm = 0;        // the contention scale applied (1,000,000 = none)
  bool others_want = false;      // another vGPU wants the GPU (alone otherwise)
};

// A vGPU whose processes had work in flight or were held back within this long is "wanting".
inline constexpr int64_t kDemandTtlNs = 3'000'000;

struct VgpuInfo {
  uint32_t index;
  char id[kVgpuIdBytes];
  uint64_t vram_limit_bytes;
  uint64_t vram_used_bytes;
  uint64_t compute_share_ppm;   // the request
  uint64_t compute_limit_ppm;   // the ceiling
  uint32_t qos;
  int64_t tokens_ns;            // limit bucket
  int64_t request_tokens_ns;    // request bucket (shared mode)
  int64_t last_demand_ns;       // CLOCK_MONOTONIC ns it last had work in flight or was held
  uint64_t busy_ns_total;
  uint64_t throttled_ns_total;
  // Shared mode: the part of throttled_ns_total spent waiting for another vGPU's turn, at the
  // limit, and over the request while another vGPU was owed or a higher QoS borrowed.
  uint64_t held_turn_ns_total;
  uint64_t held_limit_ns_total;
  uint64_t held_others_ns_total;
  uint64_t launches_total;
  uint64_t leases_total;
  uint64_t oom_total;
  uint64_t drift_events;
  uint32_t process_count;
  bool tier_enabled;            // its processes allocate movable VRAM
  uint64_t idle_swap_ms;        // idle time before an automatic swap-out; 0 = never
  uint64_t idle_disk_ms;        // idle time before swapped copies move to the disk tier; 0 = never
  bool held;                    // suspended by a preemption: swapped out, GPU calls wait
  uint64_t idle_zero_ms;        // swapped and idle this long: checkpointed by its zero keeper; 0 = never
};

struct ProcessInfo {
  uint32_t slot;
  uint32_t vgpu_index;
  int32_t pid;
  uint64_t start_time_ticks;
  uint64_t vram_bytes;
  uint64_t throttled_ns;
  bool waiting;
  bool holds_lease;
  int64_t active_until_ns;      // shared mode: GPU work in flight until then (CLOCK_MONOTONIC)
  // VRAM tiering (ProcessTier): where its movable VRAM is.
  uint32_t tier_state;          // TierState
  uint32_t tier_last_error;     // CUresult of its last failed swap, 0 = none
  int64_t last_active_ns;       // CLOCK_MONOTONIC ns of its last GPU call seen; 0 = unknown
  uint64_t movable_bytes;
  uint64_t host_bytes;          // of movable_bytes, now in the host tier
  uint64_t fixed_bytes;         // charged VRAM that cannot move
  uint32_t swaps_out;
  uint32_t swaps_in;
  uint32_t last_out_us;
  uint32_t last_in_us;
  // Scale to zero (ProcessZero); tier_state reads kTierCheckpointed while checkpointed.
  uint32_t zero_state;          // ZeroState
  uint32_t zero_last_error;     // CUresult of its last failed checkpoint or restore, 0 = none
  uint32_t checkpoints;
  uint32_t restores;
  uint32_t last_checkpoint_us;
  uint32_t last_restore_us;
};

// A point-in-time copy for `tfusion smi` (values are read without locks: each is exact, the set
// is not one atomic cut). About 40 KiB; callers may keep it on the heap.
struct RegionSnapshot {
  char gpu_uuid[kGpuUuidBytes];
  char gpu_name[kGpuNameBytes];
  uint64_t total_vram_bytes;
  uint64_t capacity_mtflops;
  int32_t lease_owner_slot;  // -1 when FREE
  uint64_t lease_steals_total;
  uint64_t contention_scale_ppm;  // shared mode: raw busy time is charged x this / 1e6
  uint32_t active_processes;      // shared mode: processes with work in flight at the last tick
  int64_t snapshot_ns;            // CLOCK_MONOTONIC ns the snapshot was taken
  uint64_t host_tier_budget_bytes;
  uint64_t host_tier_used_bytes;
  uint64_t swaps_out_total, swaps_in_total, bytes_out_total, bytes_in_total, swap_failures_total;
  uint32_t vgpu_count;
  VgpuInfo vgpus[kMaxVgpus];
  uint32_t process_count;
  ProcessInfo processes[kMaxProcesses];
};

// "resident", "swapping out", "swapped", "swapping in", "on disk", "checkpointed"; "off" for kTierOff or unknown.
const char* TierStateLabel(uint32_t state);
// Zeroes a vGPU's or a process's tier block (a new vGPU, a newly attached process).
void ResetVgpuTier(VgpuTier* t);
void ResetProcessTier(ProcessTier* t);
// Scale to zero (zero_region.cc): zeroes a newly attached process's block; copies it into a
// snapshot entry (tier_state becomes kTierCheckpointed while the driver holds its checkpoint).
void ResetProcessZero(ProcessZero* z);
void FillZeroInfo(const ProcessZero* z, ProcessInfo* out);
// Swap events (tier_events.cc): zeroes a newly attached process's ring; "idle", "freeze",
// "pressure", "preemption", "thaw", "GPU call", else "unknown".
void ResetProcessTierLog(ProcessTierLog* l);
const char* TierEventCauseLabel(uint32_t cause);

// A swap event as the process records it (bytes are rounded up to MiB in the region).
struct TierEvent {
  uint32_t kind = 0;   // TierEventKind
  uint32_t cause = 0;  // TierEventCause
  uint32_t duration_us = 0;
  uint64_t host_bytes = 0;
  uint64_t disk_bytes = 0;
};
// A swap event as read back, checked: kind and cause known, MiB not above the GPU's VRAM.
struct TierEventRead {
  uint32_t kind = 0;
  uint32_t cause = 0;
  uint32_t duration_us = 0;
  uint32_t host_mib = 0;
  uint32_t disk_mib = 0;
};
// The host tier of a new region: the GPU's VRAM, at most half of this machine's memory.
uint64_t DefaultHostTierBudget(uint64_t total_vram_bytes);

class GpuRegion {
 public:
  GpuRegion() = default;
  ~GpuRegion() { Detach(); }
  GpuRegion(GpuRegion&& other) noexcept;
  GpuRegion& operator=(GpuRegion&& other) noexcept;
  GpuRegion(const GpuRegion&) = delete;
  GpuRegion& operator=(const GpuRegion&) = delete;

  // Writes "<dir>/gpu-<uuid>.region" into buf. Returns false if it does not fit.
  static bool RegionPath(const char* dir, const char* uuid, char* buf, size_t len);

  // Creates the region for one GPU, or attaches to the existing one if it is compatible (same
  // layout, same uuid and total VRAM; capacity_mtflops and gpu name are then updated).
  // Creates `dir` (mode 01777) if missing; the file is 0666. The file appears atomically: it is
  // built under a temporary name and published with link(2), so no process ever sees a half
  // initialised header and a racing creator never replaces a region already in use (the loser
  // attaches to the winner's). On failure *out is left detached.
  static RegionError Create(const char* dir, const char* uuid, const char* name,
                            uint64_t total_vram_bytes, uint64_t capacity_mtflops, GpuRegion* out,
                            RegionErrorDetail* why = nullptr);

  // Maps an existing region read-write. Refuses (never ignores) a bad magic, a different
  // layout_version, any size mismatch and a truncated file, with a reason in *why.
  static RegionError Attach(const char* path, GpuRegion* out, RegionErrorDetail* why = nullptr);

  // Unmaps. Does not detach this process's slots (DetachProcess does). Idempotent.
  void Detach();
  bool attached() const { return base_ != nullptr; }
  const char* path() const { return path_; }
  const char* gpu_uuid() const { return header()->gpu_uuid; }
  const char* gpu_name() const { return header()->gpu_name; }
  uint64_t total_vram_bytes() const { return header()->total_vram_bytes; }
  uint64_t capacity_mtflops() const { return header()->capacity_mtflops.load(std::memory_order_relaxed); }

  // ---- vGPU table (owner side: node agent / tfusion run) ----

  // Creates the vGPU `id` (1..63 chars) or updates the limits of the existing one. A lowered
  // limit below current use is accepted: further Reserve calls fail until use drops.
  // Compute: request_ppm (guaranteed under contention) > 0, limit_ppm (ceiling) >= request_ppm,
  // qos 0..kMaxQos; both >= kShareWholeGpuPpm means unthrottled. kInvalidArgument otherwise,
  // changing nothing. kFull when 64 exist.
  RegionError CreateOrUpdateVgpu(const char* id, uint64_t vram_limit_bytes, uint64_t request_ppm,
                                 uint64_t limit_ppm, uint32_t qos, uint32_t* index_out);
  // Request = limit = compute_share_ppm, QoS medium.
  RegionError CreateOrUpdateVgpu(const char* id, uint64_t vram_limit_bytes,
                                 uint64_t compute_share_ppm, uint32_t* index_out);
  RegionError FindVgpu(const char* id, uint32_t* index_out) const;
  // Changes the compute request and limit of the existing vGPU `id` in place, never creating one
  // (a vGPU its owner just removed stays removed): kNotFound when there is none; kInvalidArgument
  // for values CreateOrUpdateVgpu refuses, changing nothing.
  RegionError UpdateVgpuCompute(const char* id, uint64_t request_ppm, uint64_t limit_ppm);
  // Frees the vGPU slot. Reaps dead processes first; kBusy while a live process is attached.
  // With `expected_id`: kNotFound unless the slot still holds the vGPU of that id (checked under
  // the table lock, so that a slot freed and taken by another vGPU since its index was looked up
  // is left alone).
  RegionError RemoveVgpu(uint32_t vgpu_index, const char* expected_id = nullptr);

  // ---- process table ----

  // Registers process `pid` (usually getpid()) as a user of vGPU `vgpu_index` and returns its
  // process slot; the slot's identity is (pid, start time). If the table is full, dead slots are
  // reaped and the search retried once. kNotFound when pid does not exist.
  RegionError AttachProcess(uint32_t vgpu_index, pid_t pid, uint32_t* slot_out);
  // Frees the slot, returning all VRAM it held to its vGPU, and the lease if it held it.
  RegionError DetachProcess(uint32_t slot);
  // Frees the slots of processes that no longer exist (gone, zombie, or pid reused: start time
  // differs), with their VRAM and lease. Returns how many were freed. Costs one /proc read per
  // active slot (a few us each): never call it per allocation.
  uint32_t ReapDead();
  // Same, restricted to processes of one vGPU.
  uint32_t ReapDeadOfVgpu(uint32_t vgpu_index);

  // ---- VRAM ledger (limiter side; bytes should already be rounded to the driver granularity) ----

  // Atomically across processes: if used + bytes <= limit, adds bytes to the vGPU and to this
  // process slot and returns kOk; else reaps dead processes of this vGPU, retries once, and then
  // returns kOutOfMemory (counted in oom_total). Call before the real allocation; Release if the
  // allocation then fails. Cost: one uncontended robust lock, ~50 ns.
  RegionError Reserve(uint32_t slot, uint64_t bytes);
  // Returns bytes from this process slot to its vGPU. Never underflows: releasing more than the
  // slot holds releases what it holds and counts a drift event (returned as kInvalidArgument, the
  // accounting is still consistent).
  RegionError Release(uint32_t slot, uint64_t bytes);
  // Momentary values, lock-free. 0 for an invalid index.
  uint64_t Used(uint32_t vgpu_index) const;
  uint64_t Limit(uint32_t vgpu_index) const;
  uint64_t ProcessBytes(uint32_t slot) const;

  // ---- compute lease (limiter hook layer) ----
  //
  // Protocol per process slot (the hook layer REQUIRES that at most one thread of a process acts
  // on its slot's lease at a time):
  //   g = TryAcquireLease(slot, now, quantum);
  //   if (g.unthrottled) submit freely;            // never touches the lease
  //   else if (g.granted) { submit until g.deadline_ns; ReleaseLease(slot, measured_busy, now); }
  //   else WaitForLease(slot, timeout) and try again.

  // Refills the vGPU's bucket (share x elapsed, capped at max(share x 100 ms, 2 ms)), then grants
  // when tokens > 0 and the lease is FREE (or already ours), honouring a pending handoff hint for
  // someone else. Steals the lease from a dead holder, or from one more than 1 s past its deadline.
  // Lock-free; ~50-100 ns uncontended (one /proc read only when the holder is overdue).
  LeaseGrant TryAcquireLease(uint32_t slot, int64_t now_ns, int64_t quantum_ns);
  // Debits measured_busy_ns (GPU-busy time measured with events, >= 0) from the vGPU's bucket
  // (debt is carried), adds it to busy_ns_total, hands the lease to the longest-waiting process
  // whose vGPU has tokens (200 us hint), frees the word and wakes waiters. kNotHolder when the
  // lease had been stolen meanwhile (the time is still charged).
  // already_charged_ns: what ExtendLease debited provisionally during this lease; the bucket is
  // debited measured_busy_ns - already_charged_ns (a negative difference is credited back).
  RegionError ReleaseLease(uint32_t slot, int64_t measured_busy_ns, int64_t now_ns,
                           int64_t already_charged_ns = 0);
  // Renews the holder's lease for another quantum without the drain and hand-over a release
  // costs, when no waiting process of any vGPU could use the lease and this vGPU's bucket still
  // holds more than provisional_ns. provisional_ns (an upper bound of the GPU time used since the
  // last renewal: the wall time) is then debited at once, so the bucket tracks use while the
  // lease runs on; ReleaseLease reconciles it with the measured time. Lock-free.
  // Returns granted with the new deadline, or denied (the caller releases as usual).
  LeaseGrant ExtendLease(uint32_t slot, int64_t now_ns, int64_t quantum_ns, int64_t provisional_ns);
  // Sleeps (shared futex on the generation word) until the lease is released, this vGPU's bucket
  // refills, a handoff hint expires, or timeout_ns passes, whichever is first; returns at once
  // when there is nothing to wait for. Marks the slot as waiting (for handoff) until its next
  // grant, and adds the time slept to throttled counters. Returns the ns slept.
  int64_t WaitForLease(uint32_t slot, int64_t timeout_ns);
  // Stops counting this slot as waiting (a process that no longer wants the lease). Optional.
  void CancelWait(uint32_t slot);
  // Adds n to the vGPU's launches_total (relaxed; batch it, it is a shared cache line).
  void CountLaunches(uint32_t slot, uint64_t n);

  // ---- shared compute mode (limiter governor; compute_share.cc) ----

  // One governor tick of process `slot`: charges raw_busy_ns (GPU-busy ns its kernels used since
  // the last tick, measured with events) x the GPU's contention scale to its vGPU, refills the
  // vGPU's limit and request buckets, records whether it is active (in_flight: work still queued)
  // or held (it was holding back during the tick: counted as throttled time), and says whether it
  // must hold back now. Lock-free; costs a scan of the 64 vGPU slots.
  // `turn` (optional): the process's turn state; without it the process never takes turns.
  ShareVerdict ShareTick(uint32_t slot, int64_t now_ns, int64_t tick_ns, int64_t raw_busy_ns,
                         bool in_flight, bool held, ShareTurn* turn = nullptr);
  // The process has no work in flight and wants nothing (stops counting it as active).
  void ShareIdle(uint32_t slot);

  // ---- VRAM tiering (tier_region.cc; the protocol is in docs/shm-layout.md) ----
  // Owner side: whether the vGPU's processes allocate movable VRAM, and its idle timeout
  // (0 = never swapped automatically). Read by a process when it binds.
  RegionError SetTierPolicy(uint32_t vgpu_index, bool enabled, uint64_t idle_swap_ms, uint64_t idle_disk_ms = 0);
  // Preemption: while held, the vGPU's processes keep their movable VRAM swapped out and their
  // GPU calls wait instead of swapping in (VgpuTier::held). kNotFound for a free slot.
  RegionError SetHold(uint32_t vgpu_index, bool held);
  // Bytes of host memory the swapped copies of this GPU's tenants may hold together (0: none).
  void SetHostTierBudget(uint64_t bytes);
  // Asks every process of the vGPU to swap its movable VRAM out (freeze) or back in (thaw) and
  // returns the request's generation (compare with ProcessTier::freeze_done_gen/thaw_done_gen).
  // kInvalidArgument for a vGPU without tiering, kNotFound for a free slot.
  RegionError RequestFreeze(uint32_t vgpu_index, uint32_t* gen_out);
  // The same, asked by a tenant short of VRAM: the swap-outs it causes are reported as pressure
  // (VgpuTier::pressure_freeze_gen).
  RegionError RequestPressureFreeze(uint32_t vgpu_index, uint32_t* gen_out);
  RegionError RequestThaw(uint32_t vgpu_index, uint32_t* gen_out);
  // Scale to zero, carried out by the vGPU's zero keeper (hypervisor::ZeroRestorer in `tfusion
  // run` and the node agent): the idle time after which a swapped process is checkpointed too
  // (0 = never), and a request to checkpoint every process once it is swapped out (made with a
  // freeze). kInvalidArgument without tiering, kNotFound for a free slot.
  RegionError SetIdleZero(uint32_t vgpu_index, uint64_t idle_zero_ms);
  RegionError RequestZero(uint32_t vgpu_index);
  // Host-tier budget: true when `bytes` more fit (then counted as used).
  bool ReserveHostTier(uint64_t bytes);
  void ReleaseHostTier(uint64_t bytes);
  // Pinned host copies a process keeps after a swap-in for its next swap-out: counted in the
  // budget (reserved by the swap-out that made them), returned by the reap if it dies. Another
  // process short of budget asks every keeper to free them (TierHeader::reclaim_gen).
  void SetHostKept(uint32_t slot, uint64_t bytes);
  void RequestHostReclaim(uint64_t need_bytes);
  uint32_t HostReclaimGen() const;
  // Whether the budget left is below the last reclaim request's need.
  bool HostReclaimStillShort() const;
  // The tier blocks, for the limiter of the process that owns `slot` (writer) and for readers.
  // nullptr for an index out of range.
  VgpuTier* TierOfVgpu(uint32_t vgpu_index) const;
  ProcessTier* TierOfProcess(uint32_t slot) const;
  // Scale to zero: the process's checkpoint handshake block (protocol in region_layout.h).
  // nullptr for an index out of range.
  ProcessZero* ZeroOfProcess(uint32_t slot) const;
  // Swap events (ProcessTierLog): the owning process records each completed one; readers get the
  // number completed so far and event n (1-based) while it is still in the ring, intact and valid
  // (false otherwise: overwritten, being written, or out of range).
  ProcessTierLog* TierLogOfProcess(uint32_t slot) const;
  void RecordTierEvent(uint32_t slot, const TierEvent& e);
  uint32_t TierEventCount(uint32_t slot) const;
  bool ReadTierEvent(uint32_t slot, uint32_t n, TierEventRead* out) const;
  TierHeader* tier_header() const { return reinterpret_cast<TierHeader*>(base_ + kTierHeaderOffset); }

  // ---- observation ----
  void Snapshot(RegionSnapshot* out) const;

  // A process's turns check (compute_share.cc, "Turns that do not pay"), on its own view alone: a
  // tick's time, charge and launches (turn->tick_launches), whether others want the GPU and
  // whether turns apply to it. Called by ShareTick; public so that it can be driven tick by tick.
  static void CheckTurnsPay(int64_t now_ns, int64_t tick_ns, int64_t charged_ns, int64_t limit_ppm, bool others_want,
                            bool turns_apply, ShareTurn* turn);

 private:
  RegionHeader* header() const { return reinterpret_cast<RegionHeader*>(base_); }
  VgpuSlot* vgpu(uint32_t i) const {
    return reinterpret_cast<VgpuSlot*>(base_ + kVgpuArrayOffset) + i;
  }
  ProcessSlot* process(uint32_t i) const {
    return reinterpret_cast<ProcessSlot*>(base_ + kProcessArrayOffset) + i;
  }
  LeaseBlock* lease() const { return reinterpret_cast<LeaseBlock*>(base_ + kLeaseOffset); }
  // eligible: this vGPU may take turns now (a hard slice always; a burstable one while the
  // requests of the vGPUs that want the GPU fill it).
  void TakeTurns(uint32_t mine, int64_t now_ns, int64_t tick_ns, bool in_flight, bool held, bool eligible,
                 int64_t limit_tokens, int64_t limit_ppm, ShareTurn* turn, ShareVerdict* out);
  // Planned turns (turn->period_ns > 0): the holder hands over at its planned end.
  void PlannedTurns(uint32_t mine, int64_t now_ns, int64_t limit_tokens, int64_t limit_ppm, uint64_t mask,
                    uint64_t word, bool alive, ShareTurn* turn, ShareVerdict* out);
  // How long vGPU i has had the tokens for its turn, in ns of its share (< 0: how long until it
  // has them); false when it does not want the GPU or has no bucket to take turns with.
  bool ReadyFor(uint32_t i, int64_t now_ns, const ShareTurn& turn, int64_t* ready_for) const;
  // Among the saturating vGPUs that want the GPU (`mask`), whether this one (`have` ns of tokens
  // beyond what a turn needs, at `lim` ppm) is nearest to ready for its turn (ties: lowest index).
  bool NearestToReady(uint32_t mine, int64_t have, int64_t lim, uint64_t mask, int64_t now_ns,
                      const ShareTurn& turn) const;
  // Another vGPU wants the GPU and is not saturating (nobody takes turns then).
  bool OthersWantUnsaturated(uint32_t mine, uint64_t saturating_mask, int64_t now_ns) const;
  // Whether another vGPU wants the GPU, and whether one that is not saturating does (mask: the
  // saturating vGPUs).
  void ScanOthers(uint32_t mine, uint64_t mask, int64_t now_ns, bool* want, bool* unsaturated) const;
  static bool StillUnpaid(int64_t now_ns, ShareTurn* turn);
  ShareBlock* share() const { return reinterpret_cast<ShareBlock*>(base_ + kShareOffset); }
  // Whether `slot` is an active process slot of a valid vGPU; *vgpu_index (when given) gets the
  // index it checked. Callers use that value and never load the slot's vgpu_index again: any
  // tenant may rewrite it between two loads (the region is world-writable).
  bool ValidActiveProcess(uint32_t slot, uint32_t* vgpu_index = nullptr) const;

  RegionError LockTable();
  RegionError LockVgpu(uint32_t vgpu_index);
  // REQUIRES table_mutex and the mutex of vGPU `vgpu_index` held, where vgpu_index (the slot's,
  // loaded once by the caller) is < kMaxVgpus; one >= kMaxVgpus (a scribbled slot) frees the slot
  // without returning its bytes to any vGPU.
  void FreeProcessSlotLocked(uint32_t slot, uint32_t vgpu_index);
  uint32_t Reap(int64_t only_vgpu);  // only_vgpu < 0: all
  // Lease helpers (compute_lease.cc).
  int64_t RefillTokens(VgpuSlot* v, int64_t now_ns);
  void FreeLeaseIfHeldBy(uint32_t slot);
  int32_t PickHandoffTarget(uint32_t releaser, int64_t now_ns) const;
  // Processes with work in flight now, counting `self` as one; the vGPUs of the others in a mask.
  uint32_t ActiveProcesses(uint32_t self, int64_t now_ns, uint64_t* vgpus_in_flight) const;
  void ClearWaiting(ProcessSlot* p);  // wait_since_ns -> 0, keeping LeaseBlock::wanting exact

  static RegionError MapFile(int fd, const char* path, GpuRegion* out, RegionErrorDetail* why);

  uint8_t* base_ = nullptr;
  size_t map_size_ = 0;
  char path_[256] = {};
};

}  // namespace tf::limiter
