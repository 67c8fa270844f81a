// What client_graphs.cc (graphs and their nodes) and client_graph_nodes.cc (getters and setters of
// nodes) share: a node's parameters of one type and their wire encoding (remote_protocol.h
// "Graphs": "params").
#pragma once

#include <cstddef>

#include "client/client_internal.h"

namespace tf::client {

// Node parameters of one type, as the generic CUgraphNodeParams carries them; the typed entry
// points fill the member they have.
struct NodeSpec {
  uint32_t type = CU_GRAPH_NODE_TYPE_EMPTY;
  const CUDA_KERNEL_NODE_PARAMS* kernel = nullptr;
  const CUDA_MEMCPY3D* copy = nullptr;
  const CUDA_MEMSET_NODE_PARAMS* memset = nullptr;
  CUcontext ctx = nullptr;
  CUhostFn host_fn = nullptr;
  void* host_user = nullptr;
  CUgraph child = nullptr;
  CUevent event = nullptr;
  CUDA_MEM_ALLOC_NODE_PARAMS* alloc = nullptr;  // dptr is written back
  CUdeviceptr free_ptr = 0;
  CUDA_CONDITIONAL_NODE_PARAMS* cond = nullptr;  // phGraph_out is written back
};

// The typed structs a NodeSpec made from CUgraphNodeParams points into.
struct NodeSpecStorage {
  CUDA_KERNEL_NODE_PARAMS kernel{};
  CUDA_MEMSET_NODE_PARAMS memset{};
  CUDA_MEM_ALLOC_NODE_PARAMS alloc{};
};

// The NodeSpec of generic parameters; CUDA_ERROR_NOT_SUPPORTED for a type not forwarded.
CUresult SpecOfParams(CUgraphNodeParams* p, NodeSpec* n, NodeSpecStorage* st);
// u32 type, then the type's parameters. Requires the session (host nodes register their function).
CUresult WriteSpec(Session* s, const NodeSpec& n, transport::Writer& w);
// A buffer large enough for a spec and ndeps dependencies.
size_t SpecBytes(const NodeSpec& n, size_t ndeps);
// u64 exec, u64 node, spec: the cuGraphExec*NodeSetParams family.
CUresult ExecSetParams(driver::Fn fn, CUgraphExec exec, CUgraphNode node, const NodeSpec& spec);

}  // namespace tf::client
