// Helpers shared by the client stub's entry-point files (client_F.cc, one per family of
// api/remote_surface.tsv, and client_local.cc for what is answered without a round trip).
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <cstdint>

#include "client/client.h"
#include "worker/session_handles.h"  // HandleKind: the kinds of the generated surface

namespace tf::client {

#define TF_LOCK(name)                       \
  Locked name;                              \
  if (name.session() == nullptr) return name.result();

#define TF_CTX(lock)                                                    \
  if (CUresult ctx_r_ = PrepareContext(lock.session(), true); ctx_r_ != CUDA_SUCCESS) \
    return ctx_r_;

// For context-independent calls (libraries and kernels, cudart registers its fatbins before any
// context exists): the worker uses the caller's context when there is one.
#define TF_CTX_IF_ANY(lock)                                                         \
  if (CUresult ctx_r_ = PrepareContextIfAny(lock.session()); ctx_r_ != CUDA_SUCCESS) \
    return ctx_r_;

// Sends a fixed payload synchronously and returns the result (no outputs).
CUresult Simple(Locked& l, driver::Fn fn, const transport::Writer& w);

// Answers a query repeated often (kernel attributes and functions, primary context state,
// context limits, occupancy) from Session::answers when the same question was answered before.
// REQUIRES State().mu.
inline bool CachedAnswer(Session* s, driver::Fn fn, uint64_t a, uint64_t b, uint64_t c,
                         uint64_t* v, uint64_t d = 0) {
  auto it = s->answers.find({static_cast<int>(fn), a, b, c, d});
  if (it == s->answers.end()) return false;
  *v = it->second;
  return true;
}
inline void StoreAnswer(Session* s, driver::Fn fn, uint64_t a, uint64_t b, uint64_t c, uint64_t v,
                        uint64_t d = 0) {
  s->answers[{static_cast<int>(fn), a, b, c, d}] = v;
}
// The same for a text answer (a generated `str=` output with `cache=`: a device's PCI bus id),
// kept for the connection. REQUIRES State().mu.
inline const std::string* CachedText(Session* s, driver::Fn fn, uint64_t a, uint64_t b, uint64_t c,
                                     uint64_t d) {
  auto it = s->text_answers.find({static_cast<int>(fn), a, b, c, d});
  return it == s->text_answers.end() ? nullptr : &it->second;
}
inline void StoreText(Session* s, driver::Fn fn, uint64_t a, uint64_t b, uint64_t c, uint64_t d,
                      std::string v) {
  s->text_answers[{static_cast<int>(fn), a, b, c, d}] = std::move(v);
}
// Forgets every cached answer of one entry point (after a call that may change them).
inline void ForgetAnswers(Session* s, driver::Fn fn) {
  const int f = static_cast<int>(fn);
  s->answers.erase(s->answers.lower_bound({f, 0, 0, 0, 0}),
                   s->answers.lower_bound({f + 1, 0, 0, 0, 0}));
}

// Forgets the cached answers of one entry point about one handle (the first key).
inline void ForgetAnswersAbout(Session* s, driver::Fn fn, uint64_t a) {
  const int f = static_cast<int>(fn);
  s->answers.erase(s->answers.lower_bound({f, a, 0, 0, 0}),
                   a == UINT64_MAX ? s->answers.lower_bound({f + 1, 0, 0, 0, 0})
                                   : s->answers.lower_bound({f, a + 1, 0, 0, 0}));
}
// Drops the cached occupancy answers (client_occupancy.cc); REQUIRES State().mu. Called when an
// attribute or the cache configuration of a function, kernel or context changes, and with the
// answers about functions below.
void ForgetOccupancy(Session* s);

// Function and kernel handles may be reused once their module, library or context is gone: the
// answers about them (occupancy included), and the attribute values this client set on them, go
// with them.
inline void ForgetFunctionAnswers(Session* s) {
  for (driver::Fn fn : {driver::Fn::cuKernelGetFunction, driver::Fn::cuKernelGetAttribute,
                        driver::Fn::cuKernelSetAttribute, driver::Fn::cuFuncSetAttribute}) {
    ForgetAnswers(s, fn);
  }
  ForgetOccupancy(s);
  s->other_function_names.clear();
}

// Forgets the cached answers about a stream (destroyed, or its priority set), or about every
// stream and context (a context destroyed); client_queries.cc. REQUIRES State().mu.
void ForgetStreamAnswers(Session* s, uint64_t stream);
void ForgetContextAnswers(Session* s);

// The generated entry points (tf_remote_client.cc, api/remote_surface.tsv) created or destroyed
// an object: the client's own tables and answers follow (client_queries.cc). REQUIRES State().mu.
using worker::HandleKind;
void NoteCreatedHandle(Session* s, HandleKind k, uint64_t h);
void NoteDestroyedHandle(Session* s, HandleKind k, uint64_t h);

// A memory location the remote vGPU serves (the `loc=` annotation and the hand-written memory
// calls; client_memops.cc): a device of the session (else CUDA_ERROR_INVALID_DEVICE); host
// locations are refused with a log line naming fn (CUDA_ERROR_NOT_SUPPORTED: the worker's host is
// not this one); NULL or any other type is CUDA_ERROR_INVALID_VALUE. REQUIRES State().mu.
CUresult CheckMemLocation(Session* session, driver::Fn fn, const CUmemLocation* loc);

// Reads a module or library image from a file, NUL-terminated (a PTX file is then a C string):
// CUDA_ERROR_FILE_NOT_FOUND when it cannot be read, CUDA_ERROR_INVALID_IMAGE when it is empty.
CUresult ReadImageFile(const char* fname, std::vector<char>* image);

// Writes a launch configuration's geometry: u32 grid x/y/z, u32 block x/y/z, u32 shared memory,
// u64 stream, u32 attribute count (cuLaunchKernelEx and the cluster-occupancy queries).
inline void WriteLaunchGeometry(const CUlaunchConfig* config, transport::Writer& w) {
  w.U32(config->gridDimX);
  w.U32(config->gridDimY);
  w.U32(config->gridDimZ);
  w.U32(config->blockDimX);
  w.U32(config->blockDimY);
  w.U32(config->blockDimZ);
  w.U32(config->sharedMemBytes);
  w.U64(reinterpret_cast<uint64_t>(config->hStream));
  w.U32(config->numAttrs);
}

inline uint64_t H(const void* p) { return reinterpret_cast<uint64_t>(p); }

// The device of the session with ordinal dev (from the snapshot taken at connect), or nullptr.
inline const DeviceInfo* FindDevice(Session* s, CUdevice dev) {
  if (dev < 0 || static_cast<size_t>(dev) >= s->devices.size()) return nullptr;
  return &s->devices[dev];
}

// Writes a launch's arguments (u32 mode + its encoding, remote_protocol.h) for function `fi`.
// CUDA_ERROR_INVALID_VALUE / NOT_SUPPORTED when they cannot be forwarded.
CUresult WriteLaunchArgs(const FunctionInfo& fi, void** params, void** extra, transport::Writer& w);

// The device allocation containing p, or nullptr. Requires the session.
const DeviceAlloc* FindDeviceAlloc(Session* s, uint64_t p, uint64_t* base = nullptr);
// Records a device allocation made in the thread's current context on `device`.
void RecordDeviceAlloc(Session* s, uint64_t p, uint64_t size, uint64_t pool);

// Sends a module or library image once per connection (by content hash, kOpImageChunk) and
// writes u64 hash_lo, u64 hash_hi, u64 length to w. Requires the session.
CUresult SendImage(Session* s, const void* image, transport::Writer& w);
// The same for n bytes at start whose length the caller knows (linker inputs).
CUresult SendImageBytes(Session* s, const void* start, size_t n, transport::Writer& w);
// Writes device printf output (kEvtConsole) to the application's stdout (client_console.cc).
void WriteConsole(const uint8_t* data, size_t n);
// Reads a function handle's cached state (remote_protocol.h "function info") into fi.
bool ReadFunctionInfo(transport::Reader& rd, FunctionInfo* fi);

// Pushes ctx on the thread's context stack (cuCtxCreate, cuCtxPushCurrent).
void PushCurrentContext(uint64_t ctx);

// Host memory the client allocated or registered (client_host.cc), by address range.
struct HostRange {
  uint64_t base = 0, size = 0;
  unsigned flags = 0;
  bool registered = false;  // cuMemHostRegister (else cuMemAllocHost/cuMemHostAlloc)
  uint64_t ctx = 0;
  int device = 0;
  // A host region shared with the worker of `owner` (0: plain client memory).
  uint64_t region_id = 0;
  const Session* owner = nullptr;
  uint64_t mapped = 0;          // bytes mapped (size rounded up to pages)
  bool same_address = false;    // the worker mapped it at the same address
  uint64_t device_ptr = 0;      // the worker driver's device pointer for base (0: none)
  bool mirror = false;          // mirrored with owner's worker (client_mirror.cc)
  bool managed = false;         // cuMemAllocManaged (a region or a mirror); flags: CU_MEM_ATTACH_*
};
bool FindHostRange(uint64_t p, HostRange* out);
// A primary-context reset (client_reset.cc) frees what the driver frees with the context: the
// page-locked allocations (cuMemAllocHost, cuMemHostAlloc) and managed memory of this session
// (regions and mirrors of s, and plain memory allocated in context `ctx`); registered memory
// stays the program's. HostMemoryFreedByReset lists those ranges before the call;
// HostMemoryAfterReset, once the worker has reset (and dropped every mirror and the listed
// regions), frees them here as cuMemFreeHost / cuMemFree would and turns registered ranges that
// were mirrored into plain ones (mirrored again when a kernel may be given them). REQUIRES
// State().mu.
std::vector<HostRange> HostMemoryFreedByReset(Session* s, uint64_t ctx);
void HostMemoryAfterReset(Session* s, const std::vector<HostRange>& freed);
// Managed memory (client_host.cc): host memory that kernels on the worker reach at the same
// address, a host region (shared memory) or a mirror (TCP). CUDA_ERROR_NOT_SUPPORTED when the
// connection has neither. Require the session and the thread's context.
CUresult AllocManaged(Session* s, size_t bytes, unsigned flags, uint64_t* p);
// Frees managed memory at its base; CUDA_ERROR_INVALID_VALUE when p is not one.
CUresult FreeManaged(Session* s, uint64_t p);
// Forgets the advice and prefetch location kept for managed memory at base (client_managed.cc).
// REQUIRES State().mu.
void ForgetManagedAdvice(uint64_t base);
// Page-locked memory of this process named where device memory is expected (a memset's
// destination, a copy's device operand): under unified addressing it is device-accessible at its
// own address (XLA memsets and reads back a cuMemHostAlloc buffer that its kernels write), so
// where it is plain client memory (TCP) it is mirrored from then on, as when its device pointer is
// asked for (client_host.cc). No-op for device memory and memory the worker already reaches.
// REQUIRES State().mu with the context prepared.
void MirrorIfUsedAsDevice(Session* s, uint64_t p);
// The same for every pointer-sized kernel argument that points into page-locked memory of this
// process (XLA hands kernels a cuMemHostAlloc buffer directly): a compare of two bounds per
// argument when there is none. REQUIRES State().mu.
void MirrorKernelPointers(Session* s, const FunctionInfo& fi, void** params);
// Whether [p, p + n) lies wholly in one host region shared with s's worker. Requires the session.
bool InHostRegion(Session* s, uint64_t p, uint64_t n);
// [p, p + n) lies in one mirrored range of s (client_host.cc): the worker has it at the same
// address, so copies with it go as kOpHostRegionCopy too and the bytes travel as mirror changes.
bool InMirroredHostRange(Session* s, uint64_t p, uint64_t n);
// A copy between device memory and a host region: only addresses travel (kOpHostRegionCopy).
// Requires the session and the context prepared.
CUresult HostRegionCopy(Session* s, uint8_t direction, uint64_t dptr, uint64_t host, uint64_t n,
                        uint64_t stream, bool async);

// The (item, first index it applies to) lists of the batched copies and prefetches (attributes,
// locations): num in 1..count, starting at 0, strictly increasing, below count (client_memops.cc).
bool BatchIndexList(size_t count, const size_t* idxs, size_t num);

// Host nodes (client_callbacks.cc): the id under which the worker's host node runs fn(user) in
// the client; one id per (fn, user), kept until the process ends. Requires the session.
CUresult RegisterHostNode(Session* s, CUhostFn fn, void* user, uint64_t* id);
// A graph launch enqueued n host-node runs (the callback thread polls until they ran).
void HostNodeRunsLaunched(int64_t n);
// The function and argument registered under host-node id `id`; false when there is none.
bool HostNodeFunctionOf(uint64_t id, CUhostFn* fn, void** user);
// A user object's destroy callback fn(user), run once by the callback thread when the worker
// reports the object released under *id (client_user_objects.cc). Forget: the object was not made.
CUresult RegisterUserObjectRelease(Session* s, CUhostFn fn, void* user, uint64_t* id);
void ForgetUserObjectRelease(uint64_t id);
// Runs task on the callback thread (client_callbacks.cc), e.g. a program's asynchronous
// notification callback.
CUresult RunOnCallbackThread(std::function<void()> task);
// n more (negative: fewer) registrations wait for events that may arrive while no call waits:
// while any do, the callback thread polls the transport.
CUresult CallbackListenersChanged(int64_t n);
// A kEvtAsyncNotification event (client_notifications.cc): queues the program's callback.
void HandleAsyncNotification(const transport::InFrame& in);
}  // namespace tf::client
