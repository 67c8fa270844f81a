// The driver's asynchronous notifications for a worker session (session_notifications.h).
#include "worker/session_notifications.h"

#include "client/remote_protocol.h"

namespace tf::worker {
namespace {

using driver::Fn;
using transport::Reader;
using transport::Writer;

#define CALL(fn, ...) (d_.fn ? d_.fn(__VA_ARGS__) : CUDA_ERROR_NOT_SUPPORTED)

template <class T>
T As(uint64_t v) {
  return reinterpret_cast<T>(v);
}

}  // namespace

bool SessionNotifications::Handles(Fn fn) {
  return fn == Fn::cuDeviceRegisterAsyncNotification || fn == Fn::cuDeviceUnregisterAsyncNotification;
}

void SessionNotifications::Notified(CUasyncNotificationInfo* info, void* user, CUasyncCallbackHandle) {
  auto* reg = static_cast<Registration*>(user);
  const uint64_t wire = reg->wire.load(std::memory_order_acquire);
  if (info == nullptr || wire == 0 || reg->self->stopping_.load(std::memory_order_acquire)) return;
  uint8_t buf[24];
  Writer w(buf, sizeof(buf));
  w.U64(wire);
  w.U32(static_cast<uint32_t>(info->type));
  w.U64(info->type == CU_ASYNC_NOTIFICATION_TYPE_OVER_BUDGET ? info->info.overBudget.bytesOverBudget : 0);
  reg->self->host_.SendAsyncNotification(w);
}

CUresult SessionNotifications::Call(Fn fn, Reader& rd, Writer& out) {
  if (fn == Fn::cuDeviceRegisterAsyncNotification) {
    int32_t dev = 0;
    if (!rd.I32(&dev) || !rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
    if (!host_.KnownDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
    if (registrations_.size() >= kMaxRegistrations) return CUDA_ERROR_OUT_OF_MEMORY;
    auto reg = std::make_unique<Registration>();
    reg->self = this;
    reg->device = dev;
    CUasyncCallbackHandle h = nullptr;
    CUresult r = CALL(cuDeviceRegisterAsyncNotification, dev, &SessionNotifications::Notified, reg.get(), &h);
    if (r != CUDA_SUCCESS) return r;
    reg->real = reinterpret_cast<uint64_t>(h);
    const uint64_t wire = host_.Handles().Publish(HandleKind::kAsyncCallback, reg->real);
    reg->wire.store(wire, std::memory_order_release);
    registrations_.push_back(std::move(reg));
    out.U64(wire);
    return CUDA_SUCCESS;
  }
  if (fn == Fn::cuDeviceUnregisterAsyncNotification) {
    int32_t dev = 0;
    uint64_t wire = 0, real = 0;
    rd.I32(&dev);
    if (!rd.U64(&wire) || !rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
    if (!host_.KnownDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
    if (!host_.Handles().Resolve(HandleKind::kAsyncCallback, wire, &real)) return CUDA_ERROR_INVALID_VALUE;
    Registration* reg = nullptr;
    for (auto& r : registrations_) {
      if (r->wire.load(std::memory_order_relaxed) == wire) reg = r.get();
    }
    if (reg == nullptr || reg->device != dev) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = CALL(cuDeviceUnregisterAsyncNotification, dev, As<CUasyncCallbackHandle>(real));
    if (r != CUDA_SUCCESS) return r;
    reg->wire.store(0, std::memory_order_release);
    host_.Handles().Retire(HandleKind::kAsyncCallback, wire);
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_NOT_SUPPORTED;
}

void SessionNotifications::Cleanup() {
  stopping_.store(true, std::memory_order_release);
  for (auto& reg : registrations_) {
    const uint64_t wire = reg->wire.exchange(0);
    if (wire == 0) continue;
    CALL(cuDeviceUnregisterAsyncNotification, reg->device, As<CUasyncCallbackHandle>(reg->real));
    host_.Handles().Retire(HandleKind::kAsyncCallback, wire);
  }
}

}  // namespace tf::worker
