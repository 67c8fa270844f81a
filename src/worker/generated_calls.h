// The worker half of the generated remote surface (tools/codegen/gen_remote.py, from
// api/remote_surface.tsv): for every entry point of class sync or async, a case that decodes the
// client's payload, checks every argument against its description (the exact message length,
// enumerations against cuda.h, device ordinals, handles by kind through the session's
// HandleTable), calls the driver and encodes the outputs. A call that fails a check returns its
// CUDA error and changes nothing. See docs/remote.md "The remote surface".
//
// Threading: used by the session's replay thread only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "driver/driver_table.h"
#include "client/tf_remote_hooks.h"
#include "transport/wire.h"
#include "worker/session_handles.h"

namespace tf::worker {

// What a session lends to the generated calls.
class GeneratedHost {
 public:
  virtual ~GeneratedHost() = default;
  virtual const driver::DriverTable& Driver() const = 0;
  virtual HandleTable& Handles() = 0;
  virtual bool KnownDevice(int32_t d) const = 0;
  // [p, p + n) lies inside one range of device memory the session may name (its allocations,
  // mapped ranges, host memory the driver maps at its own address): the `dptr=` annotation.
  virtual bool DeviceRange(uint64_t p, uint64_t n) const = 0;
  // [p, p + n) lies inside one range the session mapped with cuMemMap: the `vmm=` annotation. Only
  // a session with a VMM family can tell: by default nothing is mapped.
  virtual bool MappedRange(uint64_t, uint64_t) const { return false; }
  // A generated call created or destroyed a driver object (real handle): the session keeps its
  // own tables in step (streams, events and contexts are also known to hand-written families).
  virtual void Created(HandleKind k, uint64_t real) = 0;
  virtual void Destroyed(HandleKind k, uint64_t real) = 0;
  // Whether a generated *Destroy call may destroy `real` (resolved, of kind k): a session may hold
  // objects of a kind it did not create (a device's default pool). False fails the call as an
  // unknown handle of kind k does.
  virtual bool MayDestroy(HandleKind, uint64_t) const { return true; }
  // After every generated driver call, whatever its result.
  virtual void AfterCall(driver::Fn fn, CUresult r) = 0;
  // A handle argument's wire name -> the driver's handle; false when it is not a live name of
  // kind k (a family may accept more: executable graphs for device launch keep their real handle).
  virtual bool Resolve(HandleKind k, uint64_t wire, uint64_t* real) { return Handles().Resolve(k, wire, real); }
  // The `of=ARG:OWNER` annotation: the object `real` of kind k belongs to `owner` (a graph node to
  // a graph, or to a graph an executable graph was instantiated from). Only a family that keeps
  // such tables can tell: by default nothing belongs, and the call fails.
  virtual bool Belongs(HandleKind, uint64_t, HandleKind, uint64_t) { return false; }
  // The `publish=OUT:PARENT` annotation: the name the client gets for `real`, an object of kind k
  // the driver handed out about `parent` (not created by this call; 0 stays 0). The family files
  // it in its tables; by default it is only published.
  virtual uint64_t Learn(HandleKind k, uint64_t real, HandleKind, uint64_t) { return Handles().Publish(k, real); }
  // The `hook=` annotation: the family that serves fn's hand-written checks and bookkeeping
  // (client/tf_remote_hooks.h). By default none: such a call is refused.
  virtual GeneratedHooks& Hooks(driver::Fn) {
    static GeneratedHooks none;
    return none;
  }
};

// Whether fn is generated (then DispatchGenerated serves it).
bool IsGenerated(driver::Fn fn);
// Decodes, validates and runs one generated call; outputs go to out (on CUDA_SUCCESS only).
CUresult DispatchGenerated(driver::Fn fn, transport::Reader& rd, transport::Writer& out,
                           GeneratedHost& host);
// Renders a generated call's payload as "name(arg=value, ...)" into buf (NUL-terminated, cut at
// cap); "name(<bad payload>)" when it does not decode. False when fn is not generated.
bool FormatGeneratedCall(driver::Fn fn, const uint8_t* payload, size_t n, char* buf, size_t cap);

}  // namespace tf::worker
