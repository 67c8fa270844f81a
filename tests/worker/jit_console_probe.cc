// A driver-API program for the remote tests of device printf, JIT options, the linker and large
// kernel parameters (remote_e2e_test.cc, JitConsole*): it prints what it sees, so runs on the fake
// driver itself and through the remote vGPU can be compared line by line.
//
//   jit_console_probe console LINES   kernel printf (the fake's printf_lines) around synchronizing
//                                     calls: the lines must appear before "after_*" lines
//   jit_console_probe console_exit N  N lines, one cuCtxSynchronize, then _Exit at once
//   jit_console_probe jit             cuModuleLoadDataEx with log buffers, wall time, a bad image
//   jit_console_probe link FILE       cuLink* with two units (one from FILE), logs, a bad unit
//   jit_console_probe params32k       a kernel taking a 32000-byte struct by value
#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "probe_util.h"

namespace {

using tf_probe::Kernel;
using tf_probe::Setup;

void PrintfLines(CUfunction f, unsigned lines, unsigned tag, CUstream s = nullptr) {
  void* params[] = {&lines, &tag};
  CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr));
}

int Console(unsigned lines) {
  Setup();
  CUfunction pr = Kernel("printf_lines");
  PrintfLines(pr, lines, 7);
  std::printf("before_ctx_sync=1\n");
  CHECK(cuCtxSynchronize());
  std::printf("after_ctx_sync=1\n");
  CUstream s;
  CHECK(cuStreamCreate(&s, 0));
  PrintfLines(pr, 3, 8, s);
  CHECK(cuStreamSynchronize(s));
  std::printf("after_stream_sync=1\n");
  CUevent e;
  CHECK(cuEventCreate(&e, 0));
  PrintfLines(pr, 2, 9, s);
  CHECK(cuEventRecord(e, s));
  CHECK(cuEventSynchronize(e));
  std::printf("after_event_sync=1\n");
  CHECK(cuEventDestroy(e));
  CHECK(cuStreamDestroy(s));
  std::printf("done=1\n");
  return 0;
}

int ConsoleExit(unsigned lines) {
  Setup();
  PrintfLines(Kernel("printf_lines"), lines, 5);
  CHECK(cuCtxSynchronize());
  std::_Exit(0);
}

// Options as an application passes them: integers in the pointer-sized slots.
void* Slot(uintptr_t v) { return reinterpret_cast<void*>(v); }
unsigned Size(void* slot) { return static_cast<unsigned>(reinterpret_cast<uintptr_t>(slot)); }

int Jit() {
  Setup();
  char info[256], error[256];
  float wall = -1;
  CUjit_option opts[] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                         CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                         CU_JIT_WALL_TIME, CU_JIT_OPTIMIZATION_LEVEL};
  void* vals[] = {info, Slot(sizeof(info)), error, Slot(sizeof(error)), nullptr, Slot(3)};
  memset(info, 'x', sizeof(info));
  memset(error, 'x', sizeof(error));
  CUmodule m;
  CUresult r = cuModuleLoadDataEx(&m, "fakecuda:builtin", 6, opts, vals);
  memcpy(&wall, &vals[4], sizeof(wall));
  std::printf("jit_result=%d\njit_info=[%s]\njit_info_size=%u\njit_error=[%s]\njit_wall=%.2f\n",
              static_cast<int>(r), info, Size(vals[1]), error, wall);
  CUfunction f;
  CHECK(cuModuleGetFunction(&f, m, "fill_u32"));
  CUdeviceptr d;
  CHECK(cuMemAlloc(&d, 64));
  tf_probe::Fill(f, d, 0x5a, 16, nullptr);
  unsigned host[16] = {};
  CHECK(cuMemcpyDtoH(host, d, sizeof(host)));
  std::printf("jit_kernel_ok=%d\n", host[15] == 0x5a ? 1 : 0);
  CHECK(cuMemFree(d));
  CHECK(cuModuleUnload(m));

  // A bad image: the error log says why, also through the remote path.
  vals[1] = Slot(sizeof(info));
  vals[3] = Slot(sizeof(error));
  r = cuModuleLoadDataEx(&m, "not a module", 6, opts, vals);
  std::printf("bad_result=%d\nbad_error=[%s]\n", static_cast<int>(r), error);

  // A log buffer smaller than the message is filled and NUL-terminated.
  char small[12];
  CUjit_option sopts[] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES};
  void* svals[] = {small, Slot(sizeof(small))};
  r = cuModuleLoadDataEx(&m, "fakecuda:builtin", 2, sopts, svals);
  std::printf("small_result=%d\nsmall_info=[%s]\n", static_cast<int>(r), small);
  if (r == CUDA_SUCCESS) CHECK(cuModuleUnload(m));
  std::printf("done=1\n");
  return 0;
}

int Link(const char* file) {
  Setup();
  char info[512], error[512];
  CUjit_option opts[] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                         CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                         CU_JIT_WALL_TIME};
  void* vals[] = {info, Slot(sizeof(info)), error, Slot(sizeof(error)), nullptr};
  CUlinkState link;
  CHECK(cuLinkCreate(5, opts, vals, &link));
  char ptx[] = "fakecuda:builtin";
  CUjit_option in_opts[] = {CU_JIT_MAX_REGISTERS};
  void* in_vals[] = {Slot(64)};
  CHECK(cuLinkAddData(link, CU_JIT_INPUT_PTX, ptx, sizeof(ptx), "unit_a.ptx", 1, in_opts, in_vals));
  CHECK(cuLinkAddFile(link, CU_JIT_INPUT_PTX, file, 0, nullptr, nullptr));
  char garbage[] = "garbage";
  CUresult r = cuLinkAddData(link, CU_JIT_INPUT_PTX, garbage, sizeof(garbage), "bad.ptx", 0,
                             nullptr, nullptr);
  std::printf("bad_unit=%d\nbad_unit_error=[%s]\n", static_cast<int>(r), error);
  std::printf("missing_file=%d\n",
              static_cast<int>(cuLinkAddFile(link, CU_JIT_INPUT_PTX, "/nonexistent/x.ptx", 0,
                                             nullptr, nullptr)));
  void* cubin = nullptr;
  size_t size = 0;
  CHECK(cuLinkComplete(link, &cubin, &size));
  std::printf("cubin=[%.*s]\ncubin_size=%zu\n", static_cast<int>(size ? size - 1 : 0),
              static_cast<const char*>(cubin), size);
  std::printf("link_info=[%s]\nlink_info_size=%u\n", info, Size(vals[1]));
  // The cubin is the application's until cuLinkDestroy: load it and run kernels of both units.
  CUmodule m;
  CHECK(cuModuleLoadData(&m, cubin));
  CUfunction fill, add;
  CHECK(cuModuleGetFunction(&fill, m, "fill_u32"));
  CHECK(cuModuleGetFunction(&add, m, "add_u32"));
  CUdeviceptr d;
  CHECK(cuMemAlloc(&d, 64));
  tf_probe::Fill(fill, d, 40, 16, nullptr);
  unsigned two = 2;
  size_t count = 16;
  void* params[] = {&d, &two, &count};
  CHECK(cuLaunchKernel(add, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr));
  unsigned host[16] = {};
  CHECK(cuMemcpyDtoH(host, d, sizeof(host)));
  std::printf("linked_kernels=%u\n", host[0] + host[15]);
  CHECK(cuMemFree(d));
  CHECK(cuModuleUnload(m));
  CHECK(cuLinkDestroy(link));
  std::printf("destroy_again=%d\n", static_cast<int>(cuLinkDestroy(link)));
  // A link left behind is cleaned up by the session (nothing to see but no crash).
  CUlinkState leftover;
  CHECK(cuLinkCreate(0, nullptr, nullptr, &leftover));
  std::printf("done=1\n");
  return 0;
}

uint64_t Fnv(const unsigned char* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

int Params32k() {
  Setup();
  CUfunction f = Kernel("checksum_params");
  struct Big {
    unsigned char bytes[32000];
  };
  auto* big = new Big;
  for (size_t i = 0; i < sizeof(big->bytes); ++i) big->bytes[i] = static_cast<unsigned char>(i * 7 + (i >> 8));
  const uint64_t expect = Fnv(big->bytes, sizeof(big->bytes));
  CUdeviceptr out;
  CHECK(cuMemAlloc(&out, 16));
  void* params[] = {&out, big};
  CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr));
  uint64_t got = 0;
  CHECK(cuMemcpyDtoH(&got, out, sizeof(got)));
  std::printf("params32k_kernel_params=%d\n", got == expect ? 1 : 0);
  // The same through CU_LAUNCH_PARAM_BUFFER_POINTER: u64 pointer then the struct.
  std::vector<unsigned char> buffer(8 + sizeof(Big));
  memcpy(buffer.data(), &out, 8);
  big->bytes[0] ^= 0xff;
  memcpy(buffer.data() + 8, big->bytes, sizeof(big->bytes));
  size_t size = buffer.size();
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buffer.data(), CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                   CU_LAUNCH_PARAM_END};
  CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, extra));
  CHECK(cuMemcpyDtoH(&got, out, sizeof(got)));
  std::printf("params32k_extra=%d\n", got == Fnv(big->bytes, sizeof(big->bytes)) ? 1 : 0);
  CHECK(cuMemFree(out));
  delete big;
  std::printf("done=1\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const char* mode = argc > 1 ? argv[1] : "";
  if (!strcmp(mode, "console")) return Console(argc > 2 ? atoi(argv[2]) : 10);
  if (!strcmp(mode, "console_exit")) return ConsoleExit(argc > 2 ? atoi(argv[2]) : 10);
  if (!strcmp(mode, "jit")) return Jit();
  if (!strcmp(mode, "link") && argc > 2) return Link(argv[2]);
  if (!strcmp(mode, "params32k")) return Params32k();
  std::fprintf(stderr, "usage: jit_console_probe console|console_exit|jit|link FILE|params32k\n");
  return 2;
}
