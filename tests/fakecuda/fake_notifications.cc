// Fake asynchronous notifications (cuDeviceRegisterAsyncNotification and its unregistration).
// The fake device never runs out of its budget by itself: the built-in kernel
// `notify_over_budget(unsigned long long bytes)` (module "builtin") makes it send a
// CU_ASYNC_NOTIFICATION_TYPE_OVER_BUDGET notification of that many bytes to every registered
// callback, on a thread of the fake's own (as the driver calls them), one callback after another.
// A callback that registers or unregisters gets CUDA_ERROR_NOT_PERMITTED.
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "fake_driver.h"

namespace {

struct Entry {
  CUdevice device = 0;
  CUasyncCallback fn = nullptr;
  void* user = nullptr;
};

struct Registry {
  std::mutex mu;
  std::map<Entry*, std::unique_ptr<Entry>> entries;
};

Registry& Reg() {
  static auto* r = new Registry();  // leaked: a notification thread may outlive static destruction
  return *r;
}

thread_local bool t_notifying = false;

}  // namespace

namespace fakecuda {

void NotifyOverBudget(unsigned long long bytes) {
  std::vector<std::pair<Entry*, Entry>> targets;
  {
    std::lock_guard<std::mutex> lock(Reg().mu);
    for (auto& [p, e] : Reg().entries) targets.emplace_back(p, *e);
  }
  if (targets.empty()) return;
  std::thread([targets, bytes] {
    t_notifying = true;
    for (const auto& [handle, e] : targets) {
      CUasyncNotificationInfo info = {};
      info.type = CU_ASYNC_NOTIFICATION_TYPE_OVER_BUDGET;
      info.info.overBudget.bytesOverBudget = bytes;
      e.fn(&info, e.user, reinterpret_cast<CUasyncCallbackHandle>(handle));
    }
  }).detach();
}

}  // namespace fakecuda

CUresult cuDeviceRegisterAsyncNotification(CUdevice device, CUasyncCallback fn, void* user,
                                           CUasyncCallbackHandle* handle) {
  FAKECUDA_ENTER();
  if (t_notifying) return CUDA_ERROR_NOT_PERMITTED;
  if (device < 0 || device >= fakecuda::Driver::Get().topology.device_count) return CUDA_ERROR_INVALID_DEVICE;
  if (fn == nullptr || handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto e = std::make_unique<Entry>();
  e->device = device;
  e->fn = fn;
  e->user = user;
  std::lock_guard<std::mutex> lock(Reg().mu);
  *handle = reinterpret_cast<CUasyncCallbackHandle>(e.get());
  Reg().entries[e.get()] = std::move(e);
  return CUDA_SUCCESS;
}

CUresult cuDeviceUnregisterAsyncNotification(CUdevice device, CUasyncCallbackHandle handle) {
  FAKECUDA_ENTER();
  if (t_notifying) return CUDA_ERROR_NOT_PERMITTED;
  if (device < 0 || device >= fakecuda::Driver::Get().topology.device_count) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> lock(Reg().mu);
  auto it = Reg().entries.find(reinterpret_cast<Entry*>(handle));
  if (it == Reg().entries.end() || it->second->device != device) return CUDA_ERROR_INVALID_VALUE;
  Reg().entries.erase(it);
  return CUDA_SUCCESS;
}
