/* The private C interface between the remote client stub (libtfusion-client.so, SONAME
 * libcuda.so.1) and the client's NVML (libtfusion-client-nvml.so, SONAME libnvidia-ml.so.1) in
 * the same process. The NVML library finds these two functions with dlsym on the loaded
 * libcuda.so.1; a driver that lacks them is not the stub. See docs/remote.md ("NVML in the
 * client"). Plain C: both sides are built -fno-exceptions, and the layout is the contract. */
#ifndef TF_CLIENT_NVML_BRIDGE_H_
#define TF_CLIENT_NVML_BRIDGE_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped when a struct below changes; the NVML library refuses a stub with another version. */
#define TFUSION_CLIENT_NVML_ABI 1

/* One device of the session, as the worker described it when the client connected. */
typedef struct tfusion_client_device {
  char name[257];               /* NUL-terminated */
  uint8_t uuid[16];             /* CUuuid bytes */
  uint64_t total_mem;           /* cuDeviceTotalMem: the vGPU's limit when it has one */
  int32_t pci_domain, pci_bus, pci_device;  /* CU_DEVICE_ATTRIBUTE_PCI_* (the worker's machine) */
  int32_t cc_major, cc_minor;
  int32_t multi_gpu_board;
  int32_t compute_mode;         /* CUcomputemode: same values as nvmlComputeMode_t */
} tfusion_client_device;

/* Connects (as cuInit(0)) when this process has no session yet, then copies up to `max` devices
 * into `out` and their number into *count, the driver version into *driver_version. Returns the
 * CUresult (0 success). abi must be TFUSION_CLIENT_NVML_ABI. */
typedef int (*tfusion_client_devices_fn)(int abi, int* driver_version, tfusion_client_device* out,
                                         int max, int* count);

/* Memory of `device` as CUDA reports it to this process: *free and *total from cuMemGetInfo in a
 * context of this process on that device (the vGPU's limit and usage when it has one), and
 * *process_used, the bytes this process has allocated there. *has_context is 0 when the process
 * has no usable context on the device; then *total is the device's total memory, *free = *total
 * - *process_used. Returns the CUresult (0 success). */
typedef int (*tfusion_client_mem_info_fn)(int abi, int device, uint64_t* free, uint64_t* total,
                                          uint64_t* process_used, int* has_context);

#ifdef __cplusplus
}
#endif

#endif /* TF_CLIENT_NVML_BRIDGE_H_ */
