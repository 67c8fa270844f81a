// Fake multicast objects (cuMulticast*). A multicast object is a PhysicalMemory marked multicast:
// a handle cuMemRelease releases (and cuMemMap maps, onto memory of its own that nothing else
// sees), not charged to any device. The checks follow the documented rules: a team of numDevices
// devices, each added once, all of them before any memory is bound (the driver blocks the bind
// until then; the fake answers CUDA_ERROR_INVALID_VALUE rather than block); offsets and sizes are
// multiples of the minimum granularity and lie inside the object and the memory; memory comes
// from cuMemCreate (BindMem) or a VMM mapping (BindAddr) on a device of the team; a range is bound
// once per device and unbound exactly as bound. Nothing is multicast: the fake keeps the bookkeeping.
#include <sys/mman.h>
#include <unistd.h>

#include <memory>

#include "fake_driver.h"

using fakecuda::Driver;
using fakecuda::PhysicalMemory;

namespace {

constexpr size_t kRecommended = 4 * fakecuda::kGranularity;

// REQUIRES d.mu. A live multicast object, or nullptr.
PhysicalMemory* FindObject(Driver& d, CUmemGenericAllocationHandle h) {
  auto* p = reinterpret_cast<PhysicalMemory*>(h);
  if (d.physical.count(p) == 0 || !p->multicast || p->released) return nullptr;
  return p;
}

bool Aligned(size_t v) { return v % fakecuda::kGranularity == 0; }

// REQUIRES d.mu. Records a bind of [offset, offset + size) of mc for memory of device dev.
CUresult Bind(PhysicalMemory* mc, size_t offset, size_t size, int dev) {
  if (mc->team_added.size() != mc->team) return CUDA_ERROR_INVALID_VALUE;
  if (mc->team_added.count(dev) == 0) return CUDA_ERROR_INVALID_DEVICE;
  if (size == 0 || !Aligned(offset) || !Aligned(size) || offset > mc->size || size > mc->size - offset) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (const auto& [key, n] : mc->bound) {
    if (key.first == dev && key.second < offset + size && offset < key.second + n) return CUDA_ERROR_INVALID_VALUE;
  }
  mc->bound[{dev, offset}] = size;
  return CUDA_SUCCESS;
}

}  // namespace

CUresult cuMulticastGetGranularity(size_t* granularity, const CUmulticastObjectProp* prop,
                                   CUmulticastGranularity_flags option) {
  FAKECUDA_ENTER();
  if (granularity == nullptr || prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (option == CU_MULTICAST_GRANULARITY_MINIMUM) *granularity = fakecuda::kGranularity;
  else if (option == CU_MULTICAST_GRANULARITY_RECOMMENDED) *granularity = kRecommended;
  else return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

CUresult cuMulticastCreate(CUmemGenericAllocationHandle* handle, const CUmulticastObjectProp* prop) {
  FAKECUDA_ENTER();
  Driver& d = Driver::Get();
  if (handle == nullptr || prop == nullptr || prop->flags != 0 || prop->size == 0 || !Aligned(prop->size) ||
      prop->numDevices == 0 || prop->numDevices > static_cast<unsigned>(d.topology.device_count)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  int fd = memfd_create("fakecuda-multicast", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(prop->size)) != 0) {
    if (fd >= 0) close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  auto mc = std::make_unique<PhysicalMemory>();
  mc->size = prop->size;
  mc->fd = fd;
  mc->multicast = true;
  mc->team = prop->numDevices;
  mc->handle_types = static_cast<CUmemAllocationHandleType>(prop->handleTypes);
  std::lock_guard<std::mutex> lock(d.mu);
  *handle = reinterpret_cast<CUmemGenericAllocationHandle>(mc.get());
  d.physical[mc.get()] = std::move(mc);
  return CUDA_SUCCESS;
}

CUresult cuMulticastAddDevice(CUmemGenericAllocationHandle handle, CUdevice dev) {
  FAKECUDA_ENTER();
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  PhysicalMemory* mc = FindObject(d, handle);
  if (mc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= d.topology.device_count) return CUDA_ERROR_INVALID_DEVICE;
  if (mc->team_added.count(dev) || mc->team_added.size() >= mc->team || !mc->bound.empty()) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  mc->team_added.insert(dev);
  mc->device = *mc->team_added.begin();
  return CUDA_SUCCESS;
}

CUresult cuMulticastBindMem(CUmemGenericAllocationHandle handle, size_t mc_offset,
                            CUmemGenericAllocationHandle mem, size_t mem_offset, size_t size,
                            unsigned long long flags) {
  FAKECUDA_ENTER();
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  PhysicalMemory* mc = FindObject(d, handle);
  auto* phys = reinterpret_cast<PhysicalMemory*>(mem);
  if (mc == nullptr || flags != 0 || d.physical.count(phys) == 0 || phys->multicast || phys->released ||
      !Aligned(mem_offset) || mem_offset > phys->size || size > phys->size - mem_offset) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return Bind(mc, mc_offset, size, phys->device);
}

CUresult cuMulticastBindAddr(CUmemGenericAllocationHandle handle, size_t mc_offset, CUdeviceptr ptr,
                             size_t size, unsigned long long flags) {
  FAKECUDA_ENTER();
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  PhysicalMemory* mc = FindObject(d, handle);
  fakecuda::Allocation* a = d.FindAllocation(ptr);
  if (mc == nullptr || flags != 0 || a == nullptr || a->kind != fakecuda::MemoryKind::kVmmMapping ||
      !Aligned(ptr - a->base) || size > a->base + a->size - ptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return Bind(mc, mc_offset, size, a->device);
}

CUresult cuMulticastUnbind(CUmemGenericAllocationHandle handle, CUdevice dev, size_t mc_offset, size_t size) {
  FAKECUDA_ENTER();
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  PhysicalMemory* mc = FindObject(d, handle);
  if (mc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= d.topology.device_count) return CUDA_ERROR_INVALID_DEVICE;
  auto it = mc->bound.find({dev, mc_offset});
  if (it == mc->bound.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  mc->bound.erase(it);
  return CUDA_SUCCESS;
}
