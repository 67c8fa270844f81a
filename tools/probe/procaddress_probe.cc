// Probes the real driver's cuGetProcAddress_v2 and records, for every exported base name, which
// exported symbol it returns for each (cudaVersion, flags) pair. The output, committed as
// api/cuda-<release>/procaddress.tsv, is the table the generated surface uses to route lookups to
// the exact variant (_v2, _v3, _ptsz, _ptds) the caller asked for.
//
// Usage: procaddress_probe [libcuda path] > procaddress.tsv
// Output columns: base  flags  from_version  symbol   (symbol "-" = not found; one row per change)
#include <cuda.h>
#include <dlfcn.h>
#include <elf.h>
#include <link.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace {

using GetProcFn = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
using InitFn = CUresult (*)(unsigned);

std::vector<std::string> ExportedNames(void* handle) {
  // Walk the loaded object's dynamic symbol table (DT_SYMTAB/DT_STRTAB; the symbol count comes from
  // DT_GNU_HASH / DT_HASH, but the string table bounds it just as well for our purpose).
  link_map* lm = nullptr;
  dlinfo(handle, RTLD_DI_LINKMAP, &lm);
  const ElfW(Sym)* symtab = nullptr;
  const char* strtab = nullptr;
  size_t strsz = 0;
  for (const ElfW(Dyn)* d = lm->l_ld; d->d_tag != DT_NULL; ++d) {
    if (d->d_tag == DT_SYMTAB) symtab = reinterpret_cast<const ElfW(Sym)*>(d->d_un.d_ptr);
    if (d->d_tag == DT_STRTAB) strtab = reinterpret_cast<const char*>(d->d_un.d_ptr);
    if (d->d_tag == DT_STRSZ) strsz = d->d_un.d_val;
  }
  std::vector<std::string> out;
  // The symbol table precedes the string table in every libcuda build seen; stop at strtab.
  for (const ElfW(Sym)* s = symtab + 1; reinterpret_cast<const char*>(s) < strtab; ++s) {
    if (s->st_name == 0 || s->st_name >= strsz || s->st_shndx == SHN_UNDEF) continue;
    if (ELF64_ST_TYPE(s->st_info) != STT_FUNC) continue;
    const char* n = strtab + s->st_name;
    if (std::strncmp(n, "cu", 2) == 0) out.emplace_back(n);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : "libcuda.so.1";
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    std::fprintf(stderr, "cannot load %s: %s\n", path, dlerror());
    return 2;
  }
  auto init = reinterpret_cast<InitFn>(dlsym(h, "cuInit"));
  auto gpa = reinterpret_cast<GetProcFn>(dlsym(h, "cuGetProcAddress_v2"));
  if (!init || !gpa || init(0) != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuInit failed or cuGetProcAddress_v2 missing\n");
    return 3;
  }
  std::vector<std::string> names = ExportedNames(h);
  std::map<void*, std::string> by_addr;
  for (const auto& n : names) {
    void* p = dlsym(h, n.c_str());
    if (!p) continue;
    auto it = by_addr.find(p);
    if (it == by_addr.end()) by_addr[p] = n;
    else if (n.size() > it->second.size()) it->second = n + "|" + it->second;
    else it->second += "|" + n;
  }
  std::regex suffix("(_v[0-9]+)?(_ptsz|_ptds)?$");
  std::set<std::string> bases;
  for (const auto& n : names) bases.insert(std::regex_replace(n, suffix, ""));
  std::vector<int> versions;
  for (int major = 2; major <= 13; ++major)
    for (int minor = 0; minor <= 9; ++minor) versions.push_back(major * 1000 + minor * 10);
  const cuuint64_t flag_set[] = {CU_GET_PROC_ADDRESS_DEFAULT, CU_GET_PROC_ADDRESS_LEGACY_STREAM,
                                 CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM};
  std::printf("# base\tflags\tfrom_version\tsymbol\n");
  for (const auto& b : bases) {
    for (cuuint64_t f : flag_set) {
      std::string last = "";
      for (int v : versions) {
        void* p = nullptr;
        CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
        CUresult r = gpa(b.c_str(), &p, v, f, &st);
        std::string sym;
        if (r != CUDA_SUCCESS || !p) {
          sym = "-";
        } else {
          auto it = by_addr.find(p);
          if (it != by_addr.end()) {
            sym = it->second;
          } else {
            Dl_info info{};
            dladdr(p, &info);
            sym = std::string("?") + (info.dli_sname ? info.dli_sname : "unexported");
          }
        }
        if (sym != last) {
          std::printf("%s\t%llu\t%d\t%s\n", b.c_str(), static_cast<unsigned long long>(f), v, sym.c_str());
          last = sym;
        }
      }
    }
  }
  // Also record the empty-name and unknown-name answers.
  void* p = nullptr;
  CUdriverProcAddressQueryResult st{};
  std::printf("#empty-name\t%d\n", static_cast<int>(gpa("", &p, 13000, 0, &st)));
  std::printf("#unknown-name\t%d\tstatus=%d\n", static_cast<int>(gpa("cuNoSuchFunction", &p, 13000, 0, &st)),
              static_cast<int>(st));
  return 0;
}
