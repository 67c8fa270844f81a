// JIT compilation and linking on the worker for the remote vGPU: cuModuleLoadDataEx with JIT
// options and the linker (cuLinkCreate_v2, cuLinkAddData_v2, cuLinkComplete, cuLinkDestroy).
// Wire formats: remote_protocol.h "JIT options and the linker". Log buffers live here (the
// client's stay in the client); their contents travel back with each reply. Every link state
// the client names must be one this session created; sizes and option ids are bounded.
//
// Thread safety: used by the session's one dispatch thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "driver/driver_table.h"
#include "transport/wire.h"
#include "worker/session_handles.h"

namespace tf::worker {

class JitSession {
 public:
  // The session's images by content hash (kOpImageChunk): nullptr unless complete with length n.
  using ImageLookup =
      std::function<const std::vector<uint8_t>*(uint64_t hash_lo, uint64_t hash_hi, uint64_t n)>;

  // Modules and link states go to the client as names published in `handles` (the session's).
  JitSession(const driver::DriverTable& d, HandleTable& handles) : d_(d), handles_(handles) {}
  ~JitSession() = default;
  JitSession(const JitSession&) = delete;
  JitSession& operator=(const JitSession&) = delete;

  // cuModuleLoadDataEx. *module: the loaded module's real handle (0 when none), for the
  // session's table.
  CUresult LoadDataEx(transport::Reader& rd, const ImageLookup& images, transport::Writer& out,
                      uint64_t* module);
  // cuLinkCreate_v2, cuLinkAddData_v2, cuLinkComplete, cuLinkDestroy. cuLinkComplete's cubin
  // goes to *bulk / *bulk_len (refused with CUDA_ERROR_NOT_SUPPORTED above max_bulk).
  CUresult Link(driver::Fn fn, transport::Reader& rd, const ImageLookup& images,
                transport::Writer& out, std::vector<uint8_t>* bulk, uint64_t* bulk_len,
                uint64_t max_bulk);
  // Destroys every link state left (the session ends).
  void DestroyAll();

  // Decoded JIT options with this side's log buffers. The arrays stay put while a link state
  // lives (CUDA keeps pointers to the values for its output options).
  struct Options {
    std::vector<CUjit_option> ids;
    std::vector<void*> values;
    std::vector<char> info, error;  // log buffers (empty: not asked for)
    int info_slot = -1, error_slot = -1;
  };

 private:
  struct LinkEntry {
    CUlinkState state = nullptr;
    Options options;
  };

  const driver::DriverTable& d_;
  HandleTable& handles_;
  std::map<uint64_t, std::unique_ptr<LinkEntry>> links_;  // by real handle
};

}  // namespace tf::worker
