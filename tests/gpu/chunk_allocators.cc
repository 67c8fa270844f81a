#include "chunk_allocators.h"

#include <algorithm>

namespace tf::gpu {
namespace {

// Bytes per element of the arrays below: four 32-bit float channels.
constexpr uint64_t kTexelBytes = 16;

#define TF_TRY(call)                          \
  do {                                        \
    const CUresult rc_ = (call);              \
    if (rc_ != CUDA_SUCCESS) {                \
      *failed_call = #call;                   \
      failed_call->resize(failed_call->find('(')); \
      return rc_;                             \
    }                                         \
  } while (0)

// Allocations that are one device pointer and one size.
class PointerChunks : public ChunkAllocator {
 public:
  size_t count() const override { return chunks_.size(); }

  CUresult FreeLast(uint64_t* released) override {
    if (chunks_.empty()) return CUDA_ERROR_INVALID_VALUE;
    const Chunk last = chunks_.back();
    chunks_.pop_back();
    *released = last.bytes;
    return Release(last.ptr);
  }

  void FreeAll() override {
    while (!chunks_.empty()) {
      Release(chunks_.back().ptr);
      chunks_.pop_back();
    }
    AfterFreeAll();
  }

 protected:
  struct Chunk {
    CUdeviceptr ptr;
    uint64_t bytes;
  };
  virtual CUresult Release(CUdeviceptr ptr) { return cuMemFree(ptr); }
  virtual void AfterFreeAll() {}
  void Keep(CUdeviceptr ptr, uint64_t bytes, uint64_t* granted) {
    chunks_.push_back({ptr, bytes});
    *granted += bytes;
  }

 private:
  std::vector<Chunk> chunks_;
};

class MemAllocChunks : public PointerChunks {
 public:
  CUresult AllocOne(uint64_t bytes, uint64_t* granted, std::string* failed_call) override {
    CUdeviceptr ptr = 0;
    TF_TRY(cuMemAlloc(&ptr, bytes));
    Keep(ptr, bytes, granted);
    return CUDA_SUCCESS;
  }
};

class PitchChunks : public PointerChunks {
 public:
  CUresult AllocOne(uint64_t bytes, uint64_t* granted, std::string* failed_call) override {
    constexpr size_t kRowBytes = 8192;
    CUdeviceptr ptr = 0;
    size_t pitch = 0;
    const size_t rows = std::max<uint64_t>(1, bytes / kRowBytes);
    TF_TRY(cuMemAllocPitch(&ptr, &pitch, kRowBytes, rows, 16));
    Keep(ptr, static_cast<uint64_t>(pitch) * rows, granted);
    return CUDA_SUCCESS;
  }
};

class ManagedChunks : public PointerChunks {
 public:
  CUresult AllocOne(uint64_t bytes, uint64_t* granted, std::string* failed_call) override {
    CUdeviceptr ptr = 0;
    TF_TRY(cuMemAllocManaged(&ptr, bytes, CU_MEM_ATTACH_GLOBAL));
    Keep(ptr, bytes, granted);
    return CUDA_SUCCESS;
  }
};

// Stream-ordered allocation from the device's default pool or from an explicit pool. Each
// allocation is synchronized so that a deferred failure is seen at the chunk that caused it.
class AsyncChunks : public PointerChunks {
 public:
  AsyncChunks(CUdevice device, bool explicit_pool) : device_(device), explicit_pool_(explicit_pool) {}
  ~AsyncChunks() override {
    FreeAll();
    if (pool_ != nullptr) cuMemPoolDestroy(pool_);
    if (stream_ != nullptr) cuStreamDestroy(stream_);
  }

  CUresult AllocOne(uint64_t bytes, uint64_t* granted, std::string* failed_call) override {
    if (stream_ == nullptr) TF_TRY(cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING));
    if (explicit_pool_ && pool_ == nullptr) {
      CUmemPoolProps props{};
      props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
      props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
      props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      props.location.id = device_;
      TF_TRY(cuMemPoolCreate(&pool_, &props));
    }
    CUdeviceptr ptr = 0;
    if (explicit_pool_) {
      TF_TRY(cuMemAllocFromPoolAsync(&ptr, bytes, pool_, stream_));
    } else {
      TF_TRY(cuMemAllocAsync(&ptr, bytes, stream_));
    }
    TF_TRY(cuStreamSynchronize(stream_));
    Keep(ptr, bytes, granted);
    return CUDA_SUCCESS;
  }

 protected:
  CUresult Release(CUdeviceptr ptr) override {
    const CUresult rc = cuMemFreeAsync(ptr, stream_);
    if (rc != CUDA_SUCCESS) return rc;
    return cuStreamSynchronize(stream_);
  }
  void AfterFreeAll() override {
    CUmemoryPool pool = pool_;
    if (pool == nullptr && cuDeviceGetDefaultMemPool(&pool, device_) != CUDA_SUCCESS) return;
    cuMemPoolTrimTo(pool, 0);
  }

 private:
  CUdevice device_;
  bool explicit_pool_;
  CUstream stream_ = nullptr;
  CUmemoryPool pool_ = nullptr;
};

// Virtual memory management: physical handle, reserved range, mapping, access.
class VmmChunks : public ChunkAllocator {
 public:
  explicit VmmChunks(CUdevice device) : device_(device) {}
  ~VmmChunks() override { FreeAll(); }
  size_t count() const override { return chunks_.size(); }

  CUresult AllocOne(uint64_t bytes, uint64_t* granted, std::string* failed_call) override {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device_;
    size_t granularity = 0;
    TF_TRY(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    const uint64_t size = (bytes + granularity - 1) / granularity * granularity;
    Chunk chunk{};
    chunk.bytes = size;
    TF_TRY(cuMemCreate(&chunk.handle, size, &prop, 0));
    CUresult rc = cuMemAddressReserve(&chunk.ptr, size, 0, 0, 0);
    if (rc == CUDA_SUCCESS) {
      rc = cuMemMap(chunk.ptr, size, 0, chunk.handle, 0);
      if (rc == CUDA_SUCCESS) {
        CUmemAccessDesc access{};
        access.location = prop.location;
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        rc = cuMemSetAccess(chunk.ptr, size, &access, 1);
        if (rc != CUDA_SUCCESS) *failed_call = "cuMemSetAccess";
        chunk.mapped = true;
      } else {
        *failed_call = "cuMemMap";
      }
    } else {
      *failed_call = "cuMemAddressReserve";
    }
    if (rc != CUDA_SUCCESS) {
      Release(chunk);
      return rc;
    }
    chunks_.push_back(chunk);
    *granted += size;
    return CUDA_SUCCESS;
  }

  CUresult FreeLast(uint64_t* released) override {
    if (chunks_.empty()) return CUDA_ERROR_INVALID_VALUE;
    const Chunk last = chunks_.back();
    chunks_.pop_back();
    *released = last.bytes;
    return Release(last);
  }

  void FreeAll() override {
    while (!chunks_.empty()) {
      Release(chunks_.back());
      chunks_.pop_back();
    }
  }

 private:
  struct Chunk {
    CUmemGenericAllocationHandle handle;
    CUdeviceptr ptr;
    uint64_t bytes;
    bool mapped;
  };
  static CUresult Release(const Chunk& chunk) {
    CUresult first = CUDA_SUCCESS;
    auto keep_first = [&first](CUresult rc) {
      if (first == CUDA_SUCCESS) first = rc;
    };
    if (chunk.mapped) keep_first(cuMemUnmap(chunk.ptr, chunk.bytes));
    if (chunk.ptr != 0) keep_first(cuMemAddressFree(chunk.ptr, chunk.bytes));
    keep_first(cuMemRelease(chunk.handle));
    return first;
  }

  CUdevice device_;
  std::vector<Chunk> chunks_;
};

// CUDA arrays: 2D, 3D and mipmapped, all float4 texels.
class ArrayChunks : public ChunkAllocator {
 public:
  enum class Shape { k2D, k3D, kMipmap };
  explicit ArrayChunks(Shape shape) : shape_(shape) {}
  ~ArrayChunks() override { FreeAll(); }
  size_t count() const override { return chunks_.size(); }

  CUresult AllocOne(uint64_t bytes, uint64_t* granted, std::string* failed_call) override {
    Chunk chunk{};
    const uint64_t texels = std::max<uint64_t>(bytes / kTexelBytes, 1);
    if (shape_ == Shape::k2D) {
      CUDA_ARRAY_DESCRIPTOR desc{};
      desc.Width = 4096;
      desc.Height = std::max<uint64_t>(texels / desc.Width, 1);
      desc.Format = CU_AD_FORMAT_FLOAT;
      desc.NumChannels = 4;
      TF_TRY(cuArrayCreate(&chunk.array, &desc));
      chunk.bytes = desc.Width * desc.Height * kTexelBytes;
    } else if (shape_ == Shape::k3D) {
      CUDA_ARRAY3D_DESCRIPTOR desc{};
      desc.Width = 256;
      desc.Height = 256;
      desc.Depth = std::max<uint64_t>(texels / (desc.Width * desc.Height), 1);
      desc.Format = CU_AD_FORMAT_FLOAT;
      desc.NumChannels = 4;
      TF_TRY(cuArray3DCreate(&chunk.array, &desc));
      chunk.bytes = desc.Width * desc.Height * desc.Depth * kTexelBytes;
    } else {
      // A 2D base level of about 3/4 of the chunk; its full chain of levels adds about 1/3.
      constexpr unsigned kLevels = 4;
      CUDA_ARRAY3D_DESCRIPTOR desc{};
      desc.Width = 2048;
      desc.Height = std::max<uint64_t>(texels * 3 / 4 / desc.Width, 1);
      desc.Format = CU_AD_FORMAT_FLOAT;
      desc.NumChannels = 4;
      TF_TRY(cuMipmappedArrayCreate(&chunk.mipmap, &desc, kLevels));
      for (unsigned level = 0; level < kLevels; ++level) {
        chunk.bytes += std::max<uint64_t>(desc.Width >> level, 1) *
                       std::max<uint64_t>(desc.Height >> level, 1) * kTexelBytes;
      }
    }
    chunks_.push_back(chunk);
    *granted += chunk.bytes;
    return CUDA_SUCCESS;
  }

  CUresult FreeLast(uint64_t* released) override {
    if (chunks_.empty()) return CUDA_ERROR_INVALID_VALUE;
    const Chunk last = chunks_.back();
    chunks_.pop_back();
    *released = last.bytes;
    return Destroy(last);
  }

  void FreeAll() override {
    while (!chunks_.empty()) {
      Destroy(chunks_.back());
      chunks_.pop_back();
    }
  }

 private:
  struct Chunk {
    CUarray array;
    CUmipmappedArray mipmap;
    uint64_t bytes;
  };
  static CUresult Destroy(const Chunk& chunk) {
    return chunk.mipmap != nullptr ? cuMipmappedArrayDestroy(chunk.mipmap) : cuArrayDestroy(chunk.array);
  }

  Shape shape_;
  std::vector<Chunk> chunks_;
};

// A graph whose only node is a memory-allocation node; launched once, its allocation outlives
// the launch until freed. One graph per chunk, since a graph cannot be relaunched while its
// allocation is live.
class GraphChunks : public ChunkAllocator {
 public:
  explicit GraphChunks(CUdevice device) : device_(device) {}
  ~GraphChunks() override {
    FreeAll();
    if (stream_ != nullptr) cuStreamDestroy(stream_);
  }
  size_t count() const override { return chunks_.size(); }

  CUresult AllocOne(uint64_t bytes, uint64_t* granted, std::string* failed_call) override {
    if (stream_ == nullptr) TF_TRY(cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING));
    Chunk chunk{};
    chunk.bytes = bytes;
    TF_TRY(cuGraphCreate(&chunk.graph, 0));
    CUDA_MEM_ALLOC_NODE_PARAMS params{};
    params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    params.poolProps.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
    params.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    params.poolProps.location.id = device_;
    params.bytesize = bytes;
    CUgraphNode node = nullptr;
    CUresult rc = cuGraphAddMemAllocNode(&node, chunk.graph, nullptr, 0, &params);
    const char* call = "cuGraphAddMemAllocNode";
    if (rc == CUDA_SUCCESS) {
      chunk.ptr = params.dptr;
      rc = cuGraphInstantiate(&chunk.exec, chunk.graph, 0);
      call = "cuGraphInstantiate";
    }
    if (rc == CUDA_SUCCESS) {
      rc = cuGraphLaunch(chunk.exec, stream_);
      call = "cuGraphLaunch";
    }
    if (rc == CUDA_SUCCESS) {
      rc = cuStreamSynchronize(stream_);
      call = "cuStreamSynchronize";
    }
    if (rc != CUDA_SUCCESS) {
      *failed_call = call;
      chunk.launched = false;
      Destroy(chunk);
      return rc;
    }
    chunk.launched = true;
    chunks_.push_back(chunk);
    *granted += bytes;
    return CUDA_SUCCESS;
  }

  CUresult FreeLast(uint64_t* released) override {
    if (chunks_.empty()) return CUDA_ERROR_INVALID_VALUE;
    const Chunk last = chunks_.back();
    chunks_.pop_back();
    *released = last.bytes;
    return Destroy(last);
  }

  void FreeAll() override {
    while (!chunks_.empty()) {
      Destroy(chunks_.back());
      chunks_.pop_back();
    }
    cuDeviceGraphMemTrim(device_);
  }

 private:
  struct Chunk {
    CUgraph graph;
    CUgraphExec exec;
    CUdeviceptr ptr;
    uint64_t bytes;
    bool launched;
  };
  CUresult Destroy(const Chunk& chunk) {
    CUresult rc = CUDA_SUCCESS;
    if (chunk.launched) {
      rc = cuMemFreeAsync(chunk.ptr, stream_);
      if (rc == CUDA_SUCCESS) rc = cuStreamSynchronize(stream_);
    }
    if (chunk.exec != nullptr) cuGraphExecDestroy(chunk.exec);
    if (chunk.graph != nullptr) cuGraphDestroy(chunk.graph);
    return rc;
  }

  CUdevice device_;
  CUstream stream_ = nullptr;
  std::vector<Chunk> chunks_;
};

}  // namespace

const std::vector<std::string>& ChunkAllocatorPaths() {
  static const std::vector<std::string> paths = {"mem_alloc", "pitch",   "async",   "pool_async",
                                                 "vmm",       "managed", "array2d", "array3d",
                                                 "mipmap",    "graph"};
  return paths;
}

std::unique_ptr<ChunkAllocator> MakeChunkAllocator(const std::string& path, CUdevice device) {
  if (path == "mem_alloc") return std::make_unique<MemAllocChunks>();
  if (path == "pitch") return std::make_unique<PitchChunks>();
  if (path == "async") return std::make_unique<AsyncChunks>(device, false);
  if (path == "pool_async") return std::make_unique<AsyncChunks>(device, true);
  if (path == "vmm") return std::make_unique<VmmChunks>(device);
  if (path == "managed") return std::make_unique<ManagedChunks>();
  if (path == "array2d") return std::make_unique<ArrayChunks>(ArrayChunks::Shape::k2D);
  if (path == "array3d") return std::make_unique<ArrayChunks>(ArrayChunks::Shape::k3D);
  if (path == "mipmap") return std::make_unique<ArrayChunks>(ArrayChunks::Shape::kMipmap);
  if (path == "graph") return std::make_unique<GraphChunks>(device);
  return nullptr;
}

}  // namespace tf::gpu
