// Legacy CUDA IPC of device memory. With tiering, cudaMalloc memory is a movable range (VMM
// memory the driver gives no legacy IPC handle for): Tiering::ExportIpc brings it back if it is
// swapped, keeps it resident from then on and hands out our own handle (movable_ipc.h). Every
// process that loads the limiter, tiered or not, opens and closes our handles itself; the
// driver's handles and everything else go to the driver unchanged.
#include "limiter/export_support.h"
#include "limiter/movable_ipc.h"
#include "limiter/tiering.h"

namespace tf::limiter {

CUresult Hook_cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) {
  TF_REAL_OR_MISSING(cuIpcGetMemHandle)
  CUresult r = CUDA_SUCCESS;
  if (g_tiering && Tiering::Instance().ExportIpc(pHandle, dptr, &r)) return r;
  return fn(pHandle, dptr);
}

namespace {
template <typename Fn>
CUresult OpenIpc(Fn fn, driver::Fn id, CUdeviceptr* pdptr, const CUipcMemHandle& handle, unsigned int flags) {
  CUresult r = CUDA_SUCCESS;
  if (IpcImports::Instance().Open(pdptr, handle, flags, &r)) return r;
  if (fn == nullptr) return Missing(id);
  return fn(pdptr, handle, flags);
}
}  // namespace

// Our handles do not need the driver's open entry point (EnsureInit through Real() first).
CUresult Hook_cuIpcOpenMemHandle(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int Flags) {
  return OpenIpc(Real().cuIpcOpenMemHandle, driver::Fn::cuIpcOpenMemHandle, pdptr, handle, Flags);
}

CUresult Hook_cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int Flags) {
  return OpenIpc(Real().cuIpcOpenMemHandle_v2, driver::Fn::cuIpcOpenMemHandle_v2, pdptr, handle, Flags);
}

CUresult Hook_cuIpcCloseMemHandle(CUdeviceptr dptr) {
  TF_REAL_OR_MISSING(cuIpcCloseMemHandle)
  CUresult r = CUDA_SUCCESS;
  if (IpcImports::Instance().Close(dptr, &r)) return r;
  return fn(dptr);
}

}  // namespace tf::limiter
