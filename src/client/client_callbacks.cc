// Host functions in stream order (cuLaunchHostFunc, cuStreamAddCallback).
//
// The client registers the function under an id and sends (stream, id) fire-and-forget. The worker
// enqueues a host function of its own on that stream; when the stream reaches it, the worker sends
// an kEvtHostFunc event and holds the stream until the client answers kOpHostFuncDone, so later
// work on the stream runs after the function, as in CUDA.
//
// On the client, one callback thread runs the functions in the order the events arrive. Events are
// picked up by whichever thread reads the transport: a call waiting for its reply hands them over
// (HandleEventFrame), and while functions are outstanding and no call is waiting, the callback
// thread polls the transport itself (under the call mutex, without blocking). The acknowledgement
// is sent without the call mutex: a thread blocked in cuStreamSynchronize holds it while the worker
// waits for this very acknowledgement.
#include <pthread.h>

#include <deque>
#include <functional>
#include <map>

#include "client/client_internal.h"
#include "tf_client_impl.h"

namespace tf::client {
namespace {

using driver::Fn;
using remote::Op;
using transport::Writer;

struct Pending {
  Session* session = nullptr;
  CUhostFn host_fn = nullptr;         // cuLaunchHostFunc
  CUstreamCallback callback = nullptr;  // cuStreamAddCallback
  CUstream stream = nullptr;
  void* user = nullptr;
};

struct Callbacks {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
  std::map<uint64_t, Pending> registered;  // sent, not yet run
  // Host nodes: run at every launch of a graph holding them, never forgotten; by id and by
  // (function, argument).
  std::map<uint64_t, Pending> host_nodes;
  std::map<std::pair<CUhostFn, void*>, uint64_t> host_node_ids;
  // User objects' destroy callbacks: run once, when the worker's driver released the object; no
  // acknowledgement (nothing waits on a stream for them).
  std::map<uint64_t, Pending> releases;
  int64_t host_runs_expected = 0;  // launched host-node runs not yet run
  std::deque<uint64_t> reached;            // events received, in order
  // Other work for this thread (the driver's asynchronous notifications), and how many
  // registrations wait for events that may come while no call waits.
  std::deque<std::function<void()>> tasks;
  int64_t listeners = 0;
  uint64_t next_id = 1;
  bool thread_started = false;
};

Callbacks& Cb() {
  static auto* c = new Callbacks();  // never destroyed: the thread may run at exit
  return *c;
}

struct ForkReset {
  ForkReset() {
    pthread_atfork(nullptr, nullptr, [] {
      Callbacks& c = Cb();
      pthread_mutex_init(&c.mu, nullptr);
      pthread_cond_init(&c.cv, nullptr);
      c.registered.clear();
      c.host_nodes.clear();
      c.host_node_ids.clear();
      c.releases.clear();
      c.host_runs_expected = 0;
      c.reached.clear();
      c.tasks.clear();
      c.listeners = 0;
      c.thread_started = false;  // the child has no callback thread
    });
  }
} g_fork_reset;

void SendAck(Session* s, uint64_t id) {
  // What the host function wrote into mirrors reaches the worker before its stream goes on.
  if (s->mirror_count.load(std::memory_order_relaxed) > 0) PushMirrors(s);
  uint8_t buf[8];
  Writer w(buf, sizeof(buf));
  w.U64(id);
  transport::OutFrame f;
  f.opcode = remote::kOpHostFuncDone;
  f.sequence = s->next_seq++;
  f.payload = w.data();
  f.payload_length = static_cast<uint32_t>(w.size());
  (void)s->transport->Send(f);  // a broken transport is reported by the next call
}

// Reads pending frames while nobody else does (the call mutex is free).
void PollTransport() {
  ClientState& st = State();
  if (pthread_mutex_trylock(&st.mu) != 0) return;
  Session* s = st.session;
  if (s != nullptr && s->sticky == CUDA_SUCCESS) {
    for (int i = 0; i < 64; ++i) {
      transport::InFrame in;
      transport::TransportStatus ts = s->transport->Receive(&in, 0);
      if (ts.code() == transport::TransportErrc::kTimeout) break;
      if (!ts.ok()) {
        LoseConnection(s, ts);
        break;
      }
      if (in.header.opcode >= remote::kEventBase) HandleEventFrame(s, in);
      if (s->sticky != CUDA_SUCCESS) break;
    }
  }
  pthread_mutex_unlock(&st.mu);
}

void* CallbackThread(void*) {
  Callbacks& c = Cb();
  for (;;) {
    pthread_mutex_lock(&c.mu);
    if (c.reached.empty() && c.tasks.empty()) {
      bool outstanding = !c.registered.empty() || c.host_runs_expected > 0;
      timespec deadline;
      clock_gettime(CLOCK_REALTIME, &deadline);
      deadline.tv_nsec += outstanding ? 200 * 1000 : 50 * 1000 * 1000;
      if (deadline.tv_nsec >= 1000000000) {
        deadline.tv_sec += 1;
        deadline.tv_nsec -= 1000000000;
      }
      pthread_cond_timedwait(&c.cv, &c.mu, &deadline);
    }
    if (!c.tasks.empty()) {
      std::function<void()> task = std::move(c.tasks.front());
      c.tasks.pop_front();
      pthread_mutex_unlock(&c.mu);
      task();
      continue;
    }
    if (c.reached.empty()) {
      // Live user objects and notification registrations: their events may come while no call
      // waits (slow polling).
      bool poll = !c.registered.empty() || c.host_runs_expected > 0 || !c.releases.empty() ||
                  c.listeners > 0;
      pthread_mutex_unlock(&c.mu);
      if (poll) PollTransport();
      continue;
    }
    uint64_t id = c.reached.front();
    c.reached.pop_front();
    auto it = c.registered.find(id);
    Pending p;
    if (it != c.registered.end()) {
      p = it->second;
      c.registered.erase(it);
    } else if (auto hn = c.host_nodes.find(id); hn != c.host_nodes.end()) {
      p = hn->second;
      if (c.host_runs_expected > 0) --c.host_runs_expected;
    } else if (auto rel = c.releases.find(id); rel != c.releases.end()) {
      p = rel->second;
      c.releases.erase(rel);
      pthread_mutex_unlock(&c.mu);
      p.host_fn(p.user);
      continue;
    } else {
      pthread_mutex_unlock(&c.mu);
      continue;
    }
    pthread_mutex_unlock(&c.mu);
    if (p.host_fn) p.host_fn(p.user);
    else p.callback(p.stream, CUDA_SUCCESS, p.user);
    SendAck(p.session, id);
  }
  return nullptr;
}

// Starts the callback thread once. REQUIRES c.mu.
CUresult StartThreadLocked(Callbacks& c) {
  if (!c.thread_started) {
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int e = pthread_create(&t, &attr, &CallbackThread, nullptr);
    pthread_attr_destroy(&attr);
    if (e != 0) {
      ClientLog("cannot start the host-function thread (error %d)", e);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    c.thread_started = true;
  }
  return CUDA_SUCCESS;
}

CUresult Enqueue(Fn fn, CUstream stream, Pending p, unsigned flags) {
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  Callbacks& c = Cb();
  p.session = s;
  pthread_mutex_lock(&c.mu);
  if (CUresult r = StartThreadLocked(c); r != CUDA_SUCCESS) {
    pthread_mutex_unlock(&c.mu);
    return r;
  }
  uint64_t id = c.next_id++;
  c.registered[id] = p;
  pthread_cond_signal(&c.cv);
  pthread_mutex_unlock(&c.mu);
  uint8_t buf[24];
  Writer w(buf, sizeof(buf));
  w.U64(H(stream));
  w.U64(id);
  if (fn == Fn::cuStreamAddCallback) w.U32(flags);
  CUresult r = SendAsync(s, Op(fn), w);
  if (r != CUDA_SUCCESS) {
    pthread_mutex_lock(&c.mu);
    c.registered.erase(id);
    pthread_mutex_unlock(&c.mu);
  }
  return r;
}

}  // namespace

CUresult RegisterHostNode(Session* s, CUhostFn fn, void* user, uint64_t* id) {
  Callbacks& c = Cb();
  pthread_mutex_lock(&c.mu);
  CUresult r = StartThreadLocked(c);
  if (r == CUDA_SUCCESS) {
    uint64_t& known = c.host_node_ids[{fn, user}];
    if (known == 0) {
      known = c.next_id++;
      Pending p;
      p.session = s;
      p.host_fn = fn;
      p.user = user;
      c.host_nodes[known] = p;
    }
    c.host_nodes[known].session = s;
    *id = known;
  }
  pthread_mutex_unlock(&c.mu);
  return r;
}

bool HostNodeFunctionOf(uint64_t id, CUhostFn* fn, void** user) {
  Callbacks& c = Cb();
  pthread_mutex_lock(&c.mu);
  auto it = c.host_nodes.find(id);
  bool found = it != c.host_nodes.end();
  if (found) {
    *fn = it->second.host_fn;
    *user = it->second.user;
  } else if (auto r = c.registered.find(id); r != c.registered.end() && r->second.host_fn) {
    // A host function captured from a stream, whose node has not run yet.
    found = true;
    *fn = r->second.host_fn;
    *user = r->second.user;
  }
  pthread_mutex_unlock(&c.mu);
  return found;
}

CUresult RegisterUserObjectRelease(Session* s, CUhostFn fn, void* user, uint64_t* id) {
  Callbacks& c = Cb();
  pthread_mutex_lock(&c.mu);
  CUresult r = StartThreadLocked(c);
  if (r == CUDA_SUCCESS) {
    *id = c.next_id++;
    Pending p;
    p.session = s;
    p.host_fn = fn;
    p.user = user;
    c.releases[*id] = p;
  }
  pthread_mutex_unlock(&c.mu);
  return r;
}

void ForgetUserObjectRelease(uint64_t id) {
  Callbacks& c = Cb();
  pthread_mutex_lock(&c.mu);
  c.releases.erase(id);
  pthread_mutex_unlock(&c.mu);
}

CUresult RunOnCallbackThread(std::function<void()> task) {
  Callbacks& c = Cb();
  pthread_mutex_lock(&c.mu);
  CUresult r = StartThreadLocked(c);
  if (r == CUDA_SUCCESS) {
    c.tasks.push_back(std::move(task));
    pthread_cond_signal(&c.cv);
  }
  pthread_mutex_unlock(&c.mu);
  return r;
}

CUresult CallbackListenersChanged(int64_t n) {
  Callbacks& c = Cb();
  pthread_mutex_lock(&c.mu);
  CUresult r = StartThreadLocked(c);
  c.listeners += n;
  pthread_mutex_unlock(&c.mu);
  return r;
}

void HostNodeRunsLaunched(int64_t n) {
  Callbacks& c = Cb();
  pthread_mutex_lock(&c.mu);
  c.host_runs_expected += n;
  pthread_cond_signal(&c.cv);
  pthread_mutex_unlock(&c.mu);
}

void HandleEventFrame(Session* s, const transport::InFrame& in) {
  if (in.header.opcode == remote::kEvtMirrorData) {
    if (!ApplyMirrorData(s, in)) {
      LoseConnection(s, transport::TransportStatus::Error(transport::TransportErrc::kProtocol, 0,
                                                          "mirror data outside the mirrors"));
    }
    return;
  }
  if (in.header.opcode == remote::kEvtGraphHostData) {
    if (!ApplyGraphHostData(s, in)) {
      LoseConnection(s, transport::TransportStatus::Error(transport::TransportErrc::kProtocol, 0,
                                                          "graph copy data outside the graphs' copies"));
    }
    return;
  }
  if (in.header.opcode == remote::kEvtConsole) {
    WriteConsole(in.payload, in.payload_length);
    return;
  }
  if (in.header.opcode == remote::kEvtAsyncNotification) {
    HandleAsyncNotification(in);
    return;
  }
  if (in.header.opcode != remote::kEvtHostFunc) return;
  transport::Reader rd(in.payload, in.payload_length);
  uint64_t id = 0;
  uint32_t kind = 0;
  if (!rd.U64(&id)) return;
  if (rd.remaining() > 0) rd.U32(&kind);
  if (!rd.Finish() || (kind != 0 && kind != remote::kHostFuncNodeRun)) return;
  Callbacks& c = Cb();
  pthread_mutex_lock(&c.mu);
  if (kind == remote::kHostFuncNodeRun) {
    // A host function launched into a capturing stream became a host node: it runs at every
    // launch of the graph, so it joins the host nodes (counted per launch) instead of running once.
    if (auto it = c.registered.find(id); it != c.registered.end()) {
      c.host_nodes[id] = it->second;
      c.registered.erase(it);
    }
  }
  c.reached.push_back(id);
  pthread_cond_signal(&c.cv);
  pthread_mutex_unlock(&c.mu);
}

CUresult Impl_cuLaunchHostFunc(CUstream stream, CUhostFn fn, void* user) {
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Pending p;
  p.host_fn = fn;
  p.user = user;
  return Enqueue(Fn::cuLaunchHostFunc, stream, p, 0);
}

CUresult Impl_cuStreamAddCallback(CUstream stream, CUstreamCallback callback, void* user,
                                  unsigned int flags) {
  if (callback == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Pending p;
  p.callback = callback;
  p.stream = stream;
  p.user = user;
  return Enqueue(Fn::cuStreamAddCallback, stream, p, flags);
}

}  // namespace tf::client
