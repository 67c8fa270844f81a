// The remote client stub's connection to its worker: connect at cuInit, the device snapshot,
// synchronous and fire-and-forget calls, deferred errors, loss of the worker, fork.
#include "driver/guest_log.h"
#include "client/client.h"

#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>

#include "client/client_internal.h"
#include "client/op_times.h"
#include "client/parallel_copy.h"
#include "tf_client_impl.h"
#include "transport/shm_transport.h"
#include "transport/tcp_transport.h"

#define TF_EXPORT __attribute__((visibility("default")))

// Lets `tfusion run` and tests tell this library from a real driver.
extern "C" TF_EXPORT const char* tfusion_client_version() { return "tensorfusion-client 0.1"; }

namespace tf::client {
namespace {

using transport::InFrame;
using transport::OutFrame;
using transport::TransportStatus;

std::atomic<bool> g_unsupported_logged[driver::kFunctionCount];
thread_local uint64_t t_ctx = 0;

void AtForkChild() {
  // The child has none of the parent's threads: the parent's connection (and its flusher thread)
  // cannot be used or closed here. Leak it; the first call in the child connects afresh.
  ClientState& st = State();
  pthread_mutex_init(&st.mu, nullptr);
  if (st.session != nullptr) {
    (void)st.session->transport.release();
    st.session = nullptr;
  }
  t_ctx = 0;
}

struct LoadTimeSetup {
  LoadTimeSetup() { pthread_atfork(nullptr, nullptr, &AtForkChild); }
} g_setup;

constexpr int kReceiveSliceMs = 1000;

// TFUSION_HOST_REGIONS=0 keeps page-locked memory on the client (copies staged), for comparisons.
bool HostRegionsDisabled() {
  const char* v = getenv("TFUSION_HOST_REGIONS");
  return v != nullptr && strcmp(v, "0") == 0;
}
// TFUSION_MIRRORS=0 turns mirrored memory off (no zero-copy or managed memory without regions).
bool MirrorsDisabled() {
  const char* v = getenv("TFUSION_MIRRORS");
  return v != nullptr && strcmp(v, "0") == 0;
}

}  // namespace

void ClientLog(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  tf::driver::GuestLogV("tfusion-client", fmt, ap);
  va_end(ap);
}

bool CallTraceEnabled() {
  static const bool on = [] {
    const char* v = getenv("TFUSION_CLIENT_TRACE");
    return v != nullptr && strstr(v, "calls") != nullptr;
  }();
  return on;
}

void TraceResult(const char* name, CUresult r) {
  if (r != CUDA_SUCCESS) ClientLog("%s -> %d", name, static_cast<int>(r));
}

ClientState& State() {
  static ClientState* s = new ClientState();  // never destroyed: other threads may run at exit
  return *s;
}

uint64_t CurrentContext() { return t_ctx; }
void SetCurrentContext(uint64_t ctx) { t_ctx = ctx; }

CUresult Unsupported(driver::Fn fn) {
  int i = static_cast<int>(fn);
  if (i >= 0 && i < driver::kFunctionCount && !g_unsupported_logged[i].exchange(true)) {
    ClientLog("%s is not supported by the remote vGPU yet: returning CUDA_ERROR_NOT_SUPPORTED",
              driver::FunctionName(fn));
  }
  return CUDA_ERROR_NOT_SUPPORTED;
}

Locked::Locked() {
  ClientState& st = State();
  pthread_mutex_lock(&st.mu);
  if (st.session == nullptr) {
    if (!st.init_called) {
      r_ = CUDA_ERROR_NOT_INITIALIZED;
      return;
    }
    r_ = ConnectLocked();  // a forked child's first use
    if (r_ != CUDA_SUCCESS) return;
  }
  s_ = st.session;
  if (s_->sticky != CUDA_SUCCESS) {
    r_ = s_->sticky;
    s_ = nullptr;
  }
}

Locked::~Locked() { pthread_mutex_unlock(&State().mu); }

CUresult LoseConnection(Session* s, const TransportStatus& why) {
  if (s->sticky != kLostConnectionError) {
    ClientLog("lost the connection to the worker (%s: %s): every further CUDA call fails",
              transport::TransportErrcName(why.code()), why.message());
  }
  s->sticky = kLostConnectionError;
  return kLostConnectionError;
}

namespace {

// Waits for the reply to `seq`. Frames that are not it (async error events) are skipped; copy
// data for `seq` goes to sink when there is one.
CUresult AwaitReply(Session* s, uint64_t seq, InFrame* in, CopyDataSink sink = nullptr,
                    void* sink_ctx = nullptr) {
  for (;;) {
    TransportStatus st = s->transport->Receive(in, kReceiveSliceMs);
    if (st.code() == transport::TransportErrc::kTimeout) continue;
    if (!st.ok()) return LoseConnection(s, st);
    if (in->header.opcode == static_cast<uint16_t>(transport::Opcode::kCallReply) &&
        in->header.sequence == seq) {
      return CUDA_SUCCESS;
    }
    if (in->header.opcode == remote::kEvtCopyData) {
      transport::Reader rd(in->payload, in->payload_length);
      uint64_t call = 0, offset = 0;
      rd.U64(&call);
      rd.U64(&offset);
      if (!rd.Finish() || call != seq || sink == nullptr ||
          !sink(sink_ctx, offset, in->bulk, in->bulk_length)) {
        return LoseConnection(s, TransportStatus::Error(transport::TransportErrc::kProtocol, 0,
                                                        "unexpected copy data"));
      }
      continue;
    }
    if (in->header.opcode >= remote::kEventBase) {
      HandleEventFrame(s, *in);
      if (s->sticky == kLostConnectionError) return kLostConnectionError;
    }
  }
}

CUresult SendFrame(Session* s, uint16_t op, uint16_t flags, const transport::Writer& payload,
                   const void* bulk, uint64_t bulk_len, uint64_t* seq) {
  if (!payload.ok()) return CUDA_ERROR_INVALID_VALUE;
  // Kernels and copies on the worker see what the application wrote into mirrors before this call.
  // Mapping and unmapping host memory makes the worker read none of it (and pushing there made a
  // program that allocates managed memory in steps compare every earlier step at each one).
  const bool maps_only = op == remote::kOpMirrorMap || op == remote::kOpMirrorUnmap ||
                         op == remote::kOpHostRegionMap || op == remote::kOpHostRegionUnmap;
  if (!maps_only && s->mirror_count.load(std::memory_order_relaxed) > 0) PushMirrors(s);
  OutFrame f;
  f.opcode = op;
  f.flags = flags;
  f.sequence = s->next_seq++;
  f.payload = payload.data();
  f.payload_length = static_cast<uint32_t>(payload.size());
  f.bulk = bulk;
  f.bulk_length = bulk_len;
  TransportStatus st = s->transport->Send(f);
  if (!st.ok()) {
    if (st.code() == transport::TransportErrc::kInvalidArgument) {
      ClientLog("call 0x%04x refused by the transport: %s", op, st.message());
      return CUDA_ERROR_INVALID_VALUE;
    }
    return LoseConnection(s, st);
  }
  if (seq) *seq = f.sequence;
  return CUDA_SUCCESS;
}

}  // namespace

CUresult PrepareContextIfAny(Session* s) { return t_ctx == 0 ? CUDA_SUCCESS : PrepareContext(s, true); }

CUresult Simple(Locked& l, driver::Fn fn, const transport::Writer& w) {
  return CallSync(l.session(), remote::Op(fn), w, nullptr);
}

CUresult PrepareContext(Session* s, bool needs_ctx) {
  if (!needs_ctx) return CUDA_SUCCESS;
  uint64_t ctx = t_ctx;
  if (ctx == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (s->worker_ctx == ctx) return CUDA_SUCCESS;
  uint8_t buf[8];
  transport::Writer w(buf, sizeof(buf));
  w.U64(ctx);
  CUresult r = SendFrame(s, remote::Op(driver::Fn::cuCtxSetCurrent), 0, w, nullptr, 0, nullptr);
  if (r == CUDA_SUCCESS) s->worker_ctx = ctx;
  return r;
}

CUresult SendAsync(Session* s, uint16_t op, const transport::Writer& payload, const void* bulk,
                   uint64_t bulk_len) {
  return SendFrame(s, op, 0, payload, bulk, bulk_len, nullptr);
}

namespace {
// TFUSION_CLIENT_PROFILE=1: how many synchronous calls of each kind the program made and how
// long it waited for their replies, logged at exit (most waiting first). Under State().mu.
struct SyncProfile {
  remote::OpTimes times;

  static SyncProfile* Get() {
    static SyncProfile* p = [] {
      const char* v = getenv("TFUSION_CLIENT_PROFILE");
      if (v == nullptr || strcmp(v, "1") != 0) return static_cast<SyncProfile*>(nullptr);
      atexit([] { Get()->LogTop(); });
      return new SyncProfile();  // never destroyed: other threads may call at exit
    }();
    return p;
  }
  void LogTop() {
    // Never wait at exit: a thread still inside a call may hold the mutex for good.
    if (pthread_mutex_trylock(&State().mu) != 0) return;
    const auto rows = times.Top(15);
    pthread_mutex_unlock(&State().mu);
    for (const auto& r : rows) {
      ClientLog("profile: %-34s %9llu sync calls, waited %10.1f ms, %8.2f us/call", r.name,
                static_cast<unsigned long long>(r.e.calls), r.e.ns / 1e6, r.e.ns / 1e3 / r.e.calls);
    }
  }
};

// The transport's placer while a call with a CopyDataPlace waits: copy data of that call goes
// where place says.
struct Placement {
  uint64_t seq;
  CopyDataPlace place;
  void* ctx;
};

uint8_t* PlaceCopyData(void* ctx, const transport::FrameHeader& h, const uint8_t* payload,
                       uint32_t payload_length, uint64_t bulk_length) {
  auto* p = static_cast<Placement*>(ctx);
  if (h.opcode != remote::kEvtCopyData) return nullptr;
  transport::Reader rd(payload, payload_length);
  uint64_t call = 0, offset = 0;
  rd.U64(&call);
  rd.U64(&offset);
  if (!rd.Finish() || call != p->seq) return nullptr;
  return p->place(p->ctx, offset, bulk_length);
}

CUresult CallSyncImpl(Session* s, uint16_t op, const transport::Writer& payload, ReplyView* reply,
                      const void* bulk, uint64_t bulk_len, CopyDataSink sink, void* sink_ctx,
                      CopyDataPlace place = nullptr) {
  uint64_t seq = 0;
  SyncProfile* prof = SyncProfile::Get();
  const int64_t t0 = prof ? transport::MonotonicNowNs() : 0;
  CUresult r = SendFrame(s, op, transport::kFlagReplyExpected, payload, bulk, bulk_len, &seq);
  if (r != CUDA_SUCCESS) return r;
  InFrame in;
  Placement placement{seq, place, sink_ctx};
  const bool placed = place != nullptr && s->transport->SetBulkPlacer(&PlaceCopyData, &placement);
  r = AwaitReply(s, seq, &in, sink, sink_ctx);
  if (placed) s->transport->SetBulkPlacer(nullptr, nullptr);
  if (prof) prof->times.Add(op, transport::MonotonicNowNs() - t0);
  if (r != CUDA_SUCCESS) return r;
  transport::Reader rd(in.payload, in.payload_length);
  if (in.header.flags & transport::kFlagError) {
    uint64_t failed_seq = 0;
    uint16_t failed_op = 0;
    int32_t err = 0;
    rd.U64(&failed_seq);
    rd.U16(&failed_op);
    rd.I32(&err);
    if (!rd.Finish() || err == 0) {
      return LoseConnection(
          s, TransportStatus::Error(transport::TransportErrc::kProtocol, 0, "bad deferred error"));
    }
    if (remote::IsStickyError(err)) s->sticky = static_cast<CUresult>(err);
    return static_cast<CUresult>(err);
  }
  int32_t result = 0;
  if (!rd.I32(&result)) {
    return LoseConnection(
        s, TransportStatus::Error(transport::TransportErrc::kProtocol, 0, "short reply"));
  }
  if (remote::IsStickyError(result)) s->sticky = static_cast<CUresult>(result);
  if (result == CUDA_SUCCESS && reply != nullptr) {
    reply->reader = rd;
    reply->bulk = in.bulk;
    reply->bulk_len = in.bulk_length;
  }
  return static_cast<CUresult>(result);
}
}  // namespace

CUresult CallSync(Session* s, uint16_t op, const transport::Writer& payload, ReplyView* reply,
                  const void* bulk, uint64_t bulk_len) {
  return CallSyncImpl(s, op, payload, reply, bulk, bulk_len, nullptr, nullptr);
}

CUresult CallSyncWithData(Session* s, uint16_t op, const transport::Writer& payload,
                          CopyDataSink sink, void* sink_ctx, CopyDataPlace place) {
  return CallSyncImpl(s, op, payload, nullptr, nullptr, 0, sink, sink_ctx, place);
}

namespace {

// What the worker's GPU can do that a program on this side of the connection cannot use: its
// answers are corrected here so that programs and frameworks take the paths that work remotely.
//   - Pageable memory of this process is not reachable from kernels (HMM, ATS): 88 and 100 are 0.
//   - Exporting VMM and pool memory (POSIX fd and fabric handles) and host-located memory pools
//     are not forwarded: 103, 119, 128, 142, 143, 144 are 0. Legacy IPC (cuIpc*, memory and
//     events) is forwarded between clients of one worker: 125 is the worker's.
//   - Managed memory is host memory shared with the worker (a host region) or mirrored: the host
//     may touch it only after synchronizing, so 89 (CONCURRENT_MANAGED_ACCESS) and 101
//     (DIRECT_MANAGED_MEM_ACCESS_FROM_HOST) are 0, and 83 (MANAGED_MEMORY) keeps the device's
//     value only where regions or mirrors exist.
//   - Memory registered with cuMemHostRegister stays on this side: 91 is 0.
//   - Without host regions or mirrors (TFUSION_HOST_REGIONS=0 / TFUSION_MIRRORS=0) page-locked
//     memory cannot be mapped into the device's address space: 19 (CAN_MAP_HOST_MEMORY) is 0.
void AdjustRemoteAttributes(Session* s) {
  static constexpr int kOff[] = {
      CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS,
      CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES,
      CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS,
      CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST,
      CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
      CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES,
      CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED,
      CU_DEVICE_ATTRIBUTE_HOST_NUMA_MULTINODE_IPC_SUPPORTED,
      CU_DEVICE_ATTRIBUTE_HOST_NUMA_MEMORY_POOLS_SUPPORTED,
      CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED,
      CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
  };
  for (auto& d : s->devices) {
    for (int a : kOff) {
      if (static_cast<size_t>(a) < d.attrs.size()) d.attrs[a] = 0;
    }
    if (!s->host_regions && !s->mirrors) {
      for (int a : {CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY}) {
        if (static_cast<size_t>(a) < d.attrs.size()) d.attrs[a] = 0;
      }
    }
  }
}

CUresult FetchSessionInfo(Session* s) {
  // The vGPU this client asks for (`tfusion run --remote --vram/--tflops/--percent/--gpu`, and
  // the limit and QoS): a limits record (u32 version, then the flags as blobs), checked by the
  // worker. Version 2 (four flags) unless a limit or QoS is asked for, so that workers that know
  // only version 2 keep serving clients that ask for no more; version 3 adds three flags; version
  // 4 (only when they are given) the tier idle timeouts of a pool allocation; version 5 (only when
  // given) its idle zero timeout and the allocation's id.
  const char* vars[] = {"TFUSION_REMOTE_VRAM", "TFUSION_REMOTE_TFLOPS", "TFUSION_REMOTE_PERCENT",
                        "TFUSION_REMOTE_GPU", "TFUSION_REMOTE_TFLOPS_LIMIT", "TFUSION_REMOTE_PERCENT_LIMIT",
                        "TFUSION_REMOTE_QOS", "TFUSION_REMOTE_IDLE_SWAP", "TFUSION_REMOTE_IDLE_DISK",
                        "TFUSION_REMOTE_IDLE_ZERO", "TFUSION_REMOTE_ALLOCATION"};
  constexpr int kFields = sizeof(vars) / sizeof(vars[0]);
  uint8_t lim[kFields * 72 + 8];
  transport::Writer w(lim, sizeof(lim));
  const char* values[kFields];
  bool asked = false, asked_v3 = false, asked_v4 = false, asked_v5 = false;
  for (int i = 0; i < kFields; ++i) {
    values[i] = getenv(vars[i]);
    const bool given = values[i] != nullptr && *values[i] != '\0';
    asked = asked || given;
    asked_v3 = asked_v3 || (given && i >= 4);
    asked_v4 = asked_v4 || (given && i >= 7);
    asked_v5 = asked_v5 || (given && i >= 9);
  }
  if (asked) {
    w.U32(asked_v5 ? 5 : asked_v4 ? 4 : asked_v3 ? 3 : 2);
    for (int i = 0; i < (asked_v5 ? kFields : asked_v4 ? 9 : asked_v3 ? 7 : 4); ++i) {
      size_t n = values[i] ? strnlen(values[i], 65) : 0;
      if (n > 64) {
        ClientLog("%s: the value is longer than 64 characters", vars[i]);
        return CUDA_ERROR_INVALID_VALUE;
      }
      w.Blob(values[i] ? values[i] : "", static_cast<uint32_t>(n));
    }
  }
  ReplyView rv;
  uint64_t seq = 0;
  CUresult r = SendFrame(s, remote::kOpSessionInfo, transport::kFlagReplyExpected, w, nullptr, 0, &seq);
  if (r != CUDA_SUCCESS) return r;
  InFrame in;
  r = AwaitReply(s, seq, &in);
  if (r != CUDA_SUCCESS) return r;
  transport::Reader rd(in.payload, in.payload_length);
  int32_t init_result = 0, version = 0;
  uint32_t count = 0;
  rd.I32(&init_result);
  rd.I32(&version);
  rd.U32(&count);
  if (!rd.ok() || count > remote::kMaxDevices) {
    return LoseConnection(s, TransportStatus::Error(transport::TransportErrc::kProtocol, 0,
                                                    "malformed session info"));
  }
  s->driver_version = version;
  s->devices.resize(count);
  for (auto& d : s->devices) {
    const uint8_t* name = nullptr;
    uint32_t name_len = 0;
    rd.Blob(&name, &name_len, remote::kMaxDeviceName);
    if (name) memcpy(d.name, name, name_len);
    rd.Bytes(d.uuid.bytes, sizeof(d.uuid.bytes));
    rd.U64(&d.total_mem);
    uint32_t n = 0;
    rd.U32(&n);
    if (!rd.ok() || n > remote::kMaxAttributes) break;
    d.attrs.resize(n);
    for (auto& v : d.attrs) rd.I32(&v);
  }
  // A refusal of our limits says why, where the worker sends it (kFeatureRefusalReason).
  std::string refusal;
  if (init_result == CUDA_ERROR_INVALID_VALUE && count == 0 &&
      (s->transport->session().features & transport::kFeatureRefusalReason) != 0 && rd.remaining() > 0) {
    const uint8_t* why = nullptr;
    uint32_t why_len = 0;
    if (rd.Blob(&why, &why_len, transport::kMaxRefusalReasonBytes) && why != nullptr) {
      for (uint32_t i = 0; i < why_len; ++i)  // the worker's text: printable only
        refusal.push_back(why[i] >= 0x20 && why[i] < 0x7f ? static_cast<char>(why[i]) : '?');
    }
  }
  if (!rd.Finish()) {
    return LoseConnection(s, TransportStatus::Error(transport::TransportErrc::kProtocol, 0,
                                                    "malformed session info"));
  }
  AdjustRemoteAttributes(s);
  if (!asked && init_result == CUDA_ERROR_INVALID_VALUE && !refusal.empty()) {
    s->limits_refused = true;  // e.g. a session ticket bound to limits this client did not ask for
    ClientLog("the worker refused this client: %s", refusal.c_str());
  }
  if (asked && init_result == CUDA_ERROR_INVALID_VALUE) {
    s->limits_refused = true;
    if (!refusal.empty()) {
      ClientLog("the worker refused the vGPU this client asked for: %s", refusal.c_str());
    } else {
      ClientLog("the worker refused the vGPU this client asked for (--vram/--tflops/--percent/--gpu); "
                "its log says why");
    }
    if (asked_v3) {
      ClientLog("(a worker whose log says 'unknown limits record' is older than this client and takes no "
                "--tflops-limit, --percent-limit or --qos)");
    }
  }
  return static_cast<CUresult>(init_result);
}

}  // namespace

CUresult ConnectLocked() {
  ClientState& st = State();
  const char* remote = getenv("TFUSION_REMOTE");
  if (remote == nullptr || *remote == '\0') {
    ClientLog("TFUSION_REMOTE is not set (HOST:PORT or unix:/path of a tfusion worker): no device");
    return CUDA_ERROR_NO_DEVICE;
  }
  const char* token = getenv("TFUSION_TOKEN");
  transport::ClientHello hello;
  if (token && !hello.SetToken(token, strlen(token))) {
    ClientLog("TFUSION_TOKEN is longer than %u bytes", transport::kMaxTokenBytes);
    return CUDA_ERROR_INVALID_VALUE;
  }
  hello.client_pid = static_cast<uint32_t>(getpid());
  char host[128] = {};
  gethostname(host, sizeof(host) - 1);
  hello.SetHostId(host);
  transport::TransportOptions opt;
  opt.shm_bulk_copy = &ParallelCopy;
  // The shared-memory bulk arena (both directions), 64 MiB unless TFUSION_SHM_ARENA_MIB says
  // otherwise: larger arenas let more of a large pageable copy be in flight.
  if (const char* v = getenv("TFUSION_SHM_ARENA_MIB"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    unsigned long mib = strtoul(v, &end, 10);
    if (end == v || *end != '\0' || mib < 2 || mib > 4096) {
      ClientLog("TFUSION_SHM_ARENA_MIB=%s ignored: want whole MiB from 2 to 4096", v);
    } else {
      opt.shm_arena_bytes = static_cast<uint64_t>(mib) << 20;
    }
  }
  // How long the TCP flusher and receiver stay awake for the next frame. A Python program issues
  // its launches tens of microseconds apart: a flusher that slept between them woke for each one
  // and the GPU waited (GPT-2 8x512: 9.4-10.3 ms a step with 20 us, 7.6 ms with 500 us; native 6.8-7.0).
  opt.tcp_spin_ns = 500000;
  if (const char* v = getenv("TFUSION_TCP_SPIN_US"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    unsigned long us = strtoul(v, &end, 10);
    if (end == v || *end != '\0' || us > 10000) {
      ClientLog("TFUSION_TCP_SPIN_US=%s ignored: want whole microseconds from 0 to 10000", v);
    } else {
      opt.tcp_spin_ns = static_cast<uint32_t>(us * 1000);
    }
  }
  // TLS to a worker over TCP when a CA is given (the controller's variable: one CA for both).
  // OpenSSL is loaded only then (transport/tls_stream.h).
  if (const char* ca = getenv("TFUSION_CA_FILE"); ca != nullptr && *ca != '\0') opt.tls_ca_file = ca;
  std::unique_ptr<transport::Transport> t;
  auto connect = [&] {
    return strncmp(remote, "unix:", 5) == 0 ? transport::ConnectShm(remote + 5, hello, opt, &t)
                                            : transport::ConnectTcp(remote, hello, opt, &t);
  };
  TransportStatus ts = connect();
  // A worker busy with many handshakes from this client's host closes a further connection at
  // once, before its handshake (docs/remote.md): tried again a few times, 50 ms to 0.8 s apart.
  for (int delay_ms = 50; !ts.ok() && delay_ms <= 800 &&
                          (ts.code() == transport::TransportErrc::kPeerClosed ||
                           ts.code() == transport::TransportErrc::kPeerDead);
       delay_ms *= 2) {
    timespec pause{0, delay_ms * 1'000'000L};
    nanosleep(&pause, nullptr);
    t.reset();
    ts = connect();
  }
  if (!ts.ok()) {
    if (ts.code() == transport::TransportErrc::kRefused) {
      const bool bad_token = ts.refusal_reason() == static_cast<uint16_t>(transport::RefusalReason::kBadToken);
      if (bad_token && (token == nullptr || *token == '\0')) {
        // Not a wrong token: none was given, and this worker takes one.
        ClientLog("the worker at %s wants a token and this client has none (tfusion run --token T, or "
                  "TFUSION_TOKEN)", remote);
      } else {
        ClientLog("the worker at %s refused this client: %s", remote, ts.message());
      }
      return bad_token ? CUDA_ERROR_NOT_PERMITTED : CUDA_ERROR_NO_DEVICE;
    }
    ClientLog("cannot connect to the worker at %s: %s: %s", remote,
              transport::TransportErrcName(ts.code()), ts.message());
    return CUDA_ERROR_NO_DEVICE;
  }
  auto* s = new Session();
  s->transport = std::move(t);
  void* bulk_base = nullptr;
  uint64_t bulk_bytes = 0;
  s->pipelined_copies = s->transport->BulkMemory(&bulk_base, &bulk_bytes);
  s->host_regions = s->transport->CanShareHostMemory() &&
                    (s->transport->session().features & transport::kFeatureHostRegions) != 0 &&
                    !HostRegionsDisabled();
  s->managed_regions =
      (s->transport->session().features & transport::kFeatureManagedRegions) != 0;
  // Mirrors serve what host regions cannot: everything over TCP, and over shared memory the
  // memory registered after the fact (cuMemHostRegister) and allocations a region could not take.
  s->mirrors = (s->transport->session().features & transport::kFeatureMirrors) != 0 &&
               !MirrorsDisabled();
  CUresult r = FetchSessionInfo(s);
  if (r != CUDA_SUCCESS) {
    if (s->sticky == CUDA_SUCCESS && !s->limits_refused) ClientLog("the worker's driver failed cuInit with error %d", r);
    s->transport->Close();
    delete s;
    return r;
  }
  st.session = s;
  return CUDA_SUCCESS;
}

}  // namespace tf::client
