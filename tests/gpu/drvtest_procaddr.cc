// The three ways a program finds a driver entry point must land in the same library: the
// direct link, dlsym on the libcuda.so.1 handle, and cuGetProcAddress_v2 (default and per-thread
// default stream). Natively that library is the real libcuda; under the limiter, the limiter.
#include <dlfcn.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "drvtest.h"

namespace tf::gpu {
namespace {

constexpr int kCudaVersion = 13000;

struct Lookup {
  std::string symbol;  // the name as asked for
  std::string via;     // direct, dlsym, gpa_default, gpa_ptds
  void* fn = nullptr;
};

std::string LibraryOf(void* fn) {
  Dl_info info{};
  if (fn == nullptr || dladdr(fn, &info) == 0 || info.dli_fname == nullptr) return "unresolved";
  char* real = realpath(info.dli_fname, nullptr);
  std::string path = real != nullptr ? real : info.dli_fname;
  std::free(real);
  return path;
}

bool SameFile(const std::string& a, const std::string& b) {
  struct stat sa {};
  struct stat sb {};
  return stat(a.c_str(), &sa) == 0 && stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

std::string Basename(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

int RunProcAddr(const Flags& flags) {
  // --expect native: every pointer is in the real driver (a file named libcuda.so*).
  // --expect-lib PATH: every pointer is in PATH (or a file named libtfusion-limiter*).
  const std::string expect = flags.Str("expect", "native");
  const std::string expect_lib = flags.Str("expect-lib", "");
  if (!FlagsOk(flags)) return 2;
  const CUresult init = cuInit(0);
  Result("cuInit", CuErrorName(init));

  std::vector<Lookup> lookups = {
      {"cuMemAlloc", "direct", reinterpret_cast<void*>(&cuMemAlloc)},
      {"cuLaunchKernel", "direct", reinterpret_cast<void*>(&cuLaunchKernel)},
      {"cuLaunchKernelEx", "direct", reinterpret_cast<void*>(&cuLaunchKernelEx)},
      {"cuGraphLaunch", "direct", reinterpret_cast<void*>(&cuGraphLaunch)},
      {"cuMemGetInfo", "direct", reinterpret_cast<void*>(&cuMemGetInfo)},
  };
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) handle = dlopen("libcuda.so.1", RTLD_NOW);
  // The ELF names behind the API names: the _v2 variants and the per-thread-stream ones.
  const char* elf_names[] = {"cuMemAlloc",          "cuMemAlloc_v2",     "cuLaunchKernel",
                             "cuLaunchKernel_ptsz", "cuLaunchKernelEx",  "cuLaunchKernelEx_ptsz",
                             "cuGraphLaunch",       "cuGraphLaunch_ptsz", "cuMemGetInfo",
                             "cuMemGetInfo_v2"};
  for (const char* name : elf_names) {
    lookups.push_back({name, "dlsym", handle != nullptr ? dlsym(handle, name) : nullptr});
  }
  const char* api_names[] = {"cuMemAlloc", "cuLaunchKernel", "cuLaunchKernelEx", "cuGraphLaunch",
                             "cuMemGetInfo"};
  for (const char* name : api_names) {
    for (const auto& [via, mode] :
         {std::pair<const char*, cuuint64_t>{"gpa_default", CU_GET_PROC_ADDRESS_DEFAULT},
          std::pair<const char*, cuuint64_t>{"gpa_ptds", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM}}) {
      void* fn = nullptr;
      CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
      const CUresult rc = cuGetProcAddress(name, &fn, kCudaVersion, mode, &status);
      if (rc != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS) fn = nullptr;
      lookups.push_back({name, via, fn});
    }
  }

  std::string why;
  for (const auto& lookup : lookups) {
    const std::string lib = LibraryOf(lookup.fn);
    char addr[32];
    std::snprintf(addr, sizeof(addr), "%p", lookup.fn);
    bool expected = false;
    if (expect_lib.empty()) {
      expected = Basename(lib).rfind("libcuda.so", 0) == 0;
    } else {
      expected = SameFile(lib, expect_lib) || Basename(lib).rfind("libtfusion-limiter", 0) == 0;
    }
    std::printf("RESULT lookup symbol=%s via=%s addr=%s lib=%s ok=%s\n", lookup.symbol.c_str(),
                lookup.via.c_str(), addr, lib.c_str(), expected ? "yes" : "no");
    if (!expected && why.empty()) why = "wrong_library:" + lookup.symbol + "/" + lookup.via;
  }
  std::fflush(stdout);

  // The same API name and mode must give the same variant as the ELF name a driver of this
  // version exports for it.
  auto find = [&lookups](const std::string& symbol, const std::string& via) -> void* {
    for (const auto& lookup : lookups) {
      if (lookup.symbol == symbol && lookup.via == via) return lookup.fn;
    }
    return nullptr;
  };
  const struct {
    const char* api;
    const char* via;
    const char* elf;
  } identities[] = {
      {"cuMemAlloc", "gpa_default", "cuMemAlloc_v2"},
      {"cuMemGetInfo", "gpa_default", "cuMemGetInfo_v2"},
      {"cuLaunchKernel", "gpa_default", "cuLaunchKernel"},
      {"cuLaunchKernel", "gpa_ptds", "cuLaunchKernel_ptsz"},
      {"cuLaunchKernelEx", "gpa_ptds", "cuLaunchKernelEx_ptsz"},
      {"cuGraphLaunch", "gpa_ptds", "cuGraphLaunch_ptsz"},
  };
  for (const auto& id : identities) {
    const bool same = find(id.api, id.via) != nullptr && find(id.api, id.via) == find(id.elf, "dlsym");
    std::printf("RESULT identity api=%s via=%s elf=%s same=%s\n", id.api, id.via, id.elf, same ? "yes" : "no");
    if (!same && why.empty()) why = std::string("variant_mismatch:") + id.api + "/" + id.via;
  }
  std::fflush(stdout);
  if (expect != "native" && expect_lib.empty()) why = "usage: --expect native or --expect-lib PATH";
  if (!why.empty()) Result("reason", why);
  Result("verdict", why.empty() ? "PASS" : "FAIL");
  return why.empty() ? 0 : 1;
}

}  // namespace tf::gpu
