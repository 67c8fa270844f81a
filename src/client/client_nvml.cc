// What the client's NVML (src/client/nvml, libnvidia-ml.so.1 in the inject folder) asks of this
// stub: the device snapshot of the session and a device's memory as CUDA reports it here.
// C ABI in client/nvml_bridge.h, exported beside tfusion_client_version.
#include <cstring>

#include "client/client_internal.h"
#include "client/nvml_bridge.h"
#include "tf_client_impl.h"

#define TF_EXPORT __attribute__((visibility("default")))

namespace tf::client {
namespace {

int Attr(const DeviceInfo& d, CUdevice_attribute a) {
  size_t i = static_cast<size_t>(a);
  return i < d.attrs.size() ? d.attrs[i] : 0;
}

// A context of this process on `dev` that the session can make current: the calling thread's
// when it is on that device, else a context this process created (cuCtxCreate) there, else its
// primary context there. 0 when there is none.
uint64_t ContextOn(Session* s, int dev) {
  uint64_t cur = CurrentContext();
  auto it = s->contexts.find(cur);
  if (cur != 0 && it != s->contexts.end() && it->second == dev) return cur;
  uint64_t primary = 0;
  for (const auto& [ctx, d] : s->contexts) {
    if (d != dev) continue;
    auto info = s->context_info.find(ctx);
    bool is_primary = info != s->context_info.end() && info->second.primary;
    if (!is_primary) return ctx;
    if (primary == 0) primary = ctx;
  }
  return primary;
}

}  // namespace
}  // namespace tf::client

using namespace tf::client;

extern "C" TF_EXPORT int tfusion_client_devices(int abi, int* driver_version,
                                                tfusion_client_device* out, int max, int* count) {
  if (abi != TFUSION_CLIENT_NVML_ABI || driver_version == nullptr || count == nullptr || max < 0 ||
      (out == nullptr && max > 0)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // As cuInit(0): connects once; later calls find the session (a forked child reconnects).
  if (CUresult r = Impl_cuInit(0); r != CUDA_SUCCESS) return r;
  TF_LOCK(l);
  Session* s = l.session();
  *driver_version = s->driver_version;
  int n = static_cast<int>(s->devices.size());
  *count = n;
  for (int i = 0; i < n && i < max; ++i) {
    const DeviceInfo& d = s->devices[static_cast<size_t>(i)];
    tfusion_client_device& o = out[i];
    memset(&o, 0, sizeof(o));
    static_assert(sizeof(o.name) > sizeof(d.name) - 1);
    memcpy(o.name, d.name, strnlen(d.name, sizeof(d.name)));
    memcpy(o.uuid, d.uuid.bytes, sizeof(o.uuid));
    o.total_mem = d.total_mem;
    o.pci_domain = Attr(d, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID);
    o.pci_bus = Attr(d, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
    o.pci_device = Attr(d, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID);
    o.cc_major = Attr(d, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    o.cc_minor = Attr(d, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    o.multi_gpu_board = Attr(d, CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD);
    o.compute_mode = Attr(d, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE);
  }
  return CUDA_SUCCESS;
}

extern "C" TF_EXPORT int tfusion_client_mem_info(int abi, int device, uint64_t* free,
                                                 uint64_t* total, uint64_t* process_used,
                                                 int* has_context) {
  if (abi != TFUSION_CLIENT_NVML_ABI || free == nullptr || total == nullptr ||
      process_used == nullptr || has_context == nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  TF_LOCK(l);
  Session* s = l.session();
  if (device < 0 || static_cast<size_t>(device) >= s->devices.size()) return CUDA_ERROR_INVALID_DEVICE;
  uint64_t mine = 0;
  for (const auto& [base, a] : s->allocs) {
    if (a.device == device) mine += a.size;
  }
  *process_used = mine;
  *has_context = 0;
  const uint64_t device_total = s->devices[static_cast<size_t>(device)].total_mem;
  *total = device_total;
  *free = device_total > mine ? device_total - mine : 0;
  uint64_t ctx = ContextOn(s, device);
  if (ctx == 0) return CUDA_SUCCESS;
  if (s->worker_ctx != ctx) {
    // Synchronous, so that a context the worker refuses (a released primary context) fails
    // here and never reaches the application as a deferred error.
    uint8_t buf[8];
    tf::transport::Writer w(buf, sizeof(buf));
    w.U64(ctx);
    CUresult r = CallSync(s, tf::remote::Op(tf::driver::Fn::cuCtxSetCurrent), w, nullptr);
    if (r != CUDA_SUCCESS) {
      s->worker_ctx = ~0ull;
      return s->sticky != CUDA_SUCCESS ? s->sticky : CUDA_SUCCESS;
    }
    s->worker_ctx = ctx;
  }
  ReplyView rv;
  CUresult r = CallSync(s, tf::remote::Op(tf::driver::Fn::cuMemGetInfo_v2),
                        tf::transport::Writer(nullptr, 0), &rv);
  if (r != CUDA_SUCCESS) return s->sticky != CUDA_SUCCESS ? s->sticky : CUDA_SUCCESS;
  uint64_t f = 0, t = 0;
  rv.reader.U64(&f);
  if (!rv.reader.U64(&t)) return CUDA_SUCCESS;
  *free = f;
  *total = t;
  *has_context = 1;
  return CUDA_SUCCESS;
}
