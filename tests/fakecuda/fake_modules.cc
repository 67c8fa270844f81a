// Fake driver modules, libraries and kernel launches. Kernels are host functions registered with
// fakecuda_register_kernel(_ex); a module image is the NUL-terminated text "fakecuda:<module>".
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "fake_device_identity.h"
#include "fake_driver.h"

namespace fakecuda {
namespace {

constexpr const char kImagePrefix[] = "fakecuda:";

// Registered kernels. Thread-safe (own mutex; usable before cuInit). A kernel object is never
// freed: handles given out stay valid even when a name is registered again.
class KernelRegistry {
 public:
  static KernelRegistry& Get() {
    static KernelRegistry* registry = new KernelRegistry;  // leaked: handles outlive everything
    return *registry;
  }

  void Register(std::shared_ptr<Kernel> kernel) {
    std::lock_guard<std::mutex> lock(mu_);
    all_[kernel.get()] = kernel;
    by_name_[kernel->module + '\n' + kernel->name] = std::move(kernel);
  }
  // A linked module ("a+b", cuLinkComplete) finds the kernels of each of its parts.
  std::shared_ptr<Kernel> Find(const std::string& module, const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::string& part : Parts(module)) {
      auto it = by_name_.find(part + '\n' + name);
      if (it != by_name_.end()) return it->second;
    }
    return nullptr;
  }
  std::shared_ptr<Kernel> FromHandle(const void* handle) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = all_.find(static_cast<const Kernel*>(handle));
    return it == all_.end() ? nullptr : it->second;
  }
  // The kernels of a module, by name order.
  std::vector<std::shared_ptr<Kernel>> InModule(const std::string& module) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::shared_ptr<Kernel>> out;
    const std::vector<std::string> parts = Parts(module);
    for (auto& [key, k] : by_name_) {
      if (std::find(parts.begin(), parts.end(), k->module) != parts.end()) out.push_back(k);
    }
    return out;
  }
  static std::vector<std::string> Parts(const std::string& module) {
    std::vector<std::string> parts;
    size_t start = 0;
    for (size_t plus; (plus = module.find('+', start)) != std::string::npos; start = plus + 1) {
      parts.push_back(module.substr(start, plus - start));
    }
    parts.push_back(module.substr(start));
    return parts;
  }
  // Attributes set with cuFuncSetAttribute, by kernel.
  void SetAttribute(const Kernel* kernel, int attribute, int value) {
    std::lock_guard<std::mutex> lock(mu_);
    attributes_[{kernel, attribute}] = value;
  }
  bool GetAttribute(const Kernel* kernel, int attribute, int* value) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = attributes_.find({kernel, attribute});
    if (it == attributes_.end()) return false;
    *value = it->second;
    return true;
  }

 private:
  KernelRegistry() { RegisterBuiltins(); }
  void RegisterBuiltins();

  std::mutex mu_;
  std::map<const Kernel*, std::shared_ptr<Kernel>> all_;
  std::map<std::string, std::shared_ptr<Kernel>> by_name_;
  std::map<std::pair<const Kernel*, int>, int> attributes_;
};

std::shared_ptr<Kernel> MakeKernel(const char* module, const char* name, FakecudaKernelFn fn,
                                   void* user, bool layout_known, size_t count,
                                   const size_t* sizes) {
  auto kernel = std::make_shared<Kernel>();
  kernel->module = module;
  kernel->name = name;
  kernel->fn = fn;
  kernel->user = user;
  kernel->layout_known = layout_known;
  size_t offset = 0;
  for (size_t i = 0; i < count; ++i) {
    size_t align = 1;
    while (align < sizes[i] && align < 8) align *= 2;
    offset = RoundUp(offset, align);
    kernel->offsets.push_back(offset);
    kernel->sizes.push_back(sizes[i]);
    offset += sizes[i];
  }
  kernel->buffer_bytes = offset;
  return kernel;
}

void SleepMicroseconds(void** params, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       void*) {
  unsigned us = *static_cast<unsigned*>(params[0]);
  std::this_thread::sleep_for(std::chrono::microseconds(us));
}

void FillU32(void** params, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*) {
  CUdeviceptr dst = *static_cast<CUdeviceptr*>(params[0]);
  unsigned value = *static_cast<unsigned*>(params[1]);
  size_t count = *static_cast<size_t*>(params[2]);
  auto* p = reinterpret_cast<unsigned*>(dst);
  for (size_t i = 0; i < count; ++i) p[i] = value;
}

void SetConditionalKernel(void** params, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                          void*) {
  fakecuda::SetConditional(*static_cast<uint64_t*>(params[0]), *static_cast<unsigned*>(params[1]));
}

void NotifyOverBudgetKernel(void** params, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            void*) {
  fakecuda::NotifyOverBudget(*static_cast<unsigned long long*>(params[0]));
}

void KernelRegistry::RegisterBuiltins() {
  const size_t conditional_sizes[] = {sizeof(uint64_t), sizeof(unsigned)};
  const size_t sleep_sizes[] = {sizeof(unsigned)};
  const size_t fill_sizes[] = {sizeof(CUdeviceptr), sizeof(unsigned), sizeof(size_t)};
  const size_t printf_sizes[] = {sizeof(unsigned), sizeof(unsigned)};
  const size_t checksum_sizes[] = {sizeof(CUdeviceptr), kChecksumParamBytes};
  const size_t notify_sizes[] = {sizeof(unsigned long long)};
  for (auto kernel : {MakeKernel("builtin", "sleep_us", SleepMicroseconds, nullptr, true, 1,
                                 sleep_sizes),
                      MakeKernel("builtin", "fill_u32", FillU32, nullptr, true, 3, fill_sizes),
                      MakeKernel("builtin", "printf_lines", PrintfLines, nullptr, true, 2,
                                 printf_sizes),
                      MakeKernel("builtin", "checksum_params", ChecksumParams, nullptr, true, 2,
                                 checksum_sizes),
                      MakeKernel("builtin", "set_conditional", SetConditionalKernel, nullptr, true, 2,
                                 conditional_sizes),
                      MakeKernel("builtin", "notify_over_budget", NotifyOverBudgetKernel, nullptr, true, 1,
                                 notify_sizes),
                      MakeKernel("linkpart", "add_u32", AddU32, nullptr, true, 3, fill_sizes)}) {
    all_[kernel.get()] = kernel;
    by_name_[kernel->module + '\n' + kernel->name] = kernel;
  }
}

// The module name in an image "fakecuda:<name>", or an empty string for any other image.
std::string ModuleNameFromImage(const void* image) {
  if (image == nullptr) return "";
  const char* text = static_cast<const char*>(image);
  if (std::strncmp(text, kImagePrefix, sizeof(kImagePrefix) - 1) != 0) return "";
  return text + sizeof(kImagePrefix) - 1;
}

CUresult LoadModule(Module** out, const void* image) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::string name = ModuleNameFromImage(image);
  if (name.empty()) return CUDA_ERROR_INVALID_IMAGE;
  auto module = std::make_unique<Module>();
  module->name = name;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  *out = module.get();
  d.modules[module.get()] = std::move(module);
  return CUDA_SUCCESS;
}

CUresult UnloadModule(Module* module) {
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  return d.modules.erase(module) != 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult ModuleKernel(Module* module, const char* name, std::shared_ptr<Kernel>* out) {
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::string module_name;
  {
    Driver& d = Driver::Get();
    std::lock_guard<std::mutex> lock(d.mu);
    if (d.modules.count(module) == 0) return CUDA_ERROR_INVALID_HANDLE;
    module_name = module->name;
  }
  *out = KernelRegistry::Get().Find(module_name, name);
  return *out == nullptr ? CUDA_ERROR_NOT_FOUND : CUDA_SUCCESS;
}

// The limits the real driver checks when an attribute is set: dynamic shared memory plus the
// kernel's static shared memory (none here) within the device's opt-in maximum; a carveout of -1
// to 100 percent.
bool SettableValue(CUfunction_attribute attribute, int value) {
  switch (attribute) {
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
      return value >= 0 && value <= 232448;  // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
      return value >= -1 && value <= 100;
    default:
      return true;
  }
}

int FunctionAttribute(const Kernel* kernel, CUfunction_attribute attribute) {
  int value = 0;
  if (KernelRegistry::Get().GetAttribute(kernel, attribute, &value)) return value;
  switch (attribute) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: return 32;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION: return 90;
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: return 90;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: return 49152;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: return -1;
    default: return 0;
  }
}

CUresult Launch(CUfunction f, const unsigned grid[3], const unsigned block[3], CUstream handle,
                void** kernel_params, void** extra) {
  auto launch = std::make_shared<LaunchArgs>();
  if (CUresult r = BuildLaunch(f, grid, block, kernel_params, extra, launch.get());
      r != CUDA_SUCCESS) {
    return r;
  }
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<Stream> stream = ResolveStream(handle, &err);
  if (stream == nullptr) return err;
  {
    // Stream capture: the launch becomes a kernel node of the capture graph.
    Driver& d = Driver::Get();
    std::lock_guard<std::mutex> lock(d.mu);
    if (stream->capture != nullptr) {
      auto node = std::make_unique<GraphNode>();
      node->kind = GraphNodeKind::kKernel;
      node->launch = launch;
      node->func = f;
      node->deps = stream->capture_deps;
      stream->capture_deps = {node.get()};
      stream->capture->nodes.push_back(std::move(node));
      return CUDA_SUCCESS;
    }
  }
  stream->worker.Enqueue([launch] { launch->Run(); });
  return CUDA_SUCCESS;
}

// The kernels of a live module (library), or INVALID_HANDLE.
CUresult ModuleKernels(Module* module, std::vector<std::shared_ptr<Kernel>>* out) {
  std::string module_name;
  {
    Driver& d = Driver::Get();
    std::lock_guard<std::mutex> lock(d.mu);
    if (d.modules.count(module) == 0) return CUDA_ERROR_INVALID_HANDLE;
    module_name = module->name;
  }
  *out = KernelRegistry::Get().InModule(module_name);
  return CUDA_SUCCESS;
}

}  // namespace

std::shared_ptr<Kernel> FindKernel(const void* handle) {
  return KernelRegistry::Get().FromHandle(handle);
}

void LaunchArgs::Run() const {
  void** p = kernel->layout_known ? const_cast<void**>(params.data()) : raw_params;
  kernel->fn(p, grid[0], grid[1], grid[2], block[0], block[1], block[2], kernel->user);
}

CUresult BuildLaunch(CUfunction f, const unsigned grid[3], const unsigned block[3],
                     void** kernel_params, void** extra, LaunchArgs* out) {
  out->kernel = FindKernel(f);
  if (out->kernel == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  uint64_t threads = 1;
  for (int i = 0; i < 3; ++i) {
    if (grid[i] == 0 || block[i] == 0) return CUDA_ERROR_INVALID_VALUE;
    out->grid[i] = grid[i];
    out->block[i] = block[i];
    threads *= block[i];
  }
  if (threads > 1024 || block[2] > 64) return CUDA_ERROR_INVALID_VALUE;
  const Kernel& k = *out->kernel;
  if (!k.layout_known) {
    if (kernel_params == nullptr && extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
    out->raw_params = kernel_params;
    return CUDA_SUCCESS;
  }
  out->buffer.assign(k.buffer_bytes, 0);
  if (kernel_params != nullptr) {
    for (size_t i = 0; i < k.sizes.size(); ++i) {
      std::memcpy(out->buffer.data() + k.offsets[i], kernel_params[i], k.sizes[i]);
    }
  } else if (extra != nullptr) {
    const void* buffer = nullptr;
    size_t size = 0;
    for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
      if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) buffer = extra[i + 1];
      if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) size = *static_cast<size_t*>(extra[i + 1]);
    }
    if (buffer == nullptr || size < k.buffer_bytes) return CUDA_ERROR_INVALID_VALUE;
    std::memcpy(out->buffer.data(), buffer, k.buffer_bytes);
  } else if (!k.sizes.empty()) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (size_t offset : k.offsets) out->params.push_back(out->buffer.data() + offset);
  return CUDA_SUCCESS;
}

}  // namespace fakecuda

using fakecuda::Driver;
using fakecuda::Kernel;
using fakecuda::Module;

FAKECUDA_EXPORT int fakecuda_register_kernel(const char* module_name, const char* kernel_name,
                                             FakecudaKernelFn fn, void* user) {
  if (module_name == nullptr || kernel_name == nullptr || fn == nullptr) return -1;
  fakecuda::KernelRegistry::Get().Register(
      fakecuda::MakeKernel(module_name, kernel_name, fn, user, false, 0, nullptr));
  return 0;
}

FAKECUDA_EXPORT int fakecuda_register_kernel_ex(const char* module_name, const char* kernel_name,
                                                FakecudaKernelFn fn, void* user,
                                                size_t num_params, const size_t* param_sizes) {
  if (module_name == nullptr || kernel_name == nullptr || fn == nullptr) return -1;
  if (num_params > 0 && param_sizes == nullptr) return -1;
  fakecuda::KernelRegistry::Get().Register(
      fakecuda::MakeKernel(module_name, kernel_name, fn, user, true, num_params, param_sizes));
  return 0;
}

// ---- Modules ----

// A module from a file: the file's bytes, as cuModuleLoadData would take them.
CUresult cuModuleLoad(CUmodule* module, const char* fname) {
  if (module == nullptr || fname == nullptr) return CUDA_ERROR_INVALID_VALUE;
  FILE* f = fopen(fname, "rb");
  if (f == nullptr) return CUDA_ERROR_FILE_NOT_FOUND;
  std::string image;
  char chunk[4096];
  size_t n;
  while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) image.append(chunk, n);
  fclose(f);
  return cuModuleLoadData(module, image.c_str());
}

// Loading and unloading code wait for the current context's queued work, host functions
// included, as they do on the real driver (a remote session must not be inside them while a host
// function waits for the client).
static void WaitForQueuedWork() {
  CUresult no_ctx = CUDA_SUCCESS;
  if (fakecuda::Context* ctx = fakecuda::CurrentContext(&no_ctx)) {
    fakecuda::SynchronizeContextStreams(ctx, /*blocking_only=*/false);
  }
}

CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  FAKECUDA_ENTER();
  WaitForQueuedWork();  // the real driver's load waits for a running host function
  return fakecuda::LoadModule(reinterpret_cast<Module**>(module), image);
}

CUresult cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int num_options,
                            CUjit_option* options, void** option_values) {
  FAKECUDA_ENTER();
  CUresult r = fakecuda::LoadModule(reinterpret_cast<Module**>(module), image);
  fakecuda::JitLoadLog(num_options, options, option_values, image, r == CUDA_SUCCESS);
  return r;
}

CUresult cuModuleLoadFatBinary(CUmodule* module, const void* fat_cubin) {
  FAKECUDA_ENTER();
  return fakecuda::LoadModule(reinterpret_cast<Module**>(module), fat_cubin);
}

CUresult cuModuleUnload(CUmodule module) {
  FAKECUDA_ENTER();
  WaitForQueuedWork();
  return fakecuda::UnloadModule(reinterpret_cast<Module*>(module));
}

CUresult cuModuleGetFunction(CUfunction* function, CUmodule module, const char* name) {
  FAKECUDA_ENTER();
  if (function == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Kernel> kernel;
  CUresult r = fakecuda::ModuleKernel(reinterpret_cast<Module*>(module), name, &kernel);
  if (r == CUDA_SUCCESS) *function = reinterpret_cast<CUfunction>(kernel.get());
  return r;
}

// Globals: every module has one __device__ variable, "fake_global" (256 bytes, zeroed), backed by
// an ordinary fake allocation made on first use; any other name is CUDA_ERROR_NOT_FOUND.
namespace {
CUresult FakeGlobal(CUdeviceptr* dptr, size_t* bytes, Module* module, const char* name) {
  static std::mutex mu;
  static std::map<Module*, CUdeviceptr> globals;
  {
    Driver& d = Driver::Get();
    std::lock_guard<std::mutex> lock(d.mu);
    if (d.modules.count(module) == 0) return CUDA_ERROR_INVALID_HANDLE;
  }
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (strcmp(name, "fake_global") != 0) return CUDA_ERROR_NOT_FOUND;
  std::lock_guard<std::mutex> lock(mu);
  auto it = globals.find(module);
  if (it == globals.end()) {
    CUdeviceptr p = 0;
    CUresult r = cuMemAlloc_v2(&p, 256);
    if (r != CUDA_SUCCESS) return r;
    memset(reinterpret_cast<void*>(p), 0, 256);
    it = globals.emplace(module, p).first;
  }
  if (dptr) *dptr = it->second;
  if (bytes) *bytes = 256;
  return CUDA_SUCCESS;
}
}  // namespace

CUresult cuModuleGetGlobal_v2(CUdeviceptr* dptr, size_t* bytes, CUmodule module, const char* name) {
  FAKECUDA_ENTER();
  return FakeGlobal(dptr, bytes, reinterpret_cast<Module*>(module), name);
}

CUresult cuLibraryGetGlobal(CUdeviceptr* dptr, size_t* bytes, CUlibrary library, const char* name) {
  FAKECUDA_ENTER();
  return FakeGlobal(dptr, bytes, reinterpret_cast<Module*>(library), name);
}

// ---- Libraries (context-independent modules; the handle is a Module as well) ----

CUresult cuLibraryLoadData(CUlibrary* library, const void* code, CUjit_option* jit_options,
                           void** jit_values, unsigned int num_jit, CUlibraryOption* lib_options,
                           void** lib_values, unsigned int num_lib) {
  FAKECUDA_ENTER();
  (void)jit_options;
  (void)jit_values;
  (void)num_jit;
  (void)lib_options;
  (void)lib_values;
  (void)num_lib;
  CUresult r = fakecuda::LoadModule(reinterpret_cast<Module**>(library), code);
  if (r == CUDA_SUCCESS) {
    Driver& d = Driver::Get();
    std::lock_guard<std::mutex> lock(d.mu);
    reinterpret_cast<Module*>(*library)->library = true;
  }
  return r;
}

CUresult cuLibraryUnload(CUlibrary library) {
  FAKECUDA_ENTER();
  return fakecuda::UnloadModule(reinterpret_cast<Module*>(library));
}

CUresult cuLibraryGetModule(CUmodule* module, CUlibrary library) {
  FAKECUDA_ENTER();
  if (module == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.modules.count(reinterpret_cast<Module*>(library)) == 0) return CUDA_ERROR_INVALID_HANDLE;
  *module = reinterpret_cast<CUmodule>(library);
  return CUDA_SUCCESS;
}

CUresult cuLibraryGetKernel(CUkernel* kernel_out, CUlibrary library, const char* name) {
  FAKECUDA_ENTER();
  if (kernel_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Kernel> kernel;
  CUresult r = fakecuda::ModuleKernel(reinterpret_cast<Module*>(library), name, &kernel);
  if (r == CUDA_SUCCESS) *kernel_out = reinterpret_cast<CUkernel>(kernel.get());
  return r;
}

// A CUkernel and its CUfunction are the same registered kernel here.
CUresult cuKernelGetFunction(CUfunction* function, CUkernel kernel) {
  FAKECUDA_ENTER();
  if (function == nullptr) return CUDA_ERROR_INVALID_VALUE;
  FAKECUDA_REQUIRE_CONTEXT(ctx);
  (void)ctx;
  if (fakecuda::FindKernel(kernel) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *function = reinterpret_cast<CUfunction>(kernel);
  return CUDA_SUCCESS;
}

CUresult cuKernelGetAttribute(int* value, CUfunction_attribute attribute, CUkernel kernel,
                              CUdevice dev) {
  FAKECUDA_ENTER();
  (void)dev;
  if (value == nullptr || attribute < 0 || attribute >= CU_FUNC_ATTRIBUTE_MAX) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::shared_ptr<Kernel> k = fakecuda::FindKernel(kernel);
  if (k == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *value = fakecuda::FunctionAttribute(k.get(), attribute);
  return CUDA_SUCCESS;
}

CUresult cuKernelSetAttribute(CUfunction_attribute attribute, int value, CUkernel kernel,
                              CUdevice dev) {
  FAKECUDA_ENTER();
  (void)dev;
  if (attribute < 0 || attribute >= CU_FUNC_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Kernel> k = fakecuda::FindKernel(kernel);
  if (k == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (!fakecuda::SettableValue(attribute, value)) return CUDA_ERROR_INVALID_VALUE;
  fakecuda::KernelRegistry::Get().SetAttribute(k.get(), attribute, value);
  return CUDA_SUCCESS;
}

CUresult cuKernelGetName(const char** name, CUkernel kernel) {
  FAKECUDA_ENTER();
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Kernel> k = fakecuda::FindKernel(kernel);
  if (k == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *name = k->name.c_str();  // the kernel object is never freed
  return CUDA_SUCCESS;
}

CUresult cuKernelGetParamInfo(CUkernel kernel, size_t index, size_t* offset, size_t* size) {
  FAKECUDA_ENTER();
  std::shared_ptr<Kernel> k = fakecuda::FindKernel(kernel);
  if (k == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  // As driver 580: a library's kernel is described only while a context is current.
  FAKECUDA_REQUIRE_CONTEXT(ctx);
  (void)ctx;
  if (!k->layout_known || index >= k->sizes.size()) return CUDA_ERROR_INVALID_VALUE;
  if (offset != nullptr) *offset = k->offsets[index];
  if (size != nullptr) *size = k->sizes[index];
  return CUDA_SUCCESS;
}

CUresult cuLibraryGetKernelCount(unsigned int* count, CUlibrary library) {
  FAKECUDA_ENTER();
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<std::shared_ptr<Kernel>> kernels;
  CUresult r = fakecuda::ModuleKernels(reinterpret_cast<Module*>(library), &kernels);
  if (r == CUDA_SUCCESS) *count = static_cast<unsigned>(kernels.size());
  return r;
}

CUresult cuLibraryEnumerateKernels(CUkernel* out, unsigned int num, CUlibrary library) {
  FAKECUDA_ENTER();
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<std::shared_ptr<Kernel>> kernels;
  CUresult r = fakecuda::ModuleKernels(reinterpret_cast<Module*>(library), &kernels);
  if (r != CUDA_SUCCESS) return r;
  for (unsigned i = 0; i < num && i < kernels.size(); ++i) {
    out[i] = reinterpret_cast<CUkernel>(kernels[i].get());
  }
  return CUDA_SUCCESS;
}

// A module's functions, as its library's kernels (every kernel the module's name registered).
CUresult cuModuleGetFunctionCount(unsigned int* count, CUmodule module) {
  FAKECUDA_ENTER();
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<std::shared_ptr<Kernel>> kernels;
  CUresult r = fakecuda::ModuleKernels(reinterpret_cast<Module*>(module), &kernels);
  if (r == CUDA_SUCCESS) *count = static_cast<unsigned>(kernels.size());
  return r;
}

CUresult cuModuleEnumerateFunctions(CUfunction* out, unsigned int num, CUmodule module) {
  FAKECUDA_ENTER();
  if (out == nullptr || num == 0) return CUDA_ERROR_INVALID_VALUE;
  std::vector<std::shared_ptr<Kernel>> kernels;
  CUresult r = fakecuda::ModuleKernels(reinterpret_cast<Module*>(module), &kernels);
  if (r != CUDA_SUCCESS) return r;
  for (unsigned i = 0; i < num && i < kernels.size(); ++i) {
    out[i] = reinterpret_cast<CUfunction>(kernels[i].get());
  }
  return CUDA_SUCCESS;
}

// ---- Functions ----

CUresult cuFuncGetAttribute(int* value, CUfunction_attribute attribute, CUfunction function) {
  FAKECUDA_ENTER();
  if (value == nullptr || attribute < 0 || attribute >= CU_FUNC_ATTRIBUTE_MAX) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::shared_ptr<Kernel> k = fakecuda::FindKernel(function);
  if (k == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *value = fakecuda::FunctionAttribute(k.get(), attribute);
  return CUDA_SUCCESS;
}

CUresult cuFuncSetAttribute(CUfunction function, CUfunction_attribute attribute, int value) {
  FAKECUDA_ENTER();
  if (attribute < 0 || attribute >= CU_FUNC_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Kernel> k = fakecuda::FindKernel(function);
  if (k == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (!fakecuda::SettableValue(attribute, value)) return CUDA_ERROR_INVALID_VALUE;
  fakecuda::KernelRegistry::Get().SetAttribute(k.get(), attribute, value);
  return CUDA_SUCCESS;
}

// Occupancy on the fake device: 2048 threads and 32 blocks per SM, 228 KiB of shared memory per
// SM shared evenly among the resident blocks; no registers or static shared memory.
namespace {
constexpr int kFakeThreadsPerSm = 2048;
constexpr int kFakeBlocksPerSm = 32;
constexpr size_t kFakeSmemPerSm = 228 * 1024;

int FakeActiveBlocks(int block_size, size_t smem) {
  if (block_size <= 0 || block_size > 1024) return 0;
  int blocks = std::min(kFakeBlocksPerSm, kFakeThreadsPerSm / block_size);
  if (smem > 0) blocks = std::min<int>(blocks, static_cast<int>(kFakeSmemPerSm / smem));
  return blocks;
}
}  // namespace

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* num_blocks, CUfunction function,
                                                              int block_size, size_t smem,
                                                              unsigned int flags) {
  FAKECUDA_ENTER();
  (void)flags;
  if (num_blocks == nullptr || block_size <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (fakecuda::FindKernel(function) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *num_blocks = FakeActiveBlocks(block_size, smem);
  return CUDA_SUCCESS;
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* num_blocks, CUfunction function,
                                                     int block_size, size_t smem) {
  return cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(num_blocks, function, block_size,
                                                              smem, 0);
}

CUresult cuOccupancyAvailableDynamicSMemPerBlock(size_t* smem, CUfunction function, int num_blocks,
                                                 int block_size) {
  FAKECUDA_ENTER();
  if (smem == nullptr || num_blocks <= 0 || block_size <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (fakecuda::FindKernel(function) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *smem = kFakeSmemPerSm / static_cast<size_t>(num_blocks);
  return CUDA_SUCCESS;
}

CUresult cuOccupancyMaxPotentialBlockSizeWithFlags(int* min_grid, int* block_size,
                                                   CUfunction function, CUoccupancyB2DSize cb,
                                                   size_t smem, int limit, unsigned int flags) {
  FAKECUDA_ENTER();
  (void)flags;
  if (min_grid == nullptr || block_size == nullptr || limit < 0) return CUDA_ERROR_INVALID_VALUE;
  if (fakecuda::FindKernel(function) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  int max_block = limit > 0 && limit < 1024 ? limit : 1024;
  int best = -1;
  for (int bs = max_block / 32 * 32; bs >= 32; bs -= 32) {
    int blocks = FakeActiveBlocks(bs, cb ? cb(bs) : smem);
    if (blocks * bs > best) {
      best = blocks * bs;
      *block_size = bs;
      *min_grid = blocks * fakecuda::kMultiprocessorCount;
    }
    if (best >= kFakeThreadsPerSm) break;
  }
  return CUDA_SUCCESS;
}

CUresult cuOccupancyMaxPotentialBlockSize(int* min_grid, int* block_size, CUfunction function,
                                          CUoccupancyB2DSize cb, size_t smem, int limit) {
  return cuOccupancyMaxPotentialBlockSizeWithFlags(min_grid, block_size, function, cb, smem, limit,
                                                   0);
}

// Clusters on the fake device: any cluster of up to 8 blocks fits; as many clusters are active as
// the SMs hold blocks of the configuration.
CUresult cuOccupancyMaxActiveClusters(int* clusters, CUfunction function, const CUlaunchConfig* config) {
  FAKECUDA_ENTER();
  if (clusters == nullptr || config == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (fakecuda::FindKernel(function) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  unsigned size = 1;
  for (unsigned i = 0; i < config->numAttrs; ++i) {
    if (config->attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
      const auto& d = config->attrs[i].value.clusterDim;
      size = d.x * d.y * d.z;
    }
  }
  if (size == 0 || size > 8) return CUDA_ERROR_INVALID_CLUSTER_SIZE;
  int threads = static_cast<int>(config->blockDimX * config->blockDimY * config->blockDimZ);
  *clusters = FakeActiveBlocks(threads, config->sharedMemBytes) * fakecuda::kMultiprocessorCount /
              static_cast<int>(size);
  return CUDA_SUCCESS;
}

CUresult cuOccupancyMaxPotentialClusterSize(int* size, CUfunction function,
                                            const CUlaunchConfig* config) {
  FAKECUDA_ENTER();
  if (size == nullptr || config == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (fakecuda::FindKernel(function) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *size = 8;
  return CUDA_SUCCESS;
}

CUresult cuFuncSetCacheConfig(CUfunction function, CUfunc_cache config) {
  FAKECUDA_ENTER();
  if (fakecuda::FindKernel(function) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (config < CU_FUNC_CACHE_PREFER_NONE || config > CU_FUNC_CACHE_PREFER_EQUAL) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

CUresult cuKernelSetCacheConfig(CUkernel kernel, CUfunc_cache config, CUdevice dev) {
  FAKECUDA_ENTER();
  (void)dev;
  if (fakecuda::FindKernel(kernel) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (config < CU_FUNC_CACHE_PREFER_NONE || config > CU_FUNC_CACHE_PREFER_EQUAL) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

CUresult cuFuncGetName(const char** name, CUfunction function) {
  FAKECUDA_ENTER();
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Kernel> k = fakecuda::FindKernel(function);
  if (k == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *name = k->name.c_str();  // the kernel object is never freed
  return CUDA_SUCCESS;
}

CUresult cuFuncGetParamInfo(CUfunction function, size_t index, size_t* offset, size_t* size) {
  FAKECUDA_ENTER();
  std::shared_ptr<Kernel> k = fakecuda::FindKernel(function);
  if (k == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (!k->layout_known || index >= k->sizes.size()) return CUDA_ERROR_INVALID_VALUE;
  if (offset != nullptr) *offset = k->offsets[index];
  if (size != nullptr) *size = k->sizes[index];
  return CUDA_SUCCESS;
}

// ---- Launches ----

CUresult cuLaunchKernel(CUfunction f, unsigned int grid_x, unsigned int grid_y,
                        unsigned int grid_z, unsigned int block_x, unsigned int block_y,
                        unsigned int block_z, unsigned int shared_bytes, CUstream stream,
                        void** kernel_params, void** extra) {
  FAKECUDA_ENTER();
  (void)shared_bytes;
  const unsigned grid[3] = {grid_x, grid_y, grid_z};
  const unsigned block[3] = {block_x, block_y, block_z};
  return fakecuda::Launch(f, grid, block, stream, kernel_params, extra);
}

FAKECUDA_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int grid_x,
                                             unsigned int grid_y, unsigned int grid_z,
                                             unsigned int block_x, unsigned int block_y,
                                             unsigned int block_z, unsigned int shared_bytes,
                                             CUstream stream, void** kernel_params,
                                             void** extra) {
  FAKECUDA_ENTER();
  (void)shared_bytes;
  const unsigned grid[3] = {grid_x, grid_y, grid_z};
  const unsigned block[3] = {block_x, block_y, block_z};
  return fakecuda::Launch(f, grid, block, stream, kernel_params, extra);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** kernel_params,
                          void** extra) {
  FAKECUDA_ENTER();
  if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const unsigned grid[3] = {config->gridDimX, config->gridDimY, config->gridDimZ};
  const unsigned block[3] = {config->blockDimX, config->blockDimY, config->blockDimZ};
  return fakecuda::Launch(f, grid, block, config->hStream, kernel_params, extra);
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int grid_x, unsigned int grid_y,
                                   unsigned int grid_z, unsigned int block_x,
                                   unsigned int block_y, unsigned int block_z,
                                   unsigned int shared_bytes, CUstream stream,
                                   void** kernel_params) {
  FAKECUDA_ENTER();
  (void)shared_bytes;
  const unsigned grid[3] = {grid_x, grid_y, grid_z};
  const unsigned block[3] = {block_x, block_y, block_z};
  return fakecuda::Launch(f, grid, block, stream, kernel_params, nullptr);
}

CUresult cuLaunchHostFunc(CUstream stream_handle, CUhostFn fn, void* user_data) {
  FAKECUDA_ENTER();
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<fakecuda::Stream> stream = fakecuda::ResolveStream(stream_handle, &err);
  if (stream == nullptr) return err;
  {
    // Stream capture: the host function becomes a host node of the capture graph (it runs at
    // every launch, not now).
    fakecuda::Driver& d = fakecuda::Driver::Get();
    std::lock_guard<std::mutex> lock(d.mu);
    if (stream->capture != nullptr) {
      auto node = std::make_unique<fakecuda::GraphNode>();
      node->kind = fakecuda::GraphNodeKind::kHost;
      node->host.fn = fn;
      node->host.userData = user_data;
      node->deps = stream->capture_deps;
      stream->capture_deps = {node.get()};
      stream->capture->nodes.push_back(std::move(node));
      return CUDA_SUCCESS;
    }
  }
  stream->worker.Enqueue([fn, user_data] { fn(user_data); });
  return CUDA_SUCCESS;
}

CUresult cuStreamAddCallback(CUstream stream_handle, CUstreamCallback callback, void* user_data,
                             unsigned int flags) {
  FAKECUDA_ENTER();
  if (callback == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<fakecuda::Stream> stream = fakecuda::ResolveStream(stream_handle, &err);
  if (stream == nullptr) return err;
  stream->worker.Enqueue(
      [stream_handle, callback, user_data] { callback(stream_handle, CUDA_SUCCESS, user_data); });
  return CUDA_SUCCESS;
}
