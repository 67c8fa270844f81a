// The driver's asynchronous notifications (cuDeviceRegisterAsyncNotification,
// cuDeviceUnregisterAsyncNotification): the worker registers a callback of its own for each
// registration and sends kEvtAsyncNotification when the driver calls it
// (src/worker/session_notifications.h); this file keeps the program's callback and userData per
// registration and calls them on the client's callback thread (client_callbacks.cc), as the
// driver calls them on a thread of its own. A callback that registers or unregisters gets
// CUDA_ERROR_NOT_PERMITTED, as from the driver.
#include <pthread.h>

#include <map>

#include "client/client_internal.h"
#include "tf_client_impl.h"

namespace tf::client {
namespace {

using driver::Fn;
using remote::Op;
using transport::Writer;

struct Registration {
  CUasyncCallback fn = nullptr;
  void* user = nullptr;
};

struct Registrations {
  // Held across a registration's round trip, so a notification that overtakes its reply waits for
  // the registration to be known here.
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  std::map<uint64_t, Registration> by_name;
};

Registrations& Regs() {
  static auto* r = new Registrations();  // never destroyed: the callback thread may run at exit
  return *r;
}

thread_local bool t_in_callback = false;

struct ForkReset {
  ForkReset() {
    pthread_atfork(nullptr, nullptr, [] {
      Registrations& r = Regs();
      pthread_mutex_init(&r.mu, nullptr);
      r.by_name.clear();  // the child's session has none
    });
  }
} g_fork_reset;

}  // namespace

void HandleAsyncNotification(const transport::InFrame& in) {
  transport::Reader rd(in.payload, in.payload_length);
  uint64_t name = 0, bytes = 0;
  uint32_t type = 0;
  rd.U64(&name);
  rd.U32(&type);
  if (!rd.U64(&bytes) || !rd.Finish()) return;
  (void)RunOnCallbackThread([name, type, bytes] {
    Registrations& r = Regs();
    pthread_mutex_lock(&r.mu);
    auto it = r.by_name.find(name);
    const Registration reg = it == r.by_name.end() ? Registration{} : it->second;
    pthread_mutex_unlock(&r.mu);
    if (reg.fn == nullptr) return;  // unregistered since
    CUasyncNotificationInfo info = {};
    info.type = static_cast<CUasyncNotificationType>(type);
    if (info.type == CU_ASYNC_NOTIFICATION_TYPE_OVER_BUDGET) info.info.overBudget.bytesOverBudget = bytes;
    t_in_callback = true;
    reg.fn(&info, reg.user, reinterpret_cast<CUasyncCallbackHandle>(name));
    t_in_callback = false;
  });
}

CUresult Impl_cuDeviceRegisterAsyncNotification(CUdevice dev, CUasyncCallback fn, void* user,
                                                CUasyncCallbackHandle* handle) {
  if (t_in_callback) return CUDA_ERROR_NOT_PERMITTED;
  if (fn == nullptr || handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  uint8_t buf[4];
  Writer w(buf, sizeof(buf));
  w.I32(dev);
  Registrations& r = Regs();
  pthread_mutex_lock(&r.mu);
  ReplyView rv;
  CUresult res = CallSync(l.session(), Op(Fn::cuDeviceRegisterAsyncNotification), w, &rv);
  uint64_t name = 0;
  if (res == CUDA_SUCCESS && !rv.reader.U64(&name)) res = CUDA_ERROR_UNKNOWN;
  if (res == CUDA_SUCCESS) res = CallbackListenersChanged(1);
  if (res == CUDA_SUCCESS) {
    r.by_name[name] = Registration{fn, user};
    *handle = reinterpret_cast<CUasyncCallbackHandle>(name);
  }
  pthread_mutex_unlock(&r.mu);
  return res;
}

CUresult Impl_cuDeviceUnregisterAsyncNotification(CUdevice dev, CUasyncCallbackHandle handle) {
  if (t_in_callback) return CUDA_ERROR_NOT_PERMITTED;
  TF_LOCK(l);
  uint8_t buf[12];
  Writer w(buf, sizeof(buf));
  w.I32(dev);
  w.U64(H(handle));
  CUresult res = Simple(l, Fn::cuDeviceUnregisterAsyncNotification, w);
  if (res != CUDA_SUCCESS) return res;
  Registrations& r = Regs();
  pthread_mutex_lock(&r.mu);
  const bool known = r.by_name.erase(H(handle)) != 0;
  pthread_mutex_unlock(&r.mu);
  if (known) CallbackListenersChanged(-1);
  return CUDA_SUCCESS;
}

}  // namespace tf::client
