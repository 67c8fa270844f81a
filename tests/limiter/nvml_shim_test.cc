// libtfusion-nvml.so (the NVML shim) against the fake NVML of tests/fakecuda.
//
// The shim reads its configuration (TFUSION_REGION, TFUSION_VGPU, TFUSION_REAL_LIBNVML) once, in
// its load-time constructor, so every load happens in a forked child after setenv; the test
// process itself never loads the shim. Children report through a pipe.
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "limiter/core/gpu_region.h"
#include "tests/fakecuda/nvml_types.h"
#include "tests/limiter/region_test_util.h"

#if defined(TF_NVML_SHIM_PATH) && defined(TF_FAKENVML_PATH) && defined(TF_NVML_EXPORTS_PATH)

namespace tf::limiter::testing {
namespace {

constexpr int kFakeDevices = 2;
constexpr int kNvmlErrorLibraryNotFound = 12;
constexpr int kNvmlErrorFunctionNotFound = 13;

// What a child saw through one NVML library, for one device index.
struct Probe {
  int open_ok = 0;
  int init_rc = -1;
  int handle_rc = -1;
  int uuid_rc = -1;
  int name_rc = -1;
  int mem_rc = -1;
  int mem2_rc = -1;
  int shutdown_rc = -1;
  nvmlMemory_t mem{};
  nvmlMemory_v2_t mem2{};
  char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
  char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = {};
  char error_string[64] = {};
};

template <typename T>
bool Sym(void* h, const char* name, T* out) {
  *out = reinterpret_cast<T>(dlsym(h, name));
  return *out != nullptr;
}

// Loads `library` and asks it about device `index` (runs in a child).
Probe ProbeNvml(const char* library, unsigned index) {
  Probe p;
  void* h = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) return p;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*by_index)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*get_uuid)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*get_name)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*mem)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*mem2)(nvmlDevice_t, nvmlMemory_v2_t*) = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  if (!Sym(h, "nvmlInit_v2", &init) || !Sym(h, "nvmlShutdown", &shutdown) ||
      !Sym(h, "nvmlDeviceGetHandleByIndex_v2", &by_index) ||
      !Sym(h, "nvmlDeviceGetUUID", &get_uuid) || !Sym(h, "nvmlDeviceGetName", &get_name) ||
      !Sym(h, "nvmlDeviceGetMemoryInfo", &mem) || !Sym(h, "nvmlDeviceGetMemoryInfo_v2", &mem2) ||
      !Sym(h, "nvmlErrorString", &error_string)) {
    return p;
  }
  p.open_ok = 1;
  p.init_rc = init();
  snprintf(p.error_string, sizeof(p.error_string), "%s", error_string(p.init_rc));
  if (p.init_rc != NVML_SUCCESS) return p;
  nvmlDevice_t device = nullptr;
  p.handle_rc = by_index(index, &device);
  p.uuid_rc = get_uuid(device, p.uuid, sizeof(p.uuid));
  p.name_rc = get_name(device, p.name, sizeof(p.name));
  p.mem_rc = mem(device, &p.mem);
  p.mem2.version = nvmlMemory_v2;
  p.mem2_rc = mem2(device, &p.mem2);
  p.shutdown_rc = shutdown();
  return p;
}

struct Env {
  const char* region = nullptr;
  const char* vgpu = nullptr;
  const char* real = TF_FAKENVML_PATH;
};

// In a child: set the shim's environment, then load `library` and probe device `index`.
// With stderr_path, the child's stderr goes to that file.
Probe ProbeInChild(const char* library, unsigned index, const Env& env,
                   const char* stderr_path = nullptr) {
  int fd = -1;
  pid_t pid = ForkChild(
      [&](int out) {
        if (stderr_path != nullptr) {
          int err = open(stderr_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
          if (err < 0 || dup2(err, 2) < 0) return 3;
          close(err);
        }
        auto set = [](const char* name, const char* value) {
          if (value != nullptr) {
            setenv(name, value, 1);
          } else {
            unsetenv(name);
          }
        };
        set("TFUSION_REGION", env.region);
        set("TFUSION_VGPU", env.vgpu);
        set("TFUSION_REAL_LIBNVML", env.real);
        WriteAll(out, ProbeNvml(library, index));
        return 0;
      },
      &fd);
  Probe p;
  EXPECT_TRUE(ReadAll(fd, &p)) << "child died before reporting";
  close(fd);
  EXPECT_EQ(WaitExit(pid), 0);
  return p;
}

std::vector<std::string> ListedExports() {
  std::vector<std::string> names;
  std::ifstream in(TF_NVML_EXPORTS_PATH);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) names.push_back(line);
  }
  return names;
}

class NvmlShimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The fake NVML reads these at nvmlInit; the shm name keeps parallel tests apart.
    shm_ = "tf-nvml-shim-test-" + std::to_string(getpid());
    setenv("FAKECUDA_SHM_NAME", shm_.c_str(), 1);
    setenv("FAKECUDA_DEVICES", std::to_string(kFakeDevices).c_str(), 1);
    unsetenv("FAKECUDA_TOTAL_MIB");

    char tmpl[] = "/tmp/tf-nvml-shim-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;

    // What the fake itself says, device by device.
    for (int i = 0; i < kFakeDevices; ++i) {
      fake_[i] = ProbeInChild(TF_FAKENVML_PATH, static_cast<unsigned>(i), Env{});
      ASSERT_EQ(fake_[i].open_ok, 1);
      ASSERT_EQ(fake_[i].mem_rc, NVML_SUCCESS);
      ASSERT_EQ(fake_[i].uuid_rc, NVML_SUCCESS);
    }
    ASSERT_STRNE(fake_[0].uuid, fake_[1].uuid);
    ASSERT_EQ(fake_[0].mem.used, 0u);  // nothing allocated on the fake

    // The node agent's side: a region for fake device 0, a 2 GiB vGPU, 512 MiB in use.
    std::string dir = root_ + "/tensorfusion";
    ASSERT_EQ(GpuRegion::Create(dir.c_str(), fake_[0].uuid, fake_[0].name, fake_[0].mem.total,
                                989'000'000, &region_),
              RegionError::kOk);
    region_path_ = region_.path();
    ASSERT_EQ(region_.CreateOrUpdateVgpu("tenant-a", 2 * kGiB, 500'000, &vgpu_), RegionError::kOk);
    ASSERT_EQ(region_.AttachProcess(vgpu_, getpid(), &slot_), RegionError::kOk);
    ASSERT_EQ(region_.Reserve(slot_, 512 * kMiB), RegionError::kOk);
  }

  void TearDown() override {
    region_.Detach();
    for (int i = 0; i < kFakeDevices; ++i) {
      shm_unlink(("/" + shm_ + "-dev" + std::to_string(i)).c_str());
    }
    std::string cmd = "rm -rf '" + root_ + "'";
    ASSERT_EQ(system(cmd.c_str()), 0);
  }

  Env Bound() const { return Env{region_path_.c_str(), "tenant-a", TF_FAKENVML_PATH}; }

  static std::string ReadFile(const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  std::string shm_;
  std::string root_;
  std::string region_path_;
  GpuRegion region_;
  uint32_t vgpu_ = 0;
  uint32_t slot_ = 0;
  Probe fake_[kFakeDevices];
};

TEST_F(NvmlShimTest, BoundProcessSeesItsSliceThroughBothMemoryQueries) {
  Probe p = ProbeInChild(TF_NVML_SHIM_PATH, 0, Bound());
  ASSERT_EQ(p.open_ok, 1);
  ASSERT_EQ(p.init_rc, NVML_SUCCESS);
  ASSERT_EQ(p.handle_rc, NVML_SUCCESS);
  ASSERT_EQ(p.mem_rc, NVML_SUCCESS);
  EXPECT_EQ(p.mem.total, 2 * kGiB);
  EXPECT_EQ(p.mem.used, 512 * kMiB);
  EXPECT_EQ(p.mem.free, 1536 * kMiB);

  ASSERT_EQ(p.mem2_rc, NVML_SUCCESS);
  EXPECT_EQ(p.mem2.version, nvmlMemory_v2);
  EXPECT_EQ(p.mem2.total, 2 * kGiB);
  EXPECT_EQ(p.mem2.reserved, 0u);
  EXPECT_EQ(p.mem2.used, 512 * kMiB);
  EXPECT_EQ(p.mem2.free, 1536 * kMiB);

  // Forwarded untouched.
  EXPECT_EQ(p.name_rc, NVML_SUCCESS);
  EXPECT_STREQ(p.name, fake_[0].name);
  EXPECT_STREQ(p.name, "Fake GPU H100");
  EXPECT_STREQ(p.uuid, fake_[0].uuid);
  EXPECT_EQ(p.shutdown_rc, NVML_SUCCESS);
}

TEST_F(NvmlShimTest, BoundProcessSeesOtherGpusWhole) {
  Probe p = ProbeInChild(TF_NVML_SHIM_PATH, 1, Bound());
  ASSERT_EQ(p.mem_rc, NVML_SUCCESS);
  EXPECT_EQ(p.mem.total, fake_[1].mem.total);
  EXPECT_EQ(p.mem.free, fake_[1].mem.free);
  EXPECT_EQ(p.mem.used, fake_[1].mem.used);
  ASSERT_EQ(p.mem2_rc, NVML_SUCCESS);
  EXPECT_EQ(p.mem2.total, fake_[1].mem2.total);
  EXPECT_EQ(p.mem2.free, fake_[1].mem2.free);
  EXPECT_EQ(p.mem2.used, fake_[1].mem2.used);
}

TEST_F(NvmlShimTest, UnboundProcessSeesTheRealNumbers) {
  Probe p = ProbeInChild(TF_NVML_SHIM_PATH, 0, Env{});
  ASSERT_EQ(p.init_rc, NVML_SUCCESS);
  ASSERT_EQ(p.mem_rc, NVML_SUCCESS);
  EXPECT_EQ(p.mem.total, fake_[0].mem.total);
  EXPECT_EQ(p.mem.free, fake_[0].mem.free);
  EXPECT_EQ(p.mem.used, fake_[0].mem.used);
  ASSERT_EQ(p.mem2_rc, NVML_SUCCESS);
  EXPECT_EQ(p.mem2.total, fake_[0].mem2.total);
  EXPECT_EQ(p.mem2.reserved, fake_[0].mem2.reserved);
  EXPECT_EQ(p.mem2.free, fake_[0].mem2.free);
  EXPECT_EQ(p.mem2.used, fake_[0].mem2.used);
  EXPECT_STREQ(p.name, fake_[0].name);
}

TEST_F(NvmlShimTest, FreeIsBoundedByTheRealFreeMemory) {
  // An oversubscribed vGPU (limit above the GPU's 16 GiB): free is what the GPU really has.
  ASSERT_EQ(region_.CreateOrUpdateVgpu("tenant-a", 64 * kGiB, 500'000, nullptr), RegionError::kOk);
  Probe p = ProbeInChild(TF_NVML_SHIM_PATH, 0, Bound());
  ASSERT_EQ(p.mem_rc, NVML_SUCCESS);
  EXPECT_EQ(p.mem.total, 64 * kGiB);
  EXPECT_EQ(p.mem.free, fake_[0].mem.free);
  EXPECT_EQ(p.mem.used, 64 * kGiB - fake_[0].mem.free);
  EXPECT_EQ(p.mem2.free, fake_[0].mem.free);
}

TEST_F(NvmlShimTest, VgpuOverItsLimitReportsNothingFree) {
  // A limit lowered below current use: nothing free, all of the (new) total in use.
  ASSERT_EQ(region_.CreateOrUpdateVgpu("tenant-a", 256 * kMiB, 500'000, nullptr), RegionError::kOk);
  Probe p = ProbeInChild(TF_NVML_SHIM_PATH, 0, Bound());
  ASSERT_EQ(p.mem_rc, NVML_SUCCESS);
  EXPECT_EQ(p.mem.total, 256 * kMiB);
  EXPECT_EQ(p.mem.free, 0u);
  EXPECT_EQ(p.mem.used, 256 * kMiB);
}

TEST_F(NvmlShimTest, UnattachableRegionPassesThroughAndLogsOnce) {
  std::string log = root_ + "/stderr.txt";
  std::string missing = root_ + "/no-such.region";
  Probe p = ProbeInChild(TF_NVML_SHIM_PATH, 0,
                         Env{missing.c_str(), "tenant-a", TF_FAKENVML_PATH}, log.c_str());
  ASSERT_EQ(p.init_rc, NVML_SUCCESS);
  ASSERT_EQ(p.mem_rc, NVML_SUCCESS);
  EXPECT_EQ(p.mem.total, fake_[0].mem.total);
  EXPECT_EQ(p.mem.free, fake_[0].mem.free);
  EXPECT_EQ(p.mem2.total, fake_[0].mem2.total);
  std::string text = ReadFile(log);
  size_t first = text.find("tfusion-nvml: ");
  ASSERT_NE(first, std::string::npos) << text;
  EXPECT_EQ(text.find("tfusion-nvml: ", first + 1), std::string::npos) << text;
  EXPECT_NE(text.find(missing), std::string::npos) << text;

  // An unknown vGPU id in a good region: same.
  Probe q = ProbeInChild(TF_NVML_SHIM_PATH, 0,
                         Env{region_path_.c_str(), "no-such-vgpu", TF_FAKENVML_PATH}, log.c_str());
  ASSERT_EQ(q.mem_rc, NVML_SUCCESS);
  EXPECT_EQ(q.mem.total, fake_[0].mem.total);
  EXPECT_NE(ReadFile(log).find("no-such-vgpu"), std::string::npos);
}

TEST_F(NvmlShimTest, NeverLoadsItselfAsTheRealLibrary) {
  std::string log = root_ + "/stderr.txt";
  Probe p = ProbeInChild(TF_NVML_SHIM_PATH, 0, Env{nullptr, nullptr, TF_NVML_SHIM_PATH},
                         log.c_str());
  ASSERT_EQ(p.open_ok, 1);
  EXPECT_EQ(p.init_rc, kNvmlErrorLibraryNotFound);
  EXPECT_STRNE(p.error_string, "");
  EXPECT_NE(ReadFile(log).find("shim itself"), std::string::npos) << ReadFile(log);
}

// Every name of api/nvml-exports.txt is an ELF symbol of the shim (dlsym on its handle never
// misses), and a forwarded name the real library lacks answers NVML_ERROR_FUNCTION_NOT_FOUND.
TEST_F(NvmlShimTest, EveryListedNameIsExportedByTheShim) {
  std::vector<std::string> names = ListedExports();
  ASSERT_GT(names.size(), 400u);
  for (const char* must : {"nvmlInit", "nvmlInit_v2", "nvmlDeviceGetCount", "nvmlDeviceGetCount_v2",
                           "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByIndex_v2",
                           "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2",
                           "nvmlDeviceGetPciInfo_v3", "nvmlErrorString", "nvmlDeviceGetPowerUsage",
                           "nvmlInternalGetExportTable"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), must), names.end()) << must;
  }

  struct Report {
    int opened = 0;
    int missing = 0;
    int elsewhere = 0;
    int power_rc = -1;
    char first_bad[128] = {};
  };
  int fd = -1;
  pid_t pid = ForkChild(
      [&](int out) {
        setenv("TFUSION_REAL_LIBNVML", TF_FAKENVML_PATH, 1);
        Report r;
        void* h = dlopen(TF_NVML_SHIM_PATH, RTLD_NOW | RTLD_LOCAL);
        if (h != nullptr) {
          r.opened = 1;
          Dl_info self{};
          dladdr(dlsym(h, "tfusion_nvml_shim_version"), &self);
          for (const std::string& name : names) {
            void* fn = dlsym(h, name.c_str());
            Dl_info info{};
            if (fn == nullptr) {
              ++r.missing;
            } else if (dladdr(fn, &info) == 0 || info.dli_fbase != self.dli_fbase) {
              ++r.elsewhere;
            } else {
              continue;
            }
            if (r.first_bad[0] == '\0') snprintf(r.first_bad, sizeof(r.first_bad), "%s", name.c_str());
          }
          auto init = reinterpret_cast<nvmlReturn_t (*)()>(dlsym(h, "nvmlInit_v2"));
          auto by_index = reinterpret_cast<nvmlReturn_t (*)(unsigned, nvmlDevice_t*)>(
              dlsym(h, "nvmlDeviceGetHandleByIndex_v2"));
          auto power = reinterpret_cast<nvmlReturn_t (*)(nvmlDevice_t, unsigned*)>(
              dlsym(h, "nvmlDeviceGetPowerUsage"));
          nvmlDevice_t device = nullptr;
          unsigned milliwatts = 0;
          if (init && by_index && power && init() == NVML_SUCCESS &&
              by_index(0, &device) == NVML_SUCCESS) {
            r.power_rc = power(device, &milliwatts);
          }
        }
        WriteAll(out, r);
        return 0;
      },
      &fd);
  Report r;
  ASSERT_TRUE(ReadAll(fd, &r));
  close(fd);
  EXPECT_EQ(WaitExit(pid), 0);
  ASSERT_EQ(r.opened, 1);
  EXPECT_EQ(r.missing, 0) << "first: " << r.first_bad;
  EXPECT_EQ(r.elsewhere, 0) << "first: " << r.first_bad;
  EXPECT_EQ(r.power_rc, kNvmlErrorFunctionNotFound);  // the fake has no power readings
}

}  // namespace
}  // namespace tf::limiter::testing

#else

TEST(NvmlShimTest, NotBuilt) { GTEST_SKIP() << "tfusion-nvml or fakenvml is not part of this build"; }

#endif
