// The NVML shim's forwarding table, shared by the generated trampolines (nvml_trampolines.cc,
// from api/nvml-exports.txt by gen_nvml_trampolines.py) and the hand-written shim (nvml_shim.cc).
//
// tf_nvml_slots[i] is the address every call of tf_nvml_names[i] jumps to. All slots start at a
// "not initialised" answer; the load-time constructor in nvml_shim.cc fills them from the real
// libnvidia-ml.so.1 once, before dlopen of the shim returns, and never changes them afterwards.
#pragma once

#include "nvml_slots.h"  // generated: enum tf::nvml::Slot { kSlot_<name>, ..., kSlotCount }

// NVML's ABI, declared by us (nvml.h is not a build dependency). Values and layouts match
// NVIDIA's nvml.h.
extern "C" {

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st* nvmlDevice_t;

typedef struct nvmlMemory_st {
  unsigned long long total;  // bytes
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_t;

typedef struct nvmlMemory_v2_st {
  unsigned int version;  // nvmlMemory_v2
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_v2_t;

}  // extern "C"

namespace tf::nvml {

inline constexpr nvmlReturn_t kSuccess = 0;
inline constexpr nvmlReturn_t kErrorUninitialized = 1;
inline constexpr nvmlReturn_t kErrorInsufficientSize = 7;
inline constexpr nvmlReturn_t kErrorLibraryNotFound = 12;
inline constexpr nvmlReturn_t kErrorFunctionNotFound = 13;
inline constexpr unsigned kUuidBufferSize = 96;  // NVML_DEVICE_UUID_V2_BUFFER_SIZE

}  // namespace tf::nvml

extern "C" {

// Hidden: only the nvml* names and the marker leave the library (libtfusion-nvml.map).
extern void* tf_nvml_slots[tf::nvml::kSlotCount] __attribute__((visibility("hidden")));
extern const char* const tf_nvml_names[tf::nvml::kSlotCount] __attribute__((visibility("hidden")));

// Initial answer of every nvmlReturn_t slot: NVML_ERROR_UNINITIALIZED. Takes and ignores any
// arguments (the x86-64 calling convention makes that safe for a function that reads none).
nvmlReturn_t tf_nvml_uninitialized() __attribute__((visibility("hidden")));
// Initial (and, without a real library, final) answer of nvmlErrorString.
const char* tf_nvml_error_string_fallback(nvmlReturn_t result) __attribute__((visibility("hidden")));

}  // extern "C"
