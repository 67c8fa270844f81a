/* The few NVML types and constants TensorFusion uses, declared by us because nvml.h is not a
 * build dependency. Values and layouts match NVIDIA's nvml.h ABI. Self-contained C: safe to include
 * from C and C++ (src/ includes it when it loads NVML with dlopen). */
#ifndef TF_TESTS_FAKECUDA_NVML_TYPES_H_
#define TF_TESTS_FAKECUDA_NVML_TYPES_H_

#ifdef __cplusplus
extern "C" {
#endif

typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_UNKNOWN 999

typedef struct nvmlDevice_st* nvmlDevice_t;

/* Bytes. */
typedef struct nvmlMemory_st {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_t;

/* Bytes; version must be nvmlMemory_v2. */
typedef struct nvmlMemory_v2_st {
  unsigned int version;
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_v2_t;

#define NVML_STRUCT_VERSION(data, ver) (unsigned int)(sizeof(nvml##data##_v##ver##_t) | ((ver) << 24U))
#define nvmlMemory_v2 NVML_STRUCT_VERSION(Memory, 2)

/* Percent over the last sample period. */
typedef struct nvmlUtilization_st {
  unsigned int gpu;
  unsigned int memory;
} nvmlUtilization_t;

#define NVML_DEVICE_NAME_BUFFER_SIZE 64
#define NVML_DEVICE_NAME_V2_BUFFER_SIZE 96
#define NVML_DEVICE_UUID_BUFFER_SIZE 80
#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96
#define NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE 80

#ifdef __cplusplus
}
#endif

#endif /* TF_TESTS_FAKECUDA_NVML_TYPES_H_ */
