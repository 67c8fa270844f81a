// The driver's asynchronous notifications for a worker session
// (cuDeviceRegisterAsyncNotification, cuDeviceUnregisterAsyncNotification).
//
// The program's callback and its userData stay in the client. For each registration the session
// registers a callback of its own with the driver; when the driver calls it (on the driver's own
// thread, e.g. CU_ASYNC_NOTIFICATION_TYPE_OVER_BUDGET), the session sends a
// remote::kEvtAsyncNotification event to the client, which calls the program's callback on its
// callback thread. The CUasyncCallbackHandle the client holds is a HandleKind::kAsyncCallback name
// of the session: unregistering a forged, stale or another session's name, or with another device
// than it was registered on, fails that call only (CUDA_ERROR_INVALID_VALUE; a device that is not
// the session's is CUDA_ERROR_INVALID_DEVICE). The session's end unregisters what the client left.
//
// Payloads (client: src/client/client_notifications.cc):
//   cuDeviceRegisterAsyncNotification     i32 device            -> u64 callback name
//   cuDeviceUnregisterAsyncNotification   i32 device, u64 callback name
//   event kEvtAsyncNotification           u64 callback name, u32 type, u64 bytes over budget
//                                         (the type's information; 0 for other types)
//
// Threading: Call and Cleanup on the session's replay thread; the driver's callback on any thread
// (it only reads its registration and sends through the thread-safe transport).
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "driver/driver_table.h"
#include "transport/wire.h"
#include "worker/session_handles.h"

namespace tf::worker {

class SessionNotifications {
 public:
  class Host {
   public:
    virtual ~Host() = default;
    virtual HandleTable& Handles() = 0;
    virtual bool KnownDevice(int32_t d) const = 0;
    // Sends a kEvtAsyncNotification event to the client; callable from any thread.
    virtual void SendAsyncNotification(const transport::Writer& payload) = 0;
  };

  SessionNotifications(const driver::DriverTable& d, Host& host) : d_(d), host_(host) {}

  static bool Handles(driver::Fn fn);
  CUresult Call(driver::Fn fn, transport::Reader& rd, transport::Writer& out);
  // Unregisters what the client left; no event is sent from then on.
  void Cleanup();

  // The most registrations one session may make over its life (each keeps a few bytes until the
  // session ends: the driver may still be inside the callback of one just unregistered).
  static constexpr size_t kMaxRegistrations = 4096;

 private:
  struct Registration {
    SessionNotifications* self = nullptr;
    std::atomic<uint64_t> wire{0};  // 0 until published, and again once unregistered
    int32_t device = 0;
    uint64_t real = 0;
  };
  static void Notified(CUasyncNotificationInfo* info, void* user, CUasyncCallbackHandle handle);

  const driver::DriverTable& d_;
  Host& host_;
  std::atomic<bool> stopping_{false};
  std::vector<std::unique_ptr<Registration>> registrations_;
};

}  // namespace tf::worker
