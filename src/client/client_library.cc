// Libraries and kernels, the family cudart 12/13 loads its fat binaries with: cuLibraryLoadData
// (the image travels once per content hash, as for modules), cuLibraryUnload,
// cuLibraryGetKernel/EnumerateKernels, cuKernelGetFunction (cuLibraryGetModule is generated),
// cuKernelGet/SetAttribute, cuFuncSetAttribute; answered locally: cuKernelGetName,
// cuKernelGetParamInfo, cuKernelGetLibrary. Kernels come with their parameter layout, like
// functions, so a kernel (or a CUkernel cast to CUfunction, which CUDA accepts in launches) and
// the functions got from it launch through the usual path. Handles are the worker's; it checks
// each against its session's tables.
#include <cstring>
#include <vector>

#include "client/client_internal.h"
#include "tf_client_impl.h"

namespace tf::client {
namespace {

using driver::Fn;
using remote::Op;
using transport::Writer;

// Forgets what the client cached about a library's kernels and functions.
void ForgetLibrary(Session* s, uint64_t lib) {
  s->libraries.erase(lib);
  for (auto it = s->kernels.begin(); it != s->kernels.end();) {
    if (it->second.library == lib) it = s->kernels.erase(it);
    else ++it;
  }
  for (auto it = s->functions.begin(); it != s->functions.end();) {
    if (it->second.library == lib) it = s->functions.erase(it);
    else ++it;
  }
}

// Reads a kernel's function info and caches it under the kernel handle.
bool RecordKernel(Session* s, uint64_t lib, uint64_t k, const char* name, size_t len,
                  transport::Reader& rd) {
  FunctionInfo fi;
  fi.library = lib;
  fi.name.assign(name, len);
  if (!ReadFunctionInfo(rd, &fi)) return false;
  s->functions[k] = std::move(fi);
  s->kernels[k] = {lib, std::string(name, len)};
  return true;
}

}  // namespace

CUresult Impl_cuLibraryLoadData(CUlibrary* library, const void* code, CUjit_option* jit_options,
                                void** jit_values, unsigned int num_jit,
                                CUlibraryOption* lib_options, void** lib_values,
                                unsigned int num_lib) {
  if (library == nullptr || code == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if ((num_jit && jit_options == nullptr) || (num_lib && lib_options == nullptr)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Only the option counts travel: the values (log buffers, host pointers) mean nothing on the
  // worker, whose driver uses its defaults (docs/remote.md).
  (void)jit_values;
  (void)lib_values;
  TF_LOCK(l);
  TF_CTX_IF_ANY(l);
  Session* s = l.session();
  uint8_t buf[40];
  Writer w(buf, sizeof(buf));
  if (CUresult r = SendImage(s, code, w); r != CUDA_SUCCESS) return r;
  w.U32(num_jit);
  w.U32(num_lib);
  ReplyView rv;
  CUresult r = CallSync(s, Op(Fn::cuLibraryLoadData), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t lib = 0;
  if (!rv.reader.U64(&lib)) return CUDA_ERROR_UNKNOWN;
  s->libraries.insert(lib);
  *library = reinterpret_cast<CUlibrary>(lib);
  return CUDA_SUCCESS;
}

// A library from a file: read here, then loaded like cuLibraryLoadData's image.
CUresult Impl_cuLibraryLoadFromFile(CUlibrary* library, const char* fileName, CUjit_option* jit_options,
                                    void** jit_values, unsigned int num_jit,
                                    CUlibraryOption* lib_options, void** lib_values,
                                    unsigned int num_lib) {
  if (library == nullptr || fileName == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<char> image;
  if (CUresult r = ReadImageFile(fileName, &image); r != CUDA_SUCCESS) return r;
  return Impl_cuLibraryLoadData(library, image.data(), jit_options, jit_values, num_jit, lib_options,
                                lib_values, num_lib);
}

CUresult Impl_cuLibraryUnload(CUlibrary library) {
  TF_LOCK(l);
  TF_CTX_IF_ANY(l);
  Session* s = l.session();
  uint8_t buf[8];
  Writer w(buf, sizeof(buf));
  w.U64(H(library));
  CUresult r = CallSync(s, Op(Fn::cuLibraryUnload), w, nullptr);
  if (r == CUDA_SUCCESS) {
    ForgetLibrary(s, H(library));
    // Handles of the library's kernels may be reused by the next library.
    ForgetFunctionAnswers(s);
  }
  return r;
}

CUresult Impl_cuLibraryGetKernel(CUkernel* kernel, CUlibrary library, const char* name) {
  if (kernel == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  size_t len = strlen(name);
  if (len > remote::kMaxFunctionName) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX_IF_ANY(l);
  Session* s = l.session();
  uint8_t buf[remote::kMaxFunctionName + 16];
  Writer w(buf, sizeof(buf));
  w.U64(H(library));
  w.Blob(name, static_cast<uint32_t>(len));
  ReplyView rv;
  CUresult r = CallSync(s, Op(Fn::cuLibraryGetKernel), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t k = 0;
  if (!rv.reader.U64(&k) || !RecordKernel(s, H(library), k, name, len, rv.reader)) {
    return CUDA_ERROR_UNKNOWN;
  }
  *kernel = reinterpret_cast<CUkernel>(k);
  return CUDA_SUCCESS;
}

namespace {

// cuLibraryGetGlobal / cuModuleGetGlobal_v2: the worker's address and size of a __device__
// variable; the range is then device memory this client may copy to and from (cudaMemcpyToSymbol).
CUresult GetGlobal(Fn fn, CUdeviceptr* dptr, size_t* bytes, uint64_t owner, const char* name) {
  if (name == nullptr || (dptr == nullptr && bytes == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  size_t len = strlen(name);
  if (len > remote::kMaxFunctionName) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  if (fn == Fn::cuLibraryGetGlobal) {
    TF_CTX_IF_ANY(l);
  } else {
    TF_CTX(l);
  }
  Session* s = l.session();
  uint8_t buf[remote::kMaxFunctionName + 16];
  Writer w(buf, sizeof(buf));
  w.U64(owner);
  w.Blob(name, static_cast<uint32_t>(len));
  ReplyView rv;
  CUresult r = CallSync(s, Op(fn), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t p = 0, n = 0;
  if (!rv.reader.U64(&p) || !rv.reader.U64(&n)) return CUDA_ERROR_UNKNOWN;
  if (n > 0 && !s->allocs.count(p)) RecordDeviceAlloc(s, p, n, 0);
  if (dptr) *dptr = p;
  if (bytes) *bytes = n;
  return CUDA_SUCCESS;
}

}  // namespace

CUresult Impl_cuLibraryGetGlobal(CUdeviceptr* dptr, size_t* bytes, CUlibrary library,
                                 const char* name) {
  return GetGlobal(Fn::cuLibraryGetGlobal, dptr, bytes, H(library), name);
}

CUresult Impl_cuModuleGetGlobal_v2(CUdeviceptr* dptr, size_t* bytes, CUmodule hmod,
                                   const char* name) {
  return GetGlobal(Fn::cuModuleGetGlobal_v2, dptr, bytes, H(hmod), name);
}

CUresult Impl_cuLibraryEnumerateKernels(CUkernel* kernels, unsigned int num, CUlibrary library) {
  if (kernels == nullptr || num == 0 || num > remote::kMaxLibraryKernels) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX_IF_ANY(l);
  Session* s = l.session();
  uint8_t buf[16];
  Writer w(buf, sizeof(buf));
  w.U64(H(library));
  w.U32(num);
  ReplyView rv;
  CUresult r = CallSync(s, Op(Fn::cuLibraryEnumerateKernels), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint32_t n = 0;
  if (!rv.reader.U32(&n) || n > num) return CUDA_ERROR_UNKNOWN;
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t k = 0;
    const uint8_t* name = nullptr;
    uint32_t len = 0;
    rv.reader.U64(&k);
    if (!rv.reader.Blob(&name, &len, remote::kMaxFunctionName) ||
        !RecordKernel(s, H(library), k, reinterpret_cast<const char*>(name), len, rv.reader)) {
      return CUDA_ERROR_UNKNOWN;
    }
    kernels[i] = reinterpret_cast<CUkernel>(k);
  }
  return CUDA_SUCCESS;
}

CUresult Impl_cuKernelGetFunction(CUfunction* function, CUkernel kernel) {
  if (function == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  auto kit = s->functions.find(H(kernel));
  if (kit == s->functions.end() || !s->kernels.count(H(kernel))) return CUDA_ERROR_INVALID_HANDLE;
  // A kernel's function in a context stays the same while its library is loaded (cudart asks
  // before every launch through a CUkernel).
  uint64_t f = 0;
  if (CachedAnswer(s, Fn::cuKernelGetFunction, H(kernel), CurrentContext(), 0, &f)) {
    *function = reinterpret_cast<CUfunction>(f);
    return CUDA_SUCCESS;
  }
  uint8_t buf[8];
  Writer w(buf, sizeof(buf));
  w.U64(H(kernel));
  ReplyView rv;
  CUresult r = CallSync(s, Op(Fn::cuKernelGetFunction), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  if (!rv.reader.U64(&f)) return CUDA_ERROR_UNKNOWN;
  StoreAnswer(s, Fn::cuKernelGetFunction, H(kernel), CurrentContext(), 0, f);
  if (f != H(kernel)) s->functions[f] = s->functions[H(kernel)];  // same kernel, same layout
  *function = reinterpret_cast<CUfunction>(f);
  return CUDA_SUCCESS;
}

CUresult Impl_cuKernelGetAttribute(int* pi, CUfunction_attribute attrib, CUkernel kernel,
                                   CUdevice dev) {
  if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX_IF_ANY(l);
  Session* s = l.session();
  // Attributes change only through this client's cuKernelSetAttribute/cuFuncSetAttribute, which
  // forget the cached answers (cuDNN asks several per launch).
  uint64_t cached = 0;
  if (CachedAnswer(s, Fn::cuKernelGetAttribute, H(kernel), static_cast<uint64_t>(attrib),
                   static_cast<uint64_t>(dev), &cached)) {
    *pi = static_cast<int>(static_cast<int64_t>(cached));
    return CUDA_SUCCESS;
  }
  uint8_t buf[24];
  Writer w(buf, sizeof(buf));
  w.I32(static_cast<int32_t>(attrib));
  w.U64(H(kernel));
  w.I32(dev);
  ReplyView rv;
  CUresult r = CallSync(s, Op(Fn::cuKernelGetAttribute), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  int32_t v = 0;
  if (!rv.reader.I32(&v)) return CUDA_ERROR_UNKNOWN;
  StoreAnswer(s, Fn::cuKernelGetAttribute, H(kernel), static_cast<uint64_t>(attrib),
              static_cast<uint64_t>(dev), static_cast<uint64_t>(static_cast<int64_t>(v)));
  *pi = v;
  return CUDA_SUCCESS;
}

// Whether setting `attrib` of function/kernel `handle` to `val` on device `dev` cannot fail on the
// worker: the two attributes frameworks set before launches, with the limits the driver checks
// (dynamic shared memory plus the function's static shared memory within the device's opt-in
// maximum; a carveout of -1 to 100 percent). Such a set travels fire-and-forget (a failure would
// still come back at the next synchronizing call); any other set waits for the driver's answer.
static bool SetCannotFail(Session* s, uint64_t handle, CUfunction_attribute attrib, int val, int dev) {
  if (dev < 0 || static_cast<size_t>(dev) >= s->devices.size()) return false;
  auto it = s->functions.find(handle);
  if (it == s->functions.end()) return false;
  const std::vector<int>& fa = it->second.attrs;
  const std::vector<int>& da = s->devices[dev].attrs;
  switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: {
      if (static_cast<size_t>(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES) >= fa.size() ||
          static_cast<size_t>(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN) >= da.size()) {
        return false;
      }
      const int64_t static_bytes = fa[CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES];
      const int64_t optin = da[CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN];
      return val >= 0 && optin > 0 && static_bytes >= 0 && val + static_bytes <= optin;
    }
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
      return val >= -1 && val <= 100;
    default:
      return false;
  }
}

// The device of the calling thread's context (-1 without one).
static int ContextDevice(Session* s) {
  auto it = s->contexts.find(CurrentContext());
  return it == s->contexts.end() ? -1 : it->second;
}

CUresult Impl_cuKernelSetAttribute(CUfunction_attribute attrib, int val, CUkernel kernel,
                                   CUdevice dev) {
  TF_LOCK(l);
  TF_CTX_IF_ANY(l);
  Session* s = l.session();
  // Frameworks set the same attribute to the same value before every launch (PyTorch's
  // kernels set their dynamic shared memory size: 24 round trips per GPT-2 step). A value this
  // client already set successfully, and nothing changed since, is set again without asking.
  const uint64_t a = static_cast<uint64_t>(attrib), d = static_cast<uint64_t>(dev);
  const uint64_t want = static_cast<uint64_t>(static_cast<int64_t>(val));
  uint64_t was = 0;
  if (CachedAnswer(s, Fn::cuKernelSetAttribute, H(kernel), a, d, &was) && was == want) {
    return CUDA_SUCCESS;
  }
  uint8_t buf[24];
  Writer w(buf, sizeof(buf));
  w.I32(static_cast<int32_t>(attrib));
  w.I32(val);
  w.U64(H(kernel));
  w.I32(dev);
  const bool quick = SetCannotFail(s, H(kernel), attrib, val, dev);
  CUresult r = quick ? SendAsync(s, Op(Fn::cuKernelSetAttribute), w)
                     : CallSync(s, Op(Fn::cuKernelSetAttribute), w, nullptr);
  ForgetAnswersAbout(s, Fn::cuKernelGetAttribute, H(kernel));
  ForgetAnswersAbout(s, Fn::cuKernelSetAttribute, H(kernel));
  if (r != CUDA_SUCCESS) return r;
  StoreAnswer(s, Fn::cuKernelSetAttribute, H(kernel), a, d, want);
  // The value just set is what a get of it answers (nothing else of the kernel changed).
  if (quick) StoreAnswer(s, Fn::cuKernelGetAttribute, H(kernel), a, d, want);
  ForgetAnswers(s, Fn::cuFuncSetAttribute);  // a function of this kernel may have changed
  ForgetOccupancy(s);
  // Keep the cached attributes (cuFuncGetAttribute is answered locally) of the kernel in step.
  auto it = s->functions.find(H(kernel));
  int ai = static_cast<int>(attrib);
  if (it != s->functions.end() && ai >= 0 && static_cast<size_t>(ai) < it->second.attrs.size()) {
    it->second.attrs[ai] = val;
  }
  return CUDA_SUCCESS;
}

CUresult Impl_cuFuncSetAttribute(CUfunction func, CUfunction_attribute attrib, int val) {
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  // As for cuKernelSetAttribute: a value already set is not sent again.
  const uint64_t want = static_cast<uint64_t>(static_cast<int64_t>(val));
  uint64_t was = 0;
  if (CachedAnswer(s, Fn::cuFuncSetAttribute, H(func), static_cast<uint64_t>(attrib), 0, &was) &&
      was == want) {
    return CUDA_SUCCESS;
  }
  uint8_t buf[16];
  Writer w(buf, sizeof(buf));
  w.U64(H(func));
  w.I32(static_cast<int32_t>(attrib));
  w.I32(val);
  CUresult r = SetCannotFail(s, H(func), attrib, val, ContextDevice(s))
                   ? SendAsync(s, Op(Fn::cuFuncSetAttribute), w)
                   : CallSync(s, Op(Fn::cuFuncSetAttribute), w, nullptr);
  ForgetAnswers(s, Fn::cuKernelGetAttribute);  // the function may belong to any kernel
  ForgetAnswers(s, Fn::cuKernelSetAttribute);
  ForgetAnswersAbout(s, Fn::cuFuncSetAttribute, H(func));
  if (r != CUDA_SUCCESS) return r;
  StoreAnswer(s, Fn::cuFuncSetAttribute, H(func), static_cast<uint64_t>(attrib), 0, want);
  ForgetOccupancy(s);
  auto it = s->functions.find(H(func));
  int a = static_cast<int>(attrib);
  if (it != s->functions.end() && a >= 0 && static_cast<size_t>(a) < it->second.attrs.size()) {
    it->second.attrs[a] = val;
  }
  return CUDA_SUCCESS;
}

// Cache configuration of a function or kernel: a hint the worker's driver keeps; it changes what
// the occupancy queries answer.
CUresult Impl_cuKernelGetName(const char** name, CUkernel kernel) {
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  auto it = l.session()->kernels.find(H(kernel));
  if (it == l.session()->kernels.end()) return CUDA_ERROR_INVALID_HANDLE;
  *name = it->second.name.c_str();  // valid until the library is unloaded
  return CUDA_SUCCESS;
}

CUresult Impl_cuKernelGetLibrary(CUlibrary* library, CUkernel kernel) {
  if (library == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  auto it = l.session()->kernels.find(H(kernel));
  if (it == l.session()->kernels.end()) return CUDA_ERROR_INVALID_HANDLE;
  *library = reinterpret_cast<CUlibrary>(it->second.library);
  return CUDA_SUCCESS;
}

CUresult Impl_cuKernelGetParamInfo(CUkernel kernel, size_t index, size_t* offset, size_t* size) {
  TF_LOCK(l);
  Session* s = l.session();
  auto it = s->functions.find(H(kernel));
  if (it == s->functions.end() || !s->kernels.count(H(kernel))) return CUDA_ERROR_INVALID_HANDLE;
  if (!it->second.layout_known || index >= it->second.sizes.size()) return CUDA_ERROR_INVALID_VALUE;
  if (offset) *offset = it->second.offsets[index];
  if (size) *size = it->second.sizes[index];
  return CUDA_SUCCESS;
}

}  // namespace tf::client
