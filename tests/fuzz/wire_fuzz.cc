// libFuzzer target for everything that decodes bytes a peer controls: stream frames (header,
// payload, bulk descriptor), the three handshake payloads, the Reader, and the worker's generated
// driver-call decoder (tools/codegen/gen_remote.py: decode, validate, call, encode; and its trace
// formatter). Any crash, sanitizer
// report, or a decode/encode/decode round trip that changes a value is a bug.
//
// Built with clang++ -fsanitize=fuzzer,address by tests/fuzz/CMakeLists.txt; `ctest -R wire_fuzz`
// runs it for a bounded time from the seed corpus that wire_fuzz_seeds writes.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "transport/handshake.h"
#include "transport/wire.h"
#include "worker/generated_calls.h"

using namespace tf::transport;  // NOLINT: a fuzz harness

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

void FuzzStreamFrame(const uint8_t* data, size_t size) {
  FrameView v;
  size_t consumed = 0;
  if (DecodeStreamFrame(data, size, &v, &consumed) != WireError::kOk) return;
  Check(consumed <= size);
  Check(v.payload + v.payload_length <= data + size);
  if (v.bulk) Check(v.bulk + v.bulk_length <= data + size);
  // Re-encoding the header reproduces the bytes exactly.
  uint8_t again[kFrameHeaderSize];
  EncodeFrameHeader(v.header, again);
  Check(memcmp(again, data, kFrameHeaderSize) == 0);
  // Every payload byte is readable.
  volatile uint8_t sink = 0;
  for (uint32_t i = 0; i < v.payload_length; ++i) sink = sink ^ v.payload[i];
}

void FuzzClientHello(const uint8_t* data, size_t size) {
  ClientHello h;
  if (DecodeClientHello(data, size, &h) != WireError::kOk) return;
  Check(h.token_length == 0 && h.credential_id_length <= kMaxCredentialIdBytes &&
        h.host_id_length <= kMaxHostIdBytes);
  ServerPolicy p;
  ServerHello ok;
  AuthKey key;
  Refusal no;
  if (NegotiateHandshake(h, p, 1, &ok, &key, &no)) {
    char msg[128];
    Check(CheckServerHello(h, ok, msg, sizeof(msg)));
  } else {
    Check(no.message_length <= kMaxRefusalMessageBytes && no.reason != 0);
  }
}

void FuzzServerReplies(const uint8_t* data, size_t size) {
  ServerHello s;
  if (DecodeServerHello(data, size, &s) == WireError::kOk) {
    uint8_t buf[96];
    Check(EncodeServerHello(s, buf, sizeof(buf)) == size && memcmp(buf, data, size) == 0);
  }
  AuthChallenge c;
  if (DecodeAuthChallenge(data, size, &c) == WireError::kOk) {
    uint8_t buf[64];
    Check(EncodeAuthChallenge(c, buf, sizeof(buf)) == size && memcmp(buf, data, size) == 0);
  }
  AuthProof pr;
  if (DecodeAuthProof(data, size, &pr) == WireError::kOk) {
    uint8_t buf[96];
    Check(EncodeAuthProof(pr, buf, sizeof(buf)) == size && memcmp(buf, data, size) == 0);
  }
  Refusal r;
  if (DecodeRefusal(data, size, &r) == WireError::kOk) {
    Check(r.message_length <= kMaxRefusalMessageBytes);
    uint8_t buf[kMaxHandshakePayload];
    Check(EncodeRefusal(r, buf, sizeof(buf)) == size && memcmp(buf, data, size) == 0);
    (void)RefusalReasonName(r.reason);
  }
}

void FuzzReader(const uint8_t* data, size_t size) {
  Reader r(data, size);
  uint8_t op;
  while (r.U8(&op)) {
    uint64_t v;
    uint32_t u;
    const uint8_t* p;
    uint32_t n;
    switch (op % 4) {
      case 0: r.U64(&v); break;
      case 1: r.U32(&u); break;
      case 2:
        if (r.Blob(&p, &n, 4096)) Check(p + n <= data + size);
        break;
      default: {
        uint8_t tmp[16];
        r.Bytes(tmp, op % 17);
      }
    }
  }
  Check(r.remaining() == 0);
}

}  // namespace

// The generated calls against a driver whose few present entry points succeed (the others are
// absent: CUDA_ERROR_NOT_SUPPORTED after the checks), with one object of several kinds published.
// Input: u16 selector (which generated entry point), then the payload.
class FuzzHost : public tf::worker::GeneratedHost {
 public:
  FuzzHost() {
    d_.cuStreamCreate = [](CUstream* s, unsigned int) {
      *s = reinterpret_cast<CUstream>(0x5000);
      return CUDA_SUCCESS;
    };
    d_.cuEventCreate = [](CUevent* e, unsigned int) {
      *e = reinterpret_cast<CUevent>(0x6000);
      return CUDA_SUCCESS;
    };
    d_.cuStreamDestroy_v2 = [](CUstream) { return CUDA_SUCCESS; };
    d_.cuEventQuery = [](CUevent) { return CUDA_SUCCESS; };
    d_.cuCtxGetLimit = [](size_t* v, CUlimit) {
      *v = 1024;
      return CUDA_SUCCESS;
    };
    d_.cuStreamGetCtx = [](CUstream, CUcontext* c) {
      *c = reinterpret_cast<CUcontext>(0x1000);
      return CUDA_SUCCESS;
    };
    d_.cuEventElapsedTime_v2 = [](float* ms, CUevent, CUevent) {
      *ms = 1.5f;
      return CUDA_SUCCESS;
    };
    // An array with a count, a structure and a union come back (count=, structures, bytes=).
    d_.cuDeviceGetHostAtomicCapabilities = [](unsigned int* caps, const CUatomicOperation* ops, unsigned int n,
                                              CUdevice) {
      Check(n >= 1 && n <= 64);
      for (unsigned i = 0; i < n; ++i) caps[i] = static_cast<unsigned>(ops[i]) + 1;
      return CUDA_SUCCESS;
    };
    d_.cuMemGetAllocationGranularity = [](size_t* g, const CUmemAllocationProp* p, CUmemAllocationGranularity_flags) {
      Check(p->win32HandleMetaData == nullptr);  // pointer fields never travel
      *g = 2 << 20;
      return CUDA_SUCCESS;
    };
    d_.cuStreamGetAttribute = [](CUstream, CUstreamAttrID, CUstreamAttrValue* v) {
      memset(v, 0x5a, sizeof(*v));
      return CUDA_SUCCESS;
    };
    // Occupancy of the one published function, and a multicast granularity whose properties
    // passed the field checks (flags=prop.handleTypes, flags=prop.flags).
    d_.cuOccupancyMaxActiveBlocksPerMultiprocessor = [](int* n, CUfunction f, int, size_t) {
      Check(f == reinterpret_cast<CUfunction>(0x4100));
      *n = 4;
      return CUDA_SUCCESS;
    };
    d_.cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags = [](int* n, CUfunction f, int, size_t, unsigned) {
      Check(f == reinterpret_cast<CUfunction>(0x4100));
      *n = 2;
      return CUDA_SUCCESS;
    };
    d_.cuOccupancyAvailableDynamicSMemPerBlock = [](size_t* v, CUfunction f, int, int) {
      Check(f == reinterpret_cast<CUfunction>(0x4100));
      *v = 48 << 10;
      return CUDA_SUCCESS;
    };
    // An event's IPC handle (an output structure of bytes) and an event opened from one (a
    // structure by value in, a new handle out: new=phEvent).
    d_.cuIpcGetEventHandle = [](CUipcEventHandle* h, CUevent) {
      memset(h->reserved, 0x3c, sizeof(h->reserved));
      return CUDA_SUCCESS;
    };
    d_.cuIpcOpenEventHandle = [](CUevent* e, CUipcEventHandle) {
      *e = reinterpret_cast<CUevent>(0x6100);
      return CUDA_SUCCESS;
    };
    // Pool access: an array of structures whose locations (loc=) and flags (values=) were checked.
    d_.cuMemPoolSetAccess = [](CUmemoryPool p, const CUmemAccessDesc* map, size_t n) {
      Check(p == reinterpret_cast<CUmemoryPool>(0x9000) && n >= 1 && n <= 64);
      for (size_t i = 0; i < n; ++i) {
        Check(map[i].location.type == CU_MEM_LOCATION_TYPE_DEVICE && map[i].location.id == 0);
        Check(map[i].flags == 0 || map[i].flags == 1 || map[i].flags == 3);
      }
      return CUDA_SUCCESS;
    };
    d_.cuMemPoolGetAccess = [](CUmemAccess_flags* f, CUmemoryPool, CUmemLocation* loc) {
      Check(loc->type == CU_MEM_LOCATION_TYPE_DEVICE && loc->id == 0);
      *f = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      return CUDA_SUCCESS;
    };
    // Attribute values behind a void* (void=): an int for the reuse policies, a cuuint64_t for
    // the others; the value buffer holds the wider of the two whatever the attribute.
    d_.cuMemPoolGetAttribute = [](CUmemoryPool p, CUmemPool_attribute a, void* v) {
      Check(p == reinterpret_cast<CUmemoryPool>(0x9000) && a >= 1 && a <= CU_MEMPOOL_ATTR_USED_MEM_HIGH);
      if (a <= CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES) *static_cast<int*>(v) = -1;
      else *static_cast<cuuint64_t*>(v) = ~0ull;
      return CUDA_SUCCESS;
    };
    d_.cuMemPoolSetAttribute = [](CUmemoryPool p, CUmemPool_attribute a, void* v) {
      Check(p == reinterpret_cast<CUmemoryPool>(0x9000) && a >= 1 && a <= CU_MEMPOOL_ATTR_USED_MEM_HIGH);
      volatile cuuint64_t sink = *static_cast<cuuint64_t*>(v);
      (void)sink;
      return CUDA_SUCCESS;
    };
    d_.cuMulticastGetGranularity = [](size_t* g, const CUmulticastObjectProp* p, CUmulticastGranularity_flags o) {
      Check(p->flags == 0 && (p->handleTypes & ~0xfull) == 0 && o <= CU_MULTICAST_GRANULARITY_RECOMMENDED);
      *g = 2 << 20;
      return CUDA_SUCCESS;
    };
    t_.Publish(tf::worker::HandleKind::kContext, 0x1000);
    t_.Publish(tf::worker::HandleKind::kStream, 0x2000);
    t_.Publish(tf::worker::HandleKind::kEvent, 0x3000);
    t_.Publish(tf::worker::HandleKind::kModule, 0x4000);
    t_.Publish(tf::worker::HandleKind::kFunction, 0x4100);
    t_.Publish(tf::worker::HandleKind::kMemPool, 0x9000);
    // A graph with one node, instantiated: the `of=` and `publish=` calls reach the driver.
    d_.cuGraphNodeFindInClone = [](CUgraphNode* n, CUgraphNode, CUgraph) {
      *n = reinterpret_cast<CUgraphNode>(0x8300);
      return CUDA_SUCCESS;
    };
    d_.cuGraphNodeGetEnabled = [](CUgraphExec, CUgraphNode, unsigned int* v) {
      *v = 1;
      return CUDA_SUCCESS;
    };
    t_.Publish(tf::worker::HandleKind::kGraph, 0x8000);
    t_.Publish(tf::worker::HandleKind::kGraphNode, 0x8100);
    t_.Publish(tf::worker::HandleKind::kGraphExec, 0x8200);
  }
  const tf::driver::DriverTable& Driver() const override { return d_; }
  tf::worker::HandleTable& Handles() override { return t_; }
  bool KnownDevice(int32_t d) const override { return d == 0; }
  // One 64 KiB allocation at 0x7000'0000.
  bool DeviceRange(uint64_t p, uint64_t n) const override {
    return n > 0 && p >= 0x70000000 && n <= 0x10000 && p - 0x70000000 <= 0x10000 - n;
  }
  void Created(tf::worker::HandleKind, uint64_t) override { ++created; }
  void Destroyed(tf::worker::HandleKind, uint64_t) override { ++destroyed; }
  void AfterCall(tf::driver::Fn, CUresult) override { ++calls; }
  // The node belongs to the graph and to the executable graph made from it.
  bool Belongs(tf::worker::HandleKind k, uint64_t real, tf::worker::HandleKind owner_kind, uint64_t owner) override {
    Check(k == tf::worker::HandleKind::kGraphNode);
    return real == 0x8100 && (owner_kind == tf::worker::HandleKind::kGraph ? owner == 0x8000 : owner == 0x8200);
  }
  uint64_t Learn(tf::worker::HandleKind k, uint64_t real, tf::worker::HandleKind parent_kind, uint64_t parent) override {
    ++learned;
    Check(parent != 0 && parent_kind != k);
    return t_.Publish(k, real);
  }
  int created = 0, destroyed = 0, calls = 0, learned = 0;

 private:
  tf::driver::DriverTable d_;
  tf::worker::HandleTable t_;
};

void FuzzGeneratedCall(const uint8_t* data, size_t size) {
  static const std::vector<tf::driver::Fn> generated = [] {
    std::vector<tf::driver::Fn> v;
    for (int i = 0; i < tf::driver::kFunctionCount; ++i) {
      if (tf::worker::IsGenerated(static_cast<tf::driver::Fn>(i))) v.push_back(static_cast<tf::driver::Fn>(i));
    }
    return v;
  }();
  if (size < 2 || generated.empty()) return;
  uint16_t sel;
  memcpy(&sel, data, 2);
  const tf::driver::Fn fn = generated[sel % generated.size()];
  FuzzHost host;
  uint8_t out_buf[256];
  Reader rd(data + 2, size - 2);
  Writer out(out_buf, sizeof(out_buf));
  const CUresult r = tf::worker::DispatchGenerated(fn, rd, out, host);
  Check(out.ok());
  // Outputs only on success; a call reaches the driver only once its message decoded whole.
  if (r != CUDA_SUCCESS) Check(out.size() == 0);
  if (host.calls > 0) Check(rd.Finish());
  Check(host.calls <= 1 && host.created <= 1 && host.destroyed <= 1 && host.learned <= 1);
  if (host.learned > 0) Check(r == CUDA_SUCCESS);
  char text[96];
  Check(tf::worker::FormatGeneratedCall(fn, data + 2, size - 2, text, sizeof(text)));
  Check(strnlen(text, sizeof(text)) < sizeof(text));
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzStreamFrame(data, size);
  // A handshake frame carries its payload after the header: fuzz the payload decoders on both
  // the raw input and on what follows a header.
  FuzzClientHello(data, size);
  FuzzServerReplies(data, size);
  if (size > kFrameHeaderSize) {
    FuzzClientHello(data + kFrameHeaderSize, size - kFrameHeaderSize);
    FuzzServerReplies(data + kFrameHeaderSize, size - kFrameHeaderSize);
  }
  FuzzReader(data, size);
  FuzzGeneratedCall(data, size);
  return 0;
}
