// Modules and their functions (api/remote_surface.tsv, hand:modules): images are sent once per
// connection by content hash; each function is recorded with its name, module and launch layout,
// which the function queries answer from.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "client/client_internal.h"
#include "tf_client_impl.h"

namespace tf::client {
namespace {

using driver::Fn;
using remote::Op;
using transport::Writer;

// 128-bit content hash of a module image (two independent 64-bit FNV-1a lanes).
void HashImage(const uint8_t* p, size_t n, uint64_t* lo, uint64_t* hi) {
  uint64_t a = 0xcbf29ce484222325ull, b = 0x84222325cbf29ce4ull ^ n;
  for (size_t i = 0; i < n; ++i) {
    a = (a ^ p[i]) * 0x100000001b3ull;
    b = (b ^ p[n - 1 - i]) * 0x100000001b3ull;
  }
  *lo = a;
  *hi = b;
}

// The size of a module image: a fatbinary, an ELF cubin, or NUL-terminated text (PTX, or the
// fake driver's "fakecuda:<module>").
size_t ImageSize(const void* image, const void** start) {
  const uint8_t* p = static_cast<const uint8_t*>(image);
  uint32_t magic;
  memcpy(&magic, p, 4);
  if (magic == 0x466243B1u) {  // fat binary wrapper: { int magic; int version; data; ... }
    const void* data;
    memcpy(&data, p + 8, sizeof(data));
    return ImageSize(data, start);
  }
  *start = image;
  if (magic == 0xBA55ED50u) {  // fatbin: u32 magic, u16 version, u16 header size, u64 body size
    uint16_t hs;
    uint64_t body;
    memcpy(&hs, p + 6, 2);
    memcpy(&body, p + 8, 8);
    return hs + body;
  }
  if (p[0] == 0x7f && p[1] == 'E' && p[2] == 'L' && p[3] == 'F' && p[4] == 2) {  // ELF64
    uint64_t phoff, shoff;
    uint16_t phentsize, phnum, shentsize, shnum;
    memcpy(&phoff, p + 32, 8);
    memcpy(&shoff, p + 40, 8);
    memcpy(&phentsize, p + 54, 2);
    memcpy(&phnum, p + 56, 2);
    memcpy(&shentsize, p + 58, 2);
    memcpy(&shnum, p + 60, 2);
    uint64_t end = std::max<uint64_t>(shoff + uint64_t(shentsize) * shnum,
                                      phoff + uint64_t(phentsize) * phnum);
    // Section contents may lie after the header table.
    for (uint16_t i = 0; i < shnum; ++i) {
      const uint8_t* sh = p + shoff + uint64_t(i) * shentsize;
      uint32_t type;
      uint64_t off, size;
      memcpy(&type, sh + 4, 4);
      memcpy(&off, sh + 24, 8);
      memcpy(&size, sh + 32, 8);
      if (type != 8 /*SHT_NOBITS*/) end = std::max(end, off + size);
    }
    return end;
  }
  return strlen(static_cast<const char*>(image)) + 1;
}

CUresult LoadModule(CUmodule* module, const void* image) {
  if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  uint8_t buf[32];
  Writer w(buf, sizeof(buf));
  if (CUresult r = SendImage(s, image, w); r != CUDA_SUCCESS) return r;
  ReplyView rv;
  CUresult r = CallSync(s, Op(Fn::cuModuleLoadData), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t m = 0;
  if (!rv.reader.U64(&m)) return CUDA_ERROR_UNKNOWN;
  *module = reinterpret_cast<CUmodule>(m);
  return CUDA_SUCCESS;
}

}  // namespace

CUresult SendImage(Session* s, const void* image, Writer& w) {
  const void* start = nullptr;
  size_t n = ImageSize(image, &start);
  return SendImageBytes(s, start, n, w);
}

CUresult SendImageBytes(Session* s, const void* start, size_t n, Writer& w) {
  if (start == nullptr || n == 0 || n > remote::kMaxImageBytes) return CUDA_ERROR_INVALID_IMAGE;
  uint64_t lo, hi;
  HashImage(static_cast<const uint8_t*>(start), n, &lo, &hi);
  uint64_t key = lo ^ ((hi << 1) | (hi >> 63));
  if (!s->images_sent.count(key)) {
    uint64_t slice = s->transport->max_bulk_bytes();
    for (uint64_t off = 0; off < n; off += slice) {
      uint8_t buf[32];
      Writer cw(buf, sizeof(buf));
      cw.U64(lo);
      cw.U64(hi);
      cw.U64(n);
      cw.U64(off);
      CUresult r = SendAsync(s, remote::kOpImageChunk, cw, static_cast<const uint8_t*>(start) + off,
                             std::min<uint64_t>(slice, n - off));
      if (r != CUDA_SUCCESS) return r;
    }
    s->images_sent.insert(key);
  }
  w.U64(lo);
  w.U64(hi);
  w.U64(n);
  return CUDA_SUCCESS;
}

bool ReadFunctionInfo(transport::Reader& rd, FunctionInfo* fi) {
  uint32_t n = 0;
  rd.U32(&n);
  if (n != remote::kUnknownParamCount) {
    if (n > remote::kMaxKernelParams) return false;
    fi->layout_known = true;
    fi->offsets.resize(n);
    fi->sizes.resize(n);
    for (uint32_t i = 0; i < n; ++i) {
      rd.U64(&fi->offsets[i]);
      rd.U64(&fi->sizes[i]);
    }
  }
  uint32_t na = 0;
  if (rd.U32(&na) && na <= remote::kMaxFuncAttributes) {
    fi->attrs.resize(na);
    for (auto& a : fi->attrs) rd.I32(&a);
  }
  return rd.ok();
}

CUresult Impl_cuModuleLoadData(CUmodule* module, const void* image) { return LoadModule(module, image); }

CUresult ReadImageFile(const char* fname, std::vector<char>* image) {
  FILE* f = fopen(fname, "rb");
  if (f == nullptr) return CUDA_ERROR_FILE_NOT_FOUND;
  image->clear();
  char chunk[65536];
  size_t n;
  while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) image->insert(image->end(), chunk, chunk + n);
  bool failed = ferror(f) != 0;
  fclose(f);
  if (failed) return CUDA_ERROR_FILE_NOT_FOUND;
  if (image->empty()) return CUDA_ERROR_INVALID_IMAGE;
  image->push_back('\0');
  return CUDA_SUCCESS;
}

// A module from a file (Triton and Inductor load their cubins this way): the file is read here and
// its image sent like cuModuleLoadData's.
CUresult Impl_cuModuleLoad(CUmodule* module, const char* fname) {
  if (module == nullptr || fname == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<char> image;
  if (CUresult r = ReadImageFile(fname, &image); r != CUDA_SUCCESS) return r;
  return LoadModule(module, image.data());
}
CUresult Impl_cuModuleLoadFatBinary(CUmodule* module, const void* fatCubin) {
  return LoadModule(module, fatCubin);
}

CUresult Impl_cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
  if (hfunc == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  size_t len = strlen(name);
  if (len > remote::kMaxFunctionName) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  uint8_t buf[remote::kMaxFunctionName + 16];
  Writer w(buf, sizeof(buf));
  w.U64(H(hmod));
  w.Blob(name, static_cast<uint32_t>(len));
  ReplyView rv;
  CUresult r = CallSync(s, Op(Fn::cuModuleGetFunction), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t f = 0;
  rv.reader.U64(&f);
  FunctionInfo fi;
  fi.module = H(hmod);
  fi.name.assign(name, len);
  if (!ReadFunctionInfo(rv.reader, &fi)) return CUDA_ERROR_UNKNOWN;
  s->functions[f] = std::move(fi);
  *hfunc = reinterpret_cast<CUfunction>(f);
  return CUDA_SUCCESS;
}

// Functions of a module (cuFFT reaches them through the tools table, export_tables.cc): each
// recorded with its name and launch layout, as cuModuleGetFunction records one.
CUresult Impl_cuModuleEnumerateFunctions(CUfunction* functions, unsigned int num, CUmodule mod) {
  if (functions == nullptr || num == 0 || num > remote::kMaxLibraryKernels) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  uint8_t buf[16];
  Writer w(buf, sizeof(buf));
  w.U64(H(mod));
  w.U32(num);
  ReplyView rv;
  CUresult r = CallSync(s, Op(Fn::cuModuleEnumerateFunctions), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint32_t n = 0;
  if (!rv.reader.U32(&n) || n > num) return CUDA_ERROR_UNKNOWN;
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t f = 0;
    const uint8_t* name = nullptr;
    uint32_t len = 0;
    FunctionInfo fi;
    fi.module = H(mod);
    if (!rv.reader.U64(&f) || !rv.reader.Blob(&name, &len, remote::kMaxFunctionName) ||
        !ReadFunctionInfo(rv.reader, &fi)) {
      return CUDA_ERROR_UNKNOWN;
    }
    fi.name.assign(reinterpret_cast<const char*>(name), len);
    s->functions[f] = std::move(fi);
    functions[i] = reinterpret_cast<CUfunction>(f);
  }
  return CUDA_SUCCESS;
}

CUresult Impl_cuModuleUnload(CUmodule hmod) {
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  uint8_t buf[8];
  Writer w(buf, sizeof(buf));
  w.U64(H(hmod));
  CUresult r = Simple(l, Fn::cuModuleUnload, w);
  if (r == CUDA_SUCCESS) {
    for (auto it = s->functions.begin(); it != s->functions.end();) {
      if (it->second.module == H(hmod)) it = s->functions.erase(it);
      else ++it;
    }
    ForgetFunctionAnswers(s);  // function handles may be reused by the next module
  }
  return r;
}

// Answered from what the client recorded when it handed the function out; the name stays valid
// until its module or library is unloaded, as the driver's does.
CUresult Impl_cuFuncGetName(const char** name, CUfunction hfunc) {
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  Session* s = l.session();
  auto it = s->functions.find(H(hfunc));
  if (it != s->functions.end()) {
    *name = it->second.name.c_str();
    return CUDA_SUCCESS;
  }
  // A function the client never looked up (the kernel of a graph node): asked of the worker once.
  auto known = s->other_function_names.find(H(hfunc));
  if (known == s->other_function_names.end()) {
    TF_CTX(l);
    uint8_t buf[8];
    Writer w(buf, sizeof(buf));
    w.U64(H(hfunc));
    ReplyView rv;
    CUresult r = CallSync(s, Op(Fn::cuFuncGetName), w, &rv);
    if (r != CUDA_SUCCESS) return r;
    const uint8_t* data = nullptr;
    uint32_t len = 0;
    if (!rv.reader.Blob(&data, &len, remote::kMaxFunctionName)) return CUDA_ERROR_UNKNOWN;
    known = s->other_function_names.emplace(H(hfunc), std::string(reinterpret_cast<const char*>(data), len)).first;
  }
  *name = known->second.c_str();
  return CUDA_SUCCESS;
}

// The module a function came from (0 for a library's kernels: they have none here).
CUresult Impl_cuFuncGetModule(CUmodule* hmod, CUfunction hfunc) {
  if (hmod == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  auto it = l.session()->functions.find(H(hfunc));
  if (it == l.session()->functions.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (it->second.module == 0) return CUDA_ERROR_NOT_FOUND;
  *hmod = reinterpret_cast<CUmodule>(it->second.module);
  return CUDA_SUCCESS;
}

CUresult Impl_cuFuncGetParamInfo(CUfunction func, size_t index, size_t* offset, size_t* size) {
  TF_LOCK(l);
  auto it = l.session()->functions.find(H(func));
  if (it == l.session()->functions.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (!it->second.layout_known || index >= it->second.sizes.size()) return CUDA_ERROR_INVALID_VALUE;
  if (offset) *offset = it->second.offsets[index];
  if (size) *size = it->second.sizes[index];
  return CUDA_SUCCESS;
}

}  // namespace tf::client
