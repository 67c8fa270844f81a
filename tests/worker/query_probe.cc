// A driver-API program for the remote tests of queries and host-side encodings (stream and
// context queries, PCI bus ids, tensor maps) and of page-locked memory used as device memory.
// Run directly on tests/fakecuda or through the client stub and a worker, it prints "key=value"
// lines the tests compare (values that differ between processes, such as ids, are printed as
// relations: distinct, stable, equal to another answer).
#include <cuda.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "probe_util.h"

namespace {

using tf_probe::Fill;
using tf_probe::Kernel;
using tf_probe::Setup;

std::string Hex(const void* p, size_t n) {
  std::string s;
  char b[3];
  for (size_t i = 0; i < n; ++i) {
    snprintf(b, sizeof(b), "%02x", static_cast<const unsigned char*>(p)[i]);
    s += b;
  }
  return s;
}

int Streams(CUcontext ctx) {
  CUstream a, b;
  CHECK(cuStreamCreateWithPriority(&a, CU_STREAM_NON_BLOCKING, -1));
  CHECK(cuStreamCreate(&b, 0));
  int prio = 9;
  unsigned flags = 9;
  CHECK(cuStreamGetPriority(a, &prio));
  CHECK(cuStreamGetFlags(a, &flags));
  std::printf("stream_a=%d:%u\n", prio, flags);
  CHECK(cuStreamGetPriority(b, &prio));
  CHECK(cuStreamGetFlags(b, &flags));
  std::printf("stream_b=%d:%u\n", prio, flags);
  unsigned long long ia = 0, ia2 = 0, ib = 0, in = 0;
  CHECK(cuStreamGetId(a, &ia));
  CHECK(cuStreamGetId(a, &ia2));
  CHECK(cuStreamGetId(b, &ib));
  CHECK(cuStreamGetId(nullptr, &in));
  std::printf("stream_ids=%d:%d:%d\n", ia == ia2, ia != ib, in != ia && in != ib);
  CUdevice dev = -1;
  CHECK(cuStreamGetDevice(a, &dev));
  CUcontext sc = nullptr, nc = nullptr;
  CHECK(cuStreamGetCtx(a, &sc));
  CHECK(cuStreamGetCtx(nullptr, &nc));
  CUcontext c2 = nullptr;
  CUgreenCtx green = reinterpret_cast<CUgreenCtx>(0x1);
  CHECK(cuStreamGetCtx_v2(b, &c2, &green));
  std::printf("stream_where=%d:%d:%d:%d:%d\n", dev, sc == ctx, nc == ctx, c2 == ctx,
              green == nullptr);
  CUstream bogus = reinterpret_cast<CUstream>(0x5a5a5a0);
  std::printf("stream_bogus=%d:%d\n", static_cast<int>(cuStreamGetPriority(bogus, &prio)),
              static_cast<int>(cuStreamGetId(bogus, &ia)));
  std::printf("stream_null_out=%d\n", static_cast<int>(cuStreamGetFlags(a, nullptr)));
  // A destroyed stream's answers are not kept: a new stream may get its handle.
  CHECK(cuStreamDestroy(b));
  CUstream c;
  CHECK(cuStreamCreateWithPriority(&c, 0, -3));
  CHECK(cuStreamGetPriority(c, &prio));
  std::printf("stream_new=%d\n", prio);
  CHECK(cuStreamDestroy(a));
  CHECK(cuStreamDestroy(c));
  return 0;
}

int Contexts(CUcontext primary) {
  unsigned long long p = 0, p2 = 0, cur = 0, other = 0;
  CHECK(cuCtxGetId(primary, &p));
  CHECK(cuCtxGetId(primary, &p2));
  CHECK(cuCtxGetId(nullptr, &cur));
  CUcontext created;
  CUdevice dev;
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuCtxCreate(&created, nullptr, 0, dev));
  CHECK(cuCtxGetId(created, &other));
  std::printf("ctx_ids=%d:%d:%d:%d\n", p != 0, p == p2, p == cur, other != p);
  std::printf("ctx_bogus=%d\n",
              static_cast<int>(cuCtxGetId(reinterpret_cast<CUcontext>(0x5a5a5a0), &p)));
  CHECK(cuCtxDestroy(created));
  CHECK(cuCtxSetCurrent(primary));
  return 0;
}

int Pci() {
  char id[64] = {};
  CHECK(cuDeviceGetPCIBusId(id, sizeof(id), 0));
  std::printf("pci_bus_id=%s\n", id);
  char cut[5] = {};
  // A buffer too short for the id and its NUL is refused, as the driver refuses it.
  std::printf("pci_bus_id_cut=%d\n", static_cast<int>(cuDeviceGetPCIBusId(cut, sizeof(cut), 0)));
  std::printf("pci_bad_device=%d\n", static_cast<int>(cuDeviceGetPCIBusId(id, sizeof(id), 42)));
  CHECK(cuDeviceGetPCIBusId(id, sizeof(id), 0));
  std::string text = id;
  std::string lower = text;
  for (char& ch : lower) ch = static_cast<char>(tolower(static_cast<unsigned char>(ch)));
  const std::string no_domain = text.substr(text.find(':') + 1);
  const std::string no_function = text.substr(0, text.rfind('.'));
  for (const auto& [key, form] : {std::pair<const char*, std::string>{"by_pci", text},
                                  {"by_pci_lower", lower},
                                  {"by_pci_no_domain", no_domain},
                                  {"by_pci_no_function", no_function},
                                  {"by_pci_absent", "0000:ff:1f.0"},
                                  {"by_pci_junk", "junk"},
                                  {"by_pci_empty", ""}}) {
    CUdevice d = -7;
    CUresult r = cuDeviceGetByPCIBusId(&d, form.c_str());
    std::printf("%s=%d:%d\n", key, static_cast<int>(r), r == CUDA_SUCCESS ? d : -7);
  }
  int can = -1;
  CHECK(cuDeviceCanAccessPeer(&can, 0, 0));
  std::printf("peer_self=%d\n", can);
  return 0;
}

int TensorMaps() {
  alignas(64) CUtensorMap map;
  void* const addr = reinterpret_cast<void*>(0x7f0000010000ull);  // encoded, never dereferenced
  const cuuint64_t dims[3] = {1024, 512, 8};
  const cuuint64_t strides[2] = {1024 * 2, 1024 * 2 * 512};
  const cuuint32_t box[3] = {64, 32, 1};
  const cuuint32_t elem[3] = {1, 1, 1};
  memset(&map, 0xee, sizeof(map));
  CUresult r = cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3, addr, dims, strides,
                                      box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  std::printf("tiled=%d:%s\n", static_cast<int>(r), Hex(&map, sizeof(map)).c_str());
  const cuuint32_t big_box[3] = {512, 32, 1};
  std::printf("tiled_bad_box=%d\n",
              static_cast<int>(cuTensorMapEncodeTiled(
                  &map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3, addr, dims, strides, big_box, elem,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                  CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)));
  std::printf("tiled_bad_rank=%d\n",
              static_cast<int>(cuTensorMapEncodeTiled(
                  &map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 6, addr, dims, strides, box, elem,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                  CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)));
  std::printf("tiled_null_dims=%d\n",
              static_cast<int>(cuTensorMapEncodeTiled(
                  &map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3, addr, nullptr, strides, box, elem,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                  CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)));
  // Rank 1 has no strides (NULL is fine); an undefined swizzle is not cuda.h's.
  const cuuint64_t dims1[1] = {4096};
  std::printf("tiled_rank1=%d\n",
              static_cast<int>(cuTensorMapEncodeTiled(
                  &map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 1, addr, dims1, nullptr, box, elem,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                  CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)));
  std::printf("tiled_rank1_map=%s\n", Hex(&map, sizeof(map)).c_str());
  std::printf("tiled_bad_swizzle=%d\n",
              static_cast<int>(cuTensorMapEncodeTiled(
                  &map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3, addr, dims, strides, box, elem,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, static_cast<CUtensorMapSwizzle>(99),
                  CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)));
  const cuuint64_t dims4[4] = {64, 16, 16, 2};
  const cuuint64_t strides4[3] = {128, 128 * 16, 128 * 16 * 16};
  const cuuint32_t elem4[4] = {1, 1, 1, 1};
  const int lower[2] = {-1, -1}, upper[2] = {1, 1};
  r = cuTensorMapEncodeIm2col(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4, addr, dims4, strides4,
                              lower, upper, 64, 32, elem4, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  std::printf("im2col=%d:%s\n", static_cast<int>(r), Hex(&map, sizeof(map)).c_str());
  std::printf("im2col_rank2=%d\n",
              static_cast<int>(cuTensorMapEncodeIm2col(
                  &map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, addr, dims4, strides4, lower, upper, 64,
                  32, elem4, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_64B,
                  CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)));
  r = cuTensorMapEncodeIm2colWide(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4, addr, dims4, strides4,
                                  -1, 1, 64, 32, elem4, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                  CU_TENSOR_MAP_IM2COL_WIDE_MODE_W, CU_TENSOR_MAP_SWIZZLE_64B,
                                  CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  std::printf("im2col_wide=%d:%s\n", static_cast<int>(r), Hex(&map, sizeof(map)).c_str());
  r = cuTensorMapReplaceAddress(&map, reinterpret_cast<void*>(0x7f0000020000ull));
  std::printf("replaced=%d:%s\n", static_cast<int>(r), Hex(&map, sizeof(map)).c_str());
  std::printf("replaced_misaligned=%d\n",
              static_cast<int>(cuTensorMapReplaceAddress(&map, reinterpret_cast<void*>(0x7f0000020008ull))));
  return 0;
}

// A module's function count; a module unloaded since fails.
int Modules() {
  CUmodule mod;
  CHECK(cuModuleLoadData(&mod, "fakecuda:builtin"));
  unsigned n = 0;
  CHECK(cuModuleGetFunctionCount(&n, mod));
  const int null_out = static_cast<int>(cuModuleGetFunctionCount(nullptr, mod));
  CHECK(cuModuleUnload(mod));
  std::printf("function_count=%u:%d:%d\n", n, null_out, cuModuleGetFunctionCount(&n, mod) != CUDA_SUCCESS);
  return 0;
}

// Function loading and stream attributes: what is set is read back (a device address in the
// access-policy window unchanged, the priority also through cuStreamGetPriority); attributes a
// stream does not have, NULL values and bad handles fail that call only.
int LoadingAndAttributes() {
  CUfunction f = Kernel("fill_u32");
  CUfunctionLoadingState state = CU_FUNCTION_LOADING_STATE_MAX;
  const CUresult load = cuFuncLoad(f);
  const CUresult is = cuFuncIsLoaded(&state, f);
  std::printf("func_loaded=%d:%d:%d\n", static_cast<int>(load), static_cast<int>(is), static_cast<int>(state));
  CUfunction bogus = reinterpret_cast<CUfunction>(0x5a5a5a0);
  std::printf("func_bad=%d:%d:%d\n", static_cast<int>(cuFuncLoad(bogus)),
              static_cast<int>(cuFuncIsLoaded(&state, bogus)), static_cast<int>(cuFuncIsLoaded(nullptr, f)));

  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr p;
  CHECK(cuMemAlloc(&p, 1 << 16));
  CUstreamAttrValue v{}, got{};
  v.accessPolicyWindow.base_ptr = reinterpret_cast<void*>(p);
  v.accessPolicyWindow.num_bytes = 1 << 16;
  v.accessPolicyWindow.hitRatio = 0.5f;
  v.accessPolicyWindow.hitProp = CU_ACCESS_PROPERTY_PERSISTING;
  v.accessPolicyWindow.missProp = CU_ACCESS_PROPERTY_STREAMING;
  CUresult set = cuStreamSetAttribute(s, CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW, &v);
  CUresult get = cuStreamGetAttribute(s, CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW, &got);
  std::printf("stream_attr_window=%d:%d:%d:%zu:%g:%d:%d\n", static_cast<int>(set), static_cast<int>(get),
              got.accessPolicyWindow.base_ptr == reinterpret_cast<void*>(p), got.accessPolicyWindow.num_bytes,
              static_cast<double>(got.accessPolicyWindow.hitRatio), static_cast<int>(got.accessPolicyWindow.hitProp),
              static_cast<int>(got.accessPolicyWindow.missProp));
  v = CUstreamAttrValue{};
  v.syncPolicy = CU_SYNC_POLICY_YIELD;
  set = cuStreamSetAttribute(s, CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY, &v);
  got = CUstreamAttrValue{};
  get = cuStreamGetAttribute(s, CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY, &got);
  std::printf("stream_attr_sync=%d:%d:%d\n", static_cast<int>(set), static_cast<int>(get),
              static_cast<int>(got.syncPolicy));
  // The priority: a getter answered before the change answers the new one after it.
  int before = 1, after = 1;
  CHECK(cuStreamGetPriority(s, &before));
  v = CUstreamAttrValue{};
  v.priority = -2;
  set = cuStreamSetAttribute(s, CU_STREAM_ATTRIBUTE_PRIORITY, &v);
  CHECK(cuStreamGetPriority(s, &after));
  got = CUstreamAttrValue{};
  get = cuStreamGetAttribute(s, CU_STREAM_ATTRIBUTE_PRIORITY, &got);
  std::printf("stream_attr_priority=%d:%d:%d:%d:%d\n", static_cast<int>(set), static_cast<int>(get), before,
              after, got.priority);
  std::printf("stream_attr_bad=%d:%d:%d:%d\n",
              static_cast<int>(cuStreamGetAttribute(s, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &got)),
              static_cast<int>(cuStreamSetAttribute(s, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &v)),
              static_cast<int>(cuStreamGetAttribute(s, CU_STREAM_ATTRIBUTE_PRIORITY, nullptr)),
              static_cast<int>(cuStreamGetAttribute(reinterpret_cast<CUstream>(0x5a5a5a0),
                                                    CU_STREAM_ATTRIBUTE_PRIORITY, &got)));
  CHECK(cuMemFree(p));
  CHECK(cuStreamDestroy(s));
  return 0;
}

int Queries() {
  CUcontext ctx = Setup();
  if (int rc = Streams(ctx)) return rc;
  if (int rc = Contexts(ctx)) return rc;
  if (int rc = Pci()) return rc;
  if (int rc = TensorMaps()) return rc;
  if (int rc = Modules()) return rc;
  if (int rc = LoadingAndAttributes()) return rc;
  std::printf("done=1\n");
  return 0;
}

// Page-locked memory used where device memory is expected, as XLA does with a small
// cuMemHostAlloc buffer under unified addressing: memset on a stream, kernels write it, then
// read back into pageable (stack) memory on that stream.
int PinnedAsDevice() {
  Setup();
  CUfunction fill = Kernel("fill_u32");
  CUstream st;
  CHECK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  void* host = nullptr;
  CHECK(cuMemHostAlloc(&host, 8, CU_MEMHOSTALLOC_PORTABLE));
  const CUdeviceptr p = reinterpret_cast<CUdeviceptr>(host);
  CHECK(cuMemsetD32Async(p, 0xffffffffu, 2, st));
  Fill(fill, p, 0x5eed, 1, st);
  Fill(fill, p + 4, 0xbeef, 1, st);
  uint32_t out[2] = {0, 0};
  CUresult r = cuMemcpyDtoHAsync(out, p, sizeof(out), st);
  CUresult s = cuStreamSynchronize(st);
  std::printf("pinned_as_device=%d:%d:%x:%x\n", static_cast<int>(r), static_cast<int>(s), out[0],
              out[1]);
  CHECK(cuMemFreeHost(host));
  // A fresh buffer handed to kernels directly, with no memset or copy naming it first; the host
  // reads it after the stream's work is done.
  void* direct = nullptr;
  CHECK(cuMemHostAlloc(&direct, 64, CU_MEMHOSTALLOC_PORTABLE));
  auto* words = static_cast<volatile uint32_t*>(direct);
  words[0] = 7;
  words[1] = 7;
  const CUdeviceptr d = reinterpret_cast<CUdeviceptr>(direct);
  Fill(fill, d, 0xa11ce, 1, st);
  Fill(fill, d + 4, 0xb0b, 1, st);
  CUresult ds = cuStreamSynchronize(st);
  std::printf("pinned_kernel_direct=%d:%x:%x\n", static_cast<int>(ds), words[0], words[1]);
  CHECK(cuMemFreeHost(direct));
  CHECK(cuStreamDestroy(st));
  std::printf("done=1\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  if (!strcmp(mode, "queries")) return Queries();
  if (!strcmp(mode, "pinned_as_device")) return PinnedAsDevice();
  std::fprintf(stderr, "usage: query_probe queries|pinned_as_device\n");
  return 2;
}
