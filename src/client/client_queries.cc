// Queries answered in the client: the device lookup by PCI bus id, from the snapshot. (The
// tensor-map encodings and cuTensorMapReplaceAddress are generated: api/remote_surface.tsv.)
//
// Answers that only this client can change are asked once and then answered here (Session::answers):
// the generated queries (api/remote_surface.tsv) keep a device's PCI bus id for the connection
// (str= with cache=: Session::text_answers), a
// context's id until it is destroyed (ForgetContextAnswers) and the stream getters until the
// stream is destroyed (ForgetStreamAnswers) or an attribute set (the priority may change).
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "client/client_internal.h"
#include "tf_client_impl.h"

namespace tf::client {
namespace {

using driver::Fn;
using remote::Op;
using transport::Writer;

constexpr Fn kStreamQueries[] = {Fn::cuStreamGetPriority, Fn::cuStreamGetFlags, Fn::cuStreamGetId,
                                 Fn::cuStreamGetDevice, Fn::cuStreamGetCtx};

// Parses "[domain:]bus:device[.function]" (hexadecimal fields, any case), the forms the driver
// accepts. False for anything else.
bool ParseBusId(const char* text, unsigned* domain, unsigned* bus, unsigned* device) {
  unsigned f[3] = {};
  int n = 0;
  const char* p = text;
  for (;;) {
    if (n == 3 || !isxdigit(static_cast<unsigned char>(*p))) return false;
    char* end = nullptr;
    unsigned long v = strtoul(p, &end, 16);
    if (end - p > 8) return false;
    f[n++] = static_cast<unsigned>(v);
    p = end;
    if (*p == ':') {
      ++p;
      continue;
    }
    if (*p == '.') {
      ++p;
      if (!isxdigit(static_cast<unsigned char>(*p))) return false;
      strtoul(p, &end, 16);
      p = end;
    }
    break;
  }
  if (*p != '\0' || n < 2) return false;
  *domain = n == 3 ? f[0] : 0;
  *bus = f[n - 2];
  *device = f[n - 1];
  return true;
}

}  // namespace

void ForgetStreamAnswers(Session* s, uint64_t stream) {
  for (Fn fn : kStreamQueries) ForgetAnswersAbout(s, fn, stream);
}

void NoteCreatedHandle(Session* s, HandleKind k, uint64_t h) {
  if (k == HandleKind::kStream) s->streams.insert(h);
}

void NoteDestroyedHandle(Session* s, HandleKind k, uint64_t h) {
  if (k == HandleKind::kStream) {
    s->streams.erase(h);
    ForgetStreamAnswers(s, h);
  }
}

void ForgetContextAnswers(Session* s) {
  ForgetAnswers(s, Fn::cuCtxGetId);
  for (Fn fn : kStreamQueries) ForgetAnswers(s, fn);
}

// ---- streams: the getters are generated (api/remote_surface.tsv, answered once per stream)

// The context as cuStreamGetCtx answers it, the green context as cuStreamGetGreenCtx does.
CUresult Impl_cuStreamGetCtx_v2(CUstream st, CUcontext* ctx, CUgreenCtx* green) {
  if (ctx == nullptr && green == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUcontext c = nullptr;
  CUresult r = Impl_cuStreamGetCtx(st, &c);
  if (r != CUDA_SUCCESS) return r;
  CUgreenCtx g = nullptr;
  if (green != nullptr && (r = Impl_cuStreamGetGreenCtx(st, &g)) != CUDA_SUCCESS) return r;
  if (ctx != nullptr) *ctx = c;
  if (green != nullptr) *green = g;
  return CUDA_SUCCESS;
}

// ---- devices

// Answered here: the device whose PCI domain, bus and device (CU_DEVICE_ATTRIBUTE_PCI_*, from the
// snapshot) match the text.
CUresult Impl_cuDeviceGetByPCIBusId(CUdevice* dev, const char* pci_bus_id) {
  if (dev == nullptr || pci_bus_id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  unsigned domain = 0, bus = 0, device = 0;
  if (!ParseBusId(pci_bus_id, &domain, &bus, &device)) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  const std::vector<DeviceInfo>& devs = l.session()->devices;
  for (size_t i = 0; i < devs.size(); ++i) {
    auto attr = [&](CUdevice_attribute a) {
      size_t k = static_cast<size_t>(a);
      return k < devs[i].attrs.size() ? static_cast<unsigned>(devs[i].attrs[k]) : ~0u;
    };
    if (attr(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID) == domain &&
        attr(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) == bus &&
        attr(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID) == device) {
      *dev = static_cast<CUdevice>(i);
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_DEVICE;
}

}  // namespace tf::client
