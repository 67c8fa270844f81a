// The driver-call layer of the remote vGPU protocol (docs/remote.md), shared by the client stub
// (src/client) and the worker session (src/worker). The frame format, handshake and transports are
// in src/transport (docs/protocol.md); this file fixes what the payloads of driver calls hold.
//
// Opcodes: a driver call travels as 0x0100 + its generated entry-point id (tf::driver::Fn); the
// two control messages below are this layer's own. Every field is little-endian, written with
// transport::Writer and read with transport::Reader. Handles (contexts, streams, events, modules,
// functions) travel as u64 values the worker chose; the client never dereferences them and the
// worker accepts only values in its session's tables. Device pointers travel unchanged.
//
// Replies (opcode kCallReply, the request's sequence): payload i32 CUresult, then the call's
// outputs (only when the result is CUDA_SUCCESS). A reply with kFlagError reports an earlier
// asynchronous failure instead (deferred error): payload u64 failed sequence, u16 failed opcode,
// i32 CUresult; the client returns that CUresult from the synchronizing call.
#pragma once

#include <cstdint>

#include "tf_driver_api.h"
#include "transport/wire.h"

namespace tf::remote {

// Control: the client asks the session to initialise the driver (cuInit(0)) and describe its
// devices. Sent once per connection, right after the handshake, reply-expected.
// Reply: i32 cuInit result, i32 driver version, u32 device count, then per device:
//   blob name (<= 256 bytes), 16 bytes uuid, u64 total memory, u32 attribute count N,
//   N x i32 (the value of CUdevice_attribute i for i in [0, N); 0 where the driver refuses).
inline constexpr uint16_t kOpSessionInfo = 0x0010;
// Control, fire-and-forget: one slice of a module image. Payload: u64 hash_lo, u64 hash_hi,
// u64 total length, u64 offset; bulk: the slice. The worker assembles images by hash and keeps
// them for the session; cuModuleLoadData* then names the image by hash only.
inline constexpr uint16_t kOpImageChunk = 0x0011;

// Control, fire-and-forget: the client ran host function `id` (cuLaunchHostFunc,
// cuStreamAddCallback); the worker's stream may go on. Payload: u64 id. Sent by the client's
// callback thread outside the call mutex (its sequence number may overtake a call's).
inline constexpr uint16_t kOpHostFuncDone = 0x0012;

// Host regions (feature kFeatureHostRegions, over a transport that CanShareHostMemory): page-locked
// host memory (cuMemAllocHost, cuMemHostAlloc) that the client maps from a memfd and offers to the
// worker (Transport::OfferHostMemory) before sending kOpHostRegionMap. The worker maps it at the
// same address when it can, registers it with its driver (cuMemHostRegister) and checks every
// region message against its own table. docs/remote.md "Host regions".
//   kOpHostRegionMap    reply-expected; u64 region id, u64 client address, u64 length (page
//                       multiple), u32 cuMemHostAlloc flags (| kRegionManaged for managed
//                       memory, feature kFeatureManagedRegions) -> u8 same address, u64 device
//                       pointer (0 when the driver gives none); CUDA_ERROR_OUT_OF_MEMORY beyond
//                       the session's limits
//   kOpHostRegionUnmap  reply-expected; u64 region id (the worker unregisters and unmaps it)
//   kOpHostRegionCopy   u8 direction (kRegionToDevice / kRegionToHost), u8 synchronous,
//                       u64 device pointer, u64 client host address, u64 length, u64 stream.
//                       synchronous (reply-expected): cuMemcpyHtoD/DtoH semantics; otherwise
//                       fire-and-forget cuMemcpyHtoDAsync/DtoHAsync on the stream.
inline constexpr uint16_t kOpHostRegionMap = 0x0013;
inline constexpr uint16_t kOpHostRegionUnmap = 0x0014;
inline constexpr uint16_t kOpHostRegionCopy = 0x0015;
inline constexpr uint8_t kRegionToDevice = 0;
inline constexpr uint8_t kRegionToHost = 1;
inline constexpr uint64_t kMaxHostRegionBytes = 1ull << 40;
// In kOpHostRegionMap's flags: the region is managed memory (counted against the vGPU's VRAM
// quota rather than the session's host-memory limit).
inline constexpr uint32_t kRegionManaged = 1u << 31;
constexpr bool IsHostRegionOp(uint16_t op) {
  return op >= kOpHostRegionMap && op <= kOpHostRegionCopy;
}

// Mirrored host memory (feature kFeatureMirrors; docs/remote.md "Mirrored memory"): host memory
// at the same virtual address in the client and the worker session, over a transport that cannot
// share memory (TCP). The worker maps anonymous memory at the address and registers it with its
// driver (the device pointer is the address itself); both sides keep a twin, the bytes the other
// side last saw, and send the bytes that differ from it ("runs") before the other side needs them:
// the client before every call it sends, the worker before every reply and host-function event.
//   kOpMirrorMap    reply-expected; u64 address, u64 length, u32 kind (kMirrorMapped,
//                   kMirrorManaged) -> u64 device pointer (== address). CUDA_ERROR_NOT_SUPPORTED
//                   when the worker cannot map the range at that address or its driver gives
//                   another device pointer; the client then keeps the memory to itself.
//   kOpMirrorUnmap  reply-expected; u64 address (as mapped): unregistered and unmapped after the
//                   context finished its work.
//   kOpMirrorData   fire-and-forget; "runs": u32 n (1 .. kMaxMirrorRuns), n x (u64 address,
//                   u64 length); bulk: the n runs' bytes, in order (the sum of the lengths; a
//                   masked run, below, takes its bitmap and the bytes it names). Every
//                   run lies wholly inside one mirror of the session, else the whole message is
//                   refused (a deferred CUDA_ERROR_INVALID_VALUE) and nothing of it is applied.
// 0x0019 is reserved for this family.
inline constexpr uint16_t kOpMirrorMap = 0x0016;
inline constexpr uint16_t kOpMirrorUnmap = 0x0017;
inline constexpr uint16_t kOpMirrorData = 0x0018;
inline constexpr uint32_t kMirrorMapped = 0;   // page-locked memory a kernel may use
inline constexpr uint32_t kMirrorManaged = 1;  // cuMemAllocManaged
inline constexpr uint32_t kMaxMirrorRuns = 4096;
inline constexpr uint64_t kMaxMirrorBytes = 1ull << 40;
// A run's length with this bit set is a masked run (mirror data only, mirror_runs.h): a span of
// at most kMaxMaskedSpan bytes; its bulk is a bitmap of ceil(span / 8) bytes, then the bytes whose
// bits are set, in order. Runs closer than kMaskGap bytes go as one masked run.
inline constexpr uint64_t kMaskedRun = 1ull << 63;
inline constexpr uint64_t kMaxMaskedSpan = 64 * 1024;
inline constexpr uint64_t kMaskGap = 16;
constexpr bool IsMirrorOp(uint16_t op) { return op == kOpMirrorMap || op == kOpMirrorUnmap; }
// Graph memcpy nodes with pageable memory of the client (docs/remote.md "Graph copies with
// pageable memory"; worker session_graph_host.h, client client_graph_host.cc). Such a node copies
// to or from a shadow, memory of the session standing for the client's range.
//   kOpGraphHostCopies  reply-expected; u64 executable graph -> u32 n, n x (u64 client address,
//                       u64 length, u8 direction kRegionToDevice / kRegionToHost): the ranges
//                       its nodes read at each launch and write back after it.
//   kOpGraphHostData    fire-and-forget, before a launch: runs (the kOpMirrorData encoding) of
//                       the client's current bytes, every run wholly inside one shadow, else
//                       nothing is written (a deferred CUDA_ERROR_INVALID_VALUE).
inline constexpr uint16_t kOpGraphHostCopies = 0x001A;
inline constexpr uint16_t kOpGraphHostData = 0x001B;
// IPC between sessions of one worker (driver-call opcodes, reply-expected; generated, the memory
// calls with the hooks of client_ipc.cc and the worker's session). A handle is the driver's
// CU_IPC_HANDLE_SIZE bytes, unchanged.
//   cuIpcGetMemHandle        u64 pointer                   -> handle
//   cuIpcOpenMemHandle_v2    handle, u32 flags             -> u64 pointer, u64 allocation size
//   cuIpcCloseMemHandle      u64 pointer                   -> u32 opens left (0: unmapped)
//   cuIpcGetEventHandle      u64 event                     -> handle
//   cuIpcOpenEventHandle     handle                        -> u64 event
//   cuMemGetAddressRange_v2  u64 pointer                   -> u64 base, u64 size

// Events, worker -> client, this layer's range (>= kEventBase): never a reply to anything.
inline constexpr uint16_t kEventBase = 0x8100;
// A stream reached host function `id`. Payload: u64 id. The stream waits for kOpHostFuncDone.
inline constexpr uint16_t kEvtHostFunc = 0x8100;
// Optional u32 after the id of a kEvtHostFunc: the run of a graph's host node (a host function
// captured from a stream becomes one): the client keeps the function for the graph's next launch.
inline constexpr uint32_t kHostFuncNodeRun = 1;
// One slice of a device-to-host copy's data (cuMemcpyDtoH_v2, cuMemcpyDtoHAsync_v2 to pageable
// memory), sent before the call's reply. Payload: u64 the call's sequence, u64 offset into the
// copy; bulk: the bytes. The copy's length is not limited by the transport's bulk limit.
inline constexpr uint16_t kEvtCopyData = 0x8101;
// Console output of the session (device printf: the driver prints it to the session's stdout at
// synchronizing points). Payload: the bytes (1 .. kMaxConsoleChunk), in order; sent before the
// reply of the call during which they were printed, and before host-function events. The client
// writes them to its own stdout. Events 0x8102..0x810F are reserved for this family.
inline constexpr uint16_t kEvtConsole = 0x8102;
inline constexpr uint32_t kMaxConsoleChunk = 64 * 1024;
// Mirror data, worker -> client: the payload and bulk of kOpMirrorData (the runs the session's
// mirrors changed since their twins), sent before the reply of every synchronous call and before
// every host-function event. A client that gets a run outside its mirrors drops the connection.
// 0x8111..0x811F are reserved for this family.
inline constexpr uint16_t kEvtMirrorData = 0x8110;
// Graph copy data, worker -> client: the runs (kOpMirrorData encoding) a launch's memcpy nodes
// wrote into shadows, sent by a host function of the session when the stream reaches the end of
// the launch, so before the reply of any call that waited for it. A client that gets a run
// outside the ranges its executable graphs write drops the connection.
inline constexpr uint16_t kEvtGraphHostData = 0x8120;
// The driver's asynchronous notification, worker -> client (session_notifications.h): the driver
// called the session's callback of one registration. Payload: u64 the registration's callback
// name, u32 CUasyncNotificationType, u64 bytes over budget (0 for other types). The client calls
// the program's callback on its callback thread; nothing answers. 0x8131..0x813F are reserved for
// this family.
inline constexpr uint16_t kEvtAsyncNotification = 0x8130;
// Slices of pageable copies over a transport with zero-copy bulk memory: small enough that the
// client's memcpy of one overlaps the worker's DMA of the previous ones.
inline constexpr uint64_t kPipelinedCopySlice = 4ull << 20;

inline constexpr uint32_t kMaxDeviceName = 256;
inline constexpr uint32_t kMaxDevices = 64;
inline constexpr uint32_t kMaxAttributes = 512;
inline constexpr uint32_t kMaxKernelParams = 1024;
inline constexpr uint32_t kMaxKernelParamBytes = 64 * 1024;
// Body graphs of one conditional graph node (CU_GRAPH_COND_TYPE_SWITCH may ask for many).
inline constexpr uint32_t kMaxConditionalBodies = 1024;
inline constexpr uint32_t kMaxFunctionName = 4096;
inline constexpr uint64_t kMaxImageBytes = 2ull << 30;
inline constexpr uint32_t kUnknownParamCount = 0xFFFFFFFFu;
inline constexpr uint32_t kMaxFuncAttributes = 64;
inline constexpr uint32_t kMaxLaunchAttributes = 32;
inline constexpr uint32_t kMaxGraphDeps = 4096;
inline constexpr uint32_t kMaxLibraryKernels = 65536;

// Libraries and kernels (client_library.cc, session.cc LibraryCall). "function info" is the
// function handle's cached state: u32 parameter count (kUnknownParamCount when the driver cannot
// tell) + count x (u64 offset, u64 size), u32 N + N x i32 attributes.
//   cuLibraryLoadData     u64 hash_lo, u64 hash_hi, u64 length, u32 #jit options, u32 #library
//                         options (counts only: the values stay in the client) -> u64 library
//   cuLibraryGetKernel    u64 library, blob name -> u64 kernel, function info
//   cuLibraryEnumerateKernels u64 library, u32 n -> u32 n', n' x (u64 kernel, blob name, info)
//   cuKernelGetFunction   u64 kernel -> u64 function (the client copies the kernel's info)
//   cuKernelGet/SetAttribute i32 attribute, [i32 value,] u64 kernel, i32 device
// Stream capture: cuStreamBeginCapture(_v2)(_ptsz) u64 stream [, u32 mode];
//   cuStreamEndCapture(_ptsz) u64 stream -> u64 graph (joins the session's graph table).
// Graphs (client_graphs.cc, worker/session_graphs.cc; every _ptsz and v1 form travels as the
// opcode named here). "nodes" is u32 n + n x u64 node; "edges" is u8 present [+ n x (u8 from
// port, u8 to port, u8 type)]; "params" is u32 CUgraphNodeType then by type: kernel u64 function,
// u32 grid x/y/z, block x/y/z, shared bytes, launch arguments; memcpy u64 context, per side (src,
// dst) u32 memory type (host = a client address in a host region, or device), u64 address, u64
// x, y, z, pitch, height, then u64 width, height, depth; memset u64 context, u64 dst, u64 pitch,
// u32 value, u32 element size, u64 width, u64 height; host u64 host-function id (kEvtHostFunc /
// kOpHostFuncDone at every run); child graph u64 graph; event record/wait u64 event; mem alloc
// u32 location type, i32 location id, u32 allocation type, u64 bytes, u32 n + n x (u32 location
// type, i32 id, u32 flags); mem free u64 pointer; conditional (cuGraphAddNode_v2 only) u64
// handle (the driver's value), u32 type, u32 size (1 .. kMaxConditionalBodies), u64 context;
// empty nothing. A memcpy host side outside host regions and mirrors gets a shadow (above).
//   cuGraphAdd*Node, cuGraphAddNode_v2  u64 graph, nodes, [edges: AddNode_v2 only,] params
//                                       -> u64 node [, u64 pointer: mem alloc]
//                                       [, u32 size + size x u64 body graph: conditional]
//   cuGraphConditionalHandleCreate      u64 graph, u64 context, u32 default value, u32 flags
//                                       -> u64 handle
//   cuGraphExec*NodeSetParams           u64 exec, u64 node, params (the event setters: generated)
//   cuGraphKernelNodeSetParams_v2       u64 node, params;  GetParams_v2 u64 node -> u64 function,
//                                       u32 x 7 geometry, u32 n (kUnknownParamCount) + n blobs
//   cuGraphGetNodes/GetRootNodes/GetEdges_v2/NodeGetDependencies_v2  u64 graph or node,
//                                       u32 capacity -> u64 count, entries (u64 node [, u64 to]
//                                       [, edge: u8 x 3 for edges and dependencies])
//   cuGraphAdd/RemoveDependencies_v2    u64 graph, nodes from, nodes to, edges
//   cuGraphDestroyNode u64 node;  cuGraphClone u64 -> u64  (cuGraphNodeGetType: generated)
//   cuGraphInstantiateWithFlags         u64 graph, u64 flags -> u64 exec, u32 host nodes/launch
//   cuGraphInstantiateWithParams        u64 graph, u64 flags, u64 upload stream -> i32 result,
//                                       u64 exec, u32 instantiate result, u64 error node, u32 host
//   cuGraphExecUpdate_v2                u64 exec, u64 graph -> i32 result, u32 update result, u64
//                                       error node, u64 error-from node, u32 host nodes/launch
//   cuGraphLaunch(_ptsz), cuGraphUpload u64 exec, u64 stream (fire-and-forget)
//   (cuGraphNodeSet/GetEnabled, cuDeviceGraphMemTrim, cuDevice{Get,Set}GraphMemAttribute: generated)
//   cuStreamGetCaptureInfo_v3           u64 stream -> u32 status, u64 id, u64 graph, u64 n,
//                                       n x (u64 node, u8 x 3 edge)
//   cuStreamUpdateCaptureDependencies_v2 u64 stream, u32 flags, nodes, edges
//   cuStreamBeginCaptureToGraph         u64 stream, u64 graph, u32 mode, nodes, edges
//   cuGraphNodeGetDependentNodes_v2     as NodeGetDependencies_v2 (the nodes that depend on it)
// Graph nodes (client_graph_nodes.cc, client_user_objects.cc; worker/session_graph_nodes.cc,
// session_user_objects.cc). The regular ones are generated (api/remote_surface.tsv: the memory free
// node's pointer, a child graph node's graph, a clone's node, the event node setters, executable
// graph flags). The legacy forms (cuGraphInstantiate(_v2), cuGraphAddKernelNode,
// cuGraphKernelNode{Get,Set}Params, cuGraphExecKernelNodeSetParams, cuGraphExecUpdate,
// cuGraphNodeGetDependentNodes) travel as the current calls they convert to.
//   cuGraphHostNodeGetParams            u64 node -> u64 host-function id (0: none of the client's)
//   cuGraphMemcpyNodeGetParams          u64 node -> per side u32 type, u64 address (a host side's
//                                       is the client's), u64 x, y, z, pitch, height; u64 width,
//                                       height, depth
//   cuGraphMemsetNodeGetParams          u64 node -> u64 dst, u64 pitch, u32 value, u32 element
//                                       size, u64 width, u64 height
//   cuGraphMemAllocNodeGetParams        u64 node -> u32 location type, i32 id, u32 allocation
//                                       type, u64 bytes, u64 pointer, u32 n + n x (u32, i32, u32)
//   cuGraph{Host,Memcpy,Memset}NodeSetParams, cuGraphNodeSetParams
//                                       u64 node, params (a copy's or memset's context is 0 or
//                                       ignored; cuGraphNodeSetParams: kernel, memcpy, memset,
//                                       host, event record and wait nodes, as the typed setters'
//                                       params)
//   cuGraphExecNodeSetParams            u64 exec, u64 node, params (as the typed exec setters)
//   cuGraphKernelNodeGetAttribute       u64 node, u32 attribute -> 64-byte CUlaunchAttributeValue;
//                                       Set: u64 node, u32 attribute, 64 bytes (attributes that
//                                       carry an event are refused: CUDA_ERROR_INVALID_VALUE)
//   cuGraphDebugDotPrint                u64 graph, u32 flags; the file's bytes arrive as
//                                       kEvtCopyData slices before the reply (at most 64 MiB)
//   cuUserObjectCreate                  u64 host-function id (the destroy callback), u32
//                                       references, u32 flags -> u64 object; when the driver
//                                       releases it the worker sends kEvtHostFunc with that id
//                                       and waits for nothing (the client sends no kOpHostFuncDone)
//   cuUserObject{Retain,Release}, cuGraph{Retain,Release}UserObject: generated
//                                       (api/remote_surface.tsv), the counts kept by hooks

// JIT options and the linker (client_link.cc, session_link.cc).
//   "JIT options": u32 count (<= kMaxJitOptions), count x (u32 CUjit_option, u64 value): the
//     value is the option's pointer-sized slot as the application filled it (an integer or a
//     float's bits), except for CU_JIT_INFO_LOG_BUFFER / CU_JIT_ERROR_LOG_BUFFER, whose buffers
//     stay in the client (value 0: the worker uses buffers of its own, of the size the
//     *_SIZE_BYTES option gives, at most kMaxJitLogBytes). Options whose value points to client
//     memory (global symbol names and addresses, referenced kernel and variable names) are
//     refused in the client with CUDA_ERROR_NOT_SUPPORTED.
//   "JIT result": i32 the driver's result, u32 count, count x u64 the option slots after the
//     call (the out options: wall time, log sizes, threads per block; 0 for the log buffers),
//     blob info log, blob error log (each up to its NUL, at most kMaxJitLogBytes). The call's
//     reply result is CUDA_SUCCESS whenever this was decoded, so the logs also come back when
//     the driver failed; the client returns the driver's result.
//   cuModuleLoadDataEx  u64 hash_lo, u64 hash_hi, u64 length, JIT options -> JIT result,
//                       u64 module (when the driver's result is CUDA_SUCCESS)
//   cuLinkCreate_v2     JIT options -> JIT result, u64 link state (when CUDA_SUCCESS)
//   cuLinkAddData_v2    u64 state, u32 CUjitInputType, u64 hash_lo, u64 hash_hi, u64 length
//                       (the input's bytes travel as image chunks), blob name, JIT options of
//                       this input (log buffers are not forwarded) -> JIT result of the state's
//                       options (logs accumulate over the link). cuLinkAddFile_v2 is this
//                       with the file's bytes, read in the client, and its path as the name.
//   cuLinkComplete      u64 state -> JIT result, u64 size (when CUDA_SUCCESS); bulk: the cubin
//                       (at most the transport's bulk limit)
//   cuLinkDestroy       u64 state
inline constexpr uint32_t kMaxJitOptions = 64;
inline constexpr uint32_t kMaxJitLogBytes = 24 * 1024;  // both logs fit a 64 KiB reply
constexpr bool IsJitPointerOption(uint32_t option) {
  return option == 17 || option == 18 || option == 25 || option == 27;
}

// cuLaunchKernelEx attributes: u32 id, then by id
//   PROGRAMMATIC_EVENT (7), LAUNCH_COMPLETION_EVENT (12): u64 event, i32 flags, i32 trigger
//   ACCESS_POLICY_WINDOW (1): u64 base, u64 bytes, u32 hitRatio (float bits), u32 hitProp,
//                             u32 missProp
//   any other id the client knows (kPlainLaunchAttribute): 64 bytes, the value union as the
//   client's driver ABI lays it out (plain integers and bytes only)
constexpr bool IsPlainLaunchAttribute(uint32_t id) {
  return id == 0 || (id >= 2 && id <= 6) || (id >= 8 && id <= 11) || id == 14 || id == 16;
}

// Launch argument encodings (cuLaunchKernel payload field "mode").
inline constexpr uint32_t kLaunchNoParams = 0;
inline constexpr uint32_t kLaunchParams = 1;       // u32 count, count x blob (each argument's bytes)
inline constexpr uint32_t kLaunchExtraBuffer = 2;  // blob: the CU_LAUNCH_PARAM_BUFFER_POINTER bytes

constexpr uint16_t Op(driver::Fn fn) {
  return transport::DriverCallOpcode(static_cast<uint16_t>(fn));
}

// Errors after which CUDA's context is unusable: they stay sticky on both sides.
constexpr bool IsStickyError(int r) {
  return r == 700 /*ILLEGAL_ADDRESS*/ || r == 710 /*ASSERT*/ || r == 714 || r == 715 || r == 716 ||
         r == 717 || r == 718 || r == 719 /*LAUNCH_FAILED*/ || r == 214 /*ECC_UNCORRECTABLE*/;
}

}  // namespace tf::remote
