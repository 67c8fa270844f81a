// The array family of a worker session (payloads: src/client/remote_arrays.h): CUDA arrays,
// mipmapped arrays, array and 2D/3D copies, texture and surface objects. It keeps the session's
// tables of these handles, checks every handle and every copied region against them (and device
// operands against the session's allocations, through Host), and destroys what the client left
// behind when the session ends.
//
// Arrays and mipmapped arrays are virtual handles (session_handles.h): the client holds names of
// the session's table (HandleKind::kArray, kMipmappedArray), translated here wherever a message
// carries one (copies, resource descriptors, levels, queries, destroys); a forged, stale or other
// session's name fails that call. A mipmapped array's levels are named arrays that are retired
// with it, and so are the planes of a multi-planar array (NV12) with their array; neither can be
// destroyed by itself. Texture and surface objects stay the driver's values: kernels read them on the GPU.
//
// Threading: used by the session's replay thread only.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "client/tf_remote_hooks.h"
#include "driver/driver_table.h"
#include "transport/wire.h"
#include "worker/session_handles.h"

namespace tf::worker {

class ArraysGeneratedHost;

class SessionArrays : public GeneratedHooks {
 public:
  // What the session lends to the array calls.
  class Host {
   public:
    virtual ~Host() = default;
    // [p, p + n) lies wholly inside one device allocation (or mapping) of the session.
    virtual bool DeviceRange(uint64_t p, uint64_t n) const = 0;
    // A stream of the session (or the NULL, legacy or per-thread stream).
    virtual bool KnownStream(uint64_t& s) const = 0;  // resolves a wire name in place
    // Sends n bytes of the current call's host-bound data at `offset` of the copy (kEvtCopyData,
    // before the call's reply). False when the client is gone.
    virtual bool SendCallData(uint64_t offset, const void* data, uint64_t n) = 0;
    // The most bytes one SendCallData may carry.
    virtual uint64_t CallDataLimit() const = 0;
    // Keeps `bytes` alive until the work enqueued on `st` so far has run.
    virtual void KeepUntilStreamDone(std::unique_ptr<uint8_t[]> bytes, CUstream st) = 0;
    // The session's handle table: arrays and mipmapped arrays are published in it.
    virtual HandleTable& Handles() = 0;
    // A device ordinal of the session (the memory-requirement queries).
    virtual bool KnownDevice(int32_t d) const = 0;
  };

  SessionArrays(const driver::DriverTable& d, Host& host) : d_(d), host_(host) {}

  // Whether fn belongs to this family.
  static bool Handles(driver::Fn fn);
  // The family's synchronizing calls (they report an earlier asynchronous failure).
  static bool IsSyncPoint(driver::Fn fn);

  // Replays one call (the generated ones through DispatchGenerated, with this family's tables and
  // hooks). bulk: the request's bulk (host source data), or nullptr.
  CUresult Call(driver::Fn fn, transport::Reader& rd, const uint8_t* bulk, uint64_t bulk_len,
                transport::Writer& out);

  // Destroys the objects, arrays and mipmapped arrays the client left, and logs how many.
  // REQUIRES a current context; the streams are idle.
  void Cleanup();

  // hook=check,done (api/remote_surface.tsv): a created array, a plane and a level are filed with
  // the driver's descriptor, which goes to the client after the handle.
  CUresult Check_cuArrayCreate_v2(CUDA_ARRAY_DESCRIPTOR&) override { return CUDA_SUCCESS; }
  CUresult Done_cuArrayCreate_v2(CUarray& a, const CUDA_ARRAY_DESCRIPTOR& d, transport::Writer& reply) override;
  CUresult Check_cuArray3DCreate_v2(CUDA_ARRAY3D_DESCRIPTOR&) override { return CUDA_SUCCESS; }
  CUresult Done_cuArray3DCreate_v2(CUarray& a, const CUDA_ARRAY3D_DESCRIPTOR& d, transport::Writer& reply) override;
  CUresult Check_cuArrayGetPlane(uint64_t&, uint32_t&) override { return CUDA_SUCCESS; }
  CUresult Done_cuArrayGetPlane(CUarray& plane, const uint64_t& array, const uint32_t& index,
                                transport::Writer& reply) override;
  CUresult Check_cuMipmappedArrayGetLevel(uint64_t&, uint32_t&) override { return CUDA_SUCCESS; }
  CUresult Done_cuMipmappedArrayGetLevel(CUarray& level, const uint64_t& mipmap, const uint32_t& index,
                                         transport::Writer& reply) override;
  // Texture and surface objects: the resource descriptor is checked by its type (CheckResource),
  // made objects are filed, only filed ones destroyed. The objects stay the driver's values.
  CUresult Check_cuTexObjectCreate(CUDA_RESOURCE_DESC& res, CUDA_TEXTURE_DESC& tex,
                                   CUDA_RESOURCE_VIEW_DESC* view) override;
  CUresult Done_cuTexObjectCreate(CUtexObject& o, const CUDA_RESOURCE_DESC&, const CUDA_TEXTURE_DESC&,
                                  const CUDA_RESOURCE_VIEW_DESC*) override {
    return FileObject(textures_, o);
  }
  CUresult Check_cuTexObjectDestroy(uint64_t& o) override { return ObjectFiled(textures_, o); }
  CUresult Done_cuTexObjectDestroy(const uint64_t& o) override { return ForgetObject(textures_, o); }
  CUresult Check_cuSurfObjectCreate(CUDA_RESOURCE_DESC& res) override;
  CUresult Done_cuSurfObjectCreate(CUsurfObject& o, const CUDA_RESOURCE_DESC&) override {
    return FileObject(surfaces_, o);
  }
  CUresult Check_cuSurfObjectDestroy(uint64_t& o) override { return ObjectFiled(surfaces_, o); }
  CUresult Done_cuSurfObjectDestroy(const uint64_t& o) override { return ForgetObject(surfaces_, o); }

 private:
  friend class ArraysGeneratedHost;  // the generated array calls (session_arrays.cc)

  struct ArrayEntry {
    CUDA_ARRAY3D_DESCRIPTOR desc = {};
    uint64_t mipmap = 0;    // a level of this mipmapped array
    uint64_t plane_of = 0;  // a plane of this multi-planar array (cuArrayGetPlane)
  };
  // A copy's operand after the checks, ready for the driver.
  struct Operand;

  CUresult GeneratedCall(driver::Fn fn, transport::Reader& rd, transport::Writer& out);
  CUresult LinearCopy(driver::Fn fn, transport::Reader& rd, const uint8_t* bulk, uint64_t bulk_len);
  CUresult BoxCopy(driver::Fn fn, transport::Reader& rd, const uint8_t* bulk, uint64_t bulk_len);
  // An object table (textures_, surfaces_): filing a made object, whether one is filed
  // (CUDA_ERROR_INVALID_VALUE if not, as the driver answers), forgetting a destroyed one.
  static CUresult FileObject(std::set<uint64_t>& t, uint64_t o) {
    t.insert(o);
    return CUDA_SUCCESS;
  }
  static CUresult ObjectFiled(const std::set<uint64_t>& t, uint64_t o) {
    return t.count(o) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  }
  static CUresult ForgetObject(std::set<uint64_t>& t, uint64_t o) {
    t.erase(o);
    return CUDA_SUCCESS;
  }
  // Checks a resource descriptor's live member (texture and surface objects) and rewrites the
  // descriptor to that member alone, an array's name turned into the driver's handle.
  CUresult CheckResource(CUDA_RESOURCE_DESC& res);
  // Bytes of the array's rows (width x element size), rows per slice and slices; false when
  // the array's format is unknown here.
  bool Extent(uint64_t array, uint64_t* row_bytes, uint64_t* rows, uint64_t* slices) const;
  // Files an array the driver made (a level of `mipmap`, a plane of `plane_of`, or neither) and
  // writes its descriptor to the reply.
  void File(CUarray a, const CUDA_ARRAY3D_DESCRIPTOR& asked, uint64_t mipmap, uint64_t plane_of,
            transport::Writer& reply);
  CUresult RunCopy(driver::Fn fn, const CUDA_MEMCPY3D& c, CUstream st);
  // The planes of these arrays (real handles) went with them: forgotten, their names retired.
  void ForgetPlanes(const std::set<uint64_t>& owners);
  // Resolves a wire name of kind k (kArray, kMipmappedArray) in place to the driver's handle;
  // false when it is not a live name of that kind in this session.
  bool Real(HandleKind k, uint64_t& h) const { return host_.Handles().Resolve(k, h, &h); }

  const driver::DriverTable& d_;
  Host& host_;
  // Keyed by the driver's handles (the names resolve to them first).
  std::map<uint64_t, ArrayEntry> arrays_;
  std::map<uint64_t, std::set<uint64_t>> mipmaps_;  // mipmapped array -> its level arrays
  std::set<uint64_t> textures_, surfaces_;
  std::vector<uint8_t> staging_;  // device-to-host parts on their way to the client
};

}  // namespace tf::worker
