// ipc_pair [--mib N] [--leave-open]: CUDA IPC between two processes, the way torch.multiprocessing shares CUDA
// tensors. The program forks before touching CUDA; each process then initialises the driver on
// its own (remotely: its own connection and session on the worker).
//
//   A (producer, parent)                        B (consumer, child)
//   allocates N MiB, fills it on a stream,
//   records an interprocess event, sends
//   both IPC handles down a pipe         ---->  opens the event, makes its stream wait for it,
//                                               opens the memory, reads A's bytes, writes its
//                                               own on its stream, records an interprocess
//                                     <----     event of its own and sends its handle
//   opens B's event, waits for it on its
//   stream, reads B's bytes back         ---->  closes the memory (twice: the second fails),
//                                               tries bad handles, destroys its events
//
// --leave-open: B exits without closing the memory or destroying the events (what a crashed
// consumer leaves behind; remotely its session closes them).
// Prints `RESULT key=value` lines (a_* from A, b_* from B; error codes as numbers) and ends with
// `RESULT verdict=PASS|FAIL` from A. Exit status: 0 pass, 1 fail, 2 setup error. Written against
// the driver API only, so it runs on the real driver, the fake driver and the remote stub alike
// (tests/gpu/remote_compare.sh, tests/worker/remote_e2e_test.cc).
#include <cuda.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr uint32_t kFillA = 0x5eed0001u;   // A's memset
constexpr uint32_t kFillB = 0xb0b0b0b0u;   // B's memset of the first half
constexpr size_t kHeader = 64 * 1024;      // A's and B's copied patterns (bytes)
constexpr int kPipeTimeoutMs = 60000;

uint32_t PatternA(size_t i) { return static_cast<uint32_t>(i * 2654435761u) ^ 0xa5a5a5a5u; }
uint32_t PatternB(size_t i) { return static_cast<uint32_t>(i * 40503u) ^ 0x3c3c3c3cu; }

char g_role = '?';
bool g_ok = true;
bool g_leave_open = false;

void Result(const char* key, long long value) {
  std::printf("RESULT %c_%s=%lld\n", g_role, key, value);
  std::fflush(stdout);
}
// A check that the verdict depends on.
void Check(const char* key, bool ok) {
  Result(key, ok ? 1 : 0);
  if (!ok) g_ok = false;
}
// A call that must succeed: its result is printed and counted.
bool Must(const char* key, CUresult r) {
  Result(key, r);
  if (r != CUDA_SUCCESS) g_ok = false;
  return r == CUDA_SUCCESS;
}
// A call that must fail (bad input): its result is printed; success counts as a failure.
void MustFail(const char* key, CUresult r) {
  Result(key, r);
  if (r == CUDA_SUCCESS) g_ok = false;
}

bool WriteAll(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    ssize_t w = write(fd, b, n);
    if (w <= 0) return false;
    b += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}
bool ReadAll(int fd, void* p, size_t n) {
  auto* b = static_cast<uint8_t*>(p);
  while (n > 0) {
    pollfd pf{fd, POLLIN, 0};
    if (poll(&pf, 1, kPipeTimeoutMs) <= 0) return false;
    ssize_t r = read(fd, b, n);
    if (r <= 0) return false;
    b += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

struct ToConsumer {
  CUipcMemHandle mem;
  CUipcEventHandle event;
  uint64_t bytes;
};
struct ToProducer {
  uint8_t ok;
  CUipcEventHandle event;
};

bool Setup(CUcontext* ctx) {
  CUdevice dev = 0;
  if (!Must("init", cuInit(0))) return false;
  if (!Must("device", cuDeviceGet(&dev, 0))) return false;
  if (!Must("ctx", cuDevicePrimaryCtxRetain(ctx, dev))) return false;
  return Must("set_ctx", cuCtxSetCurrent(*ctx));
}

// A: the producer.
int Producer(int to_b, int from_b, size_t bytes) {
  g_role = 'a';
  CUcontext ctx = nullptr;
  if (!Setup(&ctx)) return 2;
  int v = 0;
  cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED, 0);
  Check("ipc_event_supported", v == 1);
  cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 0);
  Check("unified_addressing", v == 1);

  CUdeviceptr d = 0;
  CUstream st = nullptr;
  CUevent ev = nullptr, plain = nullptr;
  if (!Must("alloc", cuMemAlloc(&d, bytes))) return 2;
  if (!Must("stream", cuStreamCreate(&st, CU_STREAM_NON_BLOCKING))) return 2;
  std::vector<uint32_t> head(kHeader / 4);
  for (size_t i = 0; i < head.size(); ++i) head[i] = PatternA(i);
  Must("fill", cuMemsetD32Async(d, kFillA, bytes / 4, st));
  Must("head", cuMemcpyHtoDAsync(d, head.data(), kHeader, st));
  // Creating an interprocess event that can be timed is refused.
  CUevent timed = nullptr;
  MustFail("timed_interprocess_event", cuEventCreate(&timed, CU_EVENT_INTERPROCESS));
  if (!Must("event", cuEventCreate(&ev, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING))) return 2;
  Must("record", cuEventRecord(ev, st));

  ToConsumer msg{};
  msg.bytes = bytes;
  if (!Must("get_mem_handle", cuIpcGetMemHandle(&msg.mem, d))) return 1;
  if (!Must("get_event_handle", cuIpcGetEventHandle(&msg.event, ev))) return 1;
  // Refused: an event created without CU_EVENT_INTERPROCESS, a pointer that is no allocation.
  CUipcEventHandle eh;
  Must("plain_event", cuEventCreate(&plain, CU_EVENT_DISABLE_TIMING));
  MustFail("plain_event_handle", cuIpcGetEventHandle(&eh, plain));
  CUipcMemHandle mh;
  MustFail("wild_pointer_handle", cuIpcGetMemHandle(&mh, 0x10));
  // Opening one's own handle: the driver's answer is printed, not judged (the fake refuses it).
  CUdeviceptr own = 0;
  CUresult r = cuIpcOpenMemHandle(&own, msg.mem, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  Result("open_own_handle", r);
  if (r == CUDA_SUCCESS) cuIpcCloseMemHandle(own);

  if (!WriteAll(to_b, &msg, sizeof(msg))) {
    Check("sent_handles", false);
    return 1;
  }
  ToProducer back{};
  if (!ReadAll(from_b, &back, sizeof(back)) || !back.ok) {
    Check("consumer_wrote", false);
  } else {
    Check("consumer_wrote", true);
    // B's writes are ordered before its event: wait for it on this stream, then read.
    CUevent theirs = nullptr;
    if (Must("open_consumer_event", cuIpcOpenEventHandle(&theirs, back.event))) {
      Must("wait_consumer_event", cuStreamWaitEvent(st, theirs, 0));
      std::vector<uint32_t> got(bytes / 4);
      Must("read_back", cuMemcpyDtoHAsync(got.data(), d, bytes, st));
      Must("sync", cuStreamSynchronize(st));
      const size_t half = bytes / 8;  // in u32
      bool first = true, second = true;
      for (size_t i = 0; i < half; ++i) first = first && got[i] == kFillB;
      for (size_t i = 0; i < kHeader / 4; ++i) second = second && got[half + i] == PatternB(i);
      // What B did not touch is still A's.
      bool rest = got[half + kHeader / 4] == kFillA && got.back() == kFillA;
      Check("sees_consumer_memset", first);
      Check("sees_consumer_copy", second);
      Check("rest_unchanged", rest);
      Must("destroy_consumer_event", cuEventDestroy(theirs));
    }
  }
  uint8_t done = 1;
  WriteAll(to_b, &done, 1);
  uint8_t closed = 0;
  Check("consumer_closed", ReadAll(from_b, &closed, 1) && closed == 1);
  Must("destroy_event", cuEventDestroy(ev));
  cuEventDestroy(plain);
  Must("free", cuMemFree(d));
  cuStreamDestroy(st);
  return g_ok ? 0 : 1;
}

// B: the consumer.
int Consumer(int from_a, int to_a) {
  g_role = 'b';
  ToConsumer msg{};
  if (!ReadAll(from_a, &msg, sizeof(msg))) {
    Check("got_handles", false);
    return 2;
  }
  CUcontext ctx = nullptr;
  ToProducer back{};
  if (!Setup(&ctx)) {
    WriteAll(to_a, &back, sizeof(back));
    return 2;
  }
  const size_t bytes = msg.bytes;
  CUstream st = nullptr;
  CUevent theirs = nullptr, mine = nullptr;
  CUdeviceptr p = 0;
  Must("stream", cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  if (Must("open_event", cuIpcOpenEventHandle(&theirs, msg.event))) {
    Must("wait_event", cuStreamWaitEvent(st, theirs, 0));
  }
  if (!Must("open_mem", cuIpcOpenMemHandle(&p, msg.mem, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))) {
    WriteAll(to_a, &back, sizeof(back));
    return 1;
  }
  // The opened memory is device memory of this process: range, attributes, unified copies.
  CUdeviceptr base = 0;
  size_t size = 0;
  Must("range", cuMemGetAddressRange(&base, &size, p + 100));
  Check("range_ok", base == p && size >= bytes);
  unsigned type = 0;
  Must("ptr_type", cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p));
  Check("ptr_is_device", type == CU_MEMORYTYPE_DEVICE);

  std::vector<uint32_t> got(bytes / 4);
  Must("read", cuMemcpyDtoHAsync(got.data(), p, bytes, st));
  Must("sync_read", cuStreamSynchronize(st));
  bool head = true, fill = true;
  for (size_t i = 0; i < kHeader / 4; ++i) head = head && got[i] == PatternA(i);
  for (size_t i = kHeader / 4; i < got.size(); i += 997) fill = fill && got[i] == kFillA;
  fill = fill && got.back() == kFillA;
  Check("reads_producer_copy", head);
  Check("reads_producer_memset", fill);
  std::vector<uint32_t> small(1024);
  Must("unified_copy", cuMemcpy(reinterpret_cast<CUdeviceptr>(small.data()), p, 4096));
  Check("unified_copy_ok", small[0] == PatternA(0) && small[1023] == PatternA(1023));

  // Opened again in the same context: the same pointer, one more reference (closed below).
  CUdeviceptr again = 0;
  if (Must("open_again", cuIpcOpenMemHandle(&again, msg.mem, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))) {
    Check("open_again_same_pointer", again == p);
    Must("close_again", cuIpcCloseMemHandle(again));
  }

  // Writes: the first half by memset, a pattern behind it by copy; then an event of B's own.
  std::vector<uint32_t> pattern(kHeader / 4);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = PatternB(i);
  Must("memset", cuMemsetD32Async(p, kFillB, bytes / 8, st));
  Must("copy", cuMemcpyHtoDAsync(p + bytes / 2, pattern.data(), kHeader, st));
  if (Must("event", cuEventCreate(&mine, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING)) &&
      Must("record", cuEventRecord(mine, st)) &&
      Must("get_event_handle", cuIpcGetEventHandle(&back.event, mine))) {
    back.ok = 1;
  }
  // Exporting opened memory again: printed, not judged (remotely the worker refuses it; it is
  // no allocation of this session).
  CUipcMemHandle re;
  Result("reexport_opened", cuIpcGetMemHandle(&re, p));
  WriteAll(to_a, &back, sizeof(back));
  uint8_t done = 0;
  Check("producer_done", ReadAll(from_a, &done, 1) && done == 1);

  Must("sync", cuStreamSynchronize(st));
  if (g_leave_open) {
    uint8_t closed = 1;
    WriteAll(to_a, &closed, 1);
    return g_ok ? 0 : 1;
  }
  Must("close", cuIpcCloseMemHandle(p));
  MustFail("double_close", cuIpcCloseMemHandle(p));
  MustFail("close_wild", cuIpcCloseMemHandle(0x10));
  // Handles that name nothing: zeros, all ones, and A's memory handle with its bytes reversed.
  CUipcMemHandle bad;
  CUdeviceptr x = 0;
  memset(&bad, 0, sizeof(bad));
  MustFail("open_zero_handle", cuIpcOpenMemHandle(&x, bad, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  memset(&bad, 0xff, sizeof(bad));
  MustFail("open_ones_handle", cuIpcOpenMemHandle(&x, bad, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  for (size_t i = 0; i < sizeof(bad.reserved); ++i) {
    bad.reserved[i] = msg.mem.reserved[sizeof(bad.reserved) - 1 - i];
  }
  MustFail("open_reversed_handle", cuIpcOpenMemHandle(&x, bad, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  CUipcEventHandle bad_event;
  memset(&bad_event, 0, sizeof(bad_event));
  CUevent e = nullptr;
  MustFail("open_zero_event_handle", cuIpcOpenEventHandle(&e, bad_event));
  // Still working after all that.
  CUdeviceptr mine_mem = 0;
  Must("alloc_after", cuMemAlloc(&mine_mem, 4096));
  Must("free_after", cuMemFree(mine_mem));
  if (theirs) Must("destroy_event", cuEventDestroy(theirs));
  if (mine) Must("destroy_own_event", cuEventDestroy(mine));
  cuStreamDestroy(st);
  uint8_t closed = 1;
  WriteAll(to_a, &closed, 1);
  return g_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  size_t mib = 16;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc) {
      mib = strtoull(argv[++i], nullptr, 10);
    } else if (strcmp(argv[i], "--leave-open") == 0) {
      g_leave_open = true;
    } else {
      std::fprintf(stderr, "usage: ipc_pair [--mib N] [--leave-open]\n");
      return 2;
    }
  }
  if (mib == 0 || mib > 4096) mib = 16;
  const size_t bytes = mib << 20;
  int a_to_b[2], b_to_a[2];
  if (pipe(a_to_b) != 0 || pipe(b_to_a) != 0) return 2;
  std::fflush(stdout);
  pid_t child = fork();
  if (child < 0) return 2;
  if (child == 0) {
    close(a_to_b[1]);
    close(b_to_a[0]);
    int rc = Consumer(a_to_b[0], b_to_a[1]);
    std::fflush(stdout);
    _exit(rc);
  }
  close(a_to_b[0]);
  close(b_to_a[1]);
  int rc = Producer(a_to_b[1], b_to_a[0], bytes);
  close(a_to_b[1]);
  int status = 0;
  waitpid(child, &status, 0);
  const int child_rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  Result("consumer_exit", child_rc);
  const bool pass = rc == 0 && child_rc == 0;
  std::printf("RESULT verdict=%s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : (rc == 2 || child_rc == 2 ? 2 : 1);
}
