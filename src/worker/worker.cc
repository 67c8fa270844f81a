// The worker's parent process: opens the listeners, keeps one spare child waiting in Accept, and
// reaps sessions. The parent never loads the driver, so every session is forked from a process
// that has not touched CUDA, and a session that crashes takes no other client with it.
#include "worker/worker.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <ctime>
#include <set>
#include <string>

#include "transport/shm_transport.h"
#include "transport/tcp_transport.h"
#include "transport/tls_stream.h"
#include "worker/session.h"
#include "worker/session_ticket.h"

namespace tf::worker {
namespace {

std::atomic<bool> g_signal_stop{false};
void OnStopSignal(int) { g_signal_stop.store(true); }

// The worker's live sessions, in memory the parent shares with every process it forks: the
// parent counts a spare that became a session and a session it reaped; sessions read it before
// spinning (WorkerOptions::spin_sessions).
std::atomic<uint32_t>* g_live_sessions = nullptr;

// Handshakes run in parallel: a spare that accepts a connection tells the parent at once, and
// when its handshake takes longer than kHandOverMs the parent starts the next spare while the
// first one goes on, so a peer that connects and says nothing holds up no one else's handshake
// (each ends at the connect timeout, 5 s). At most
// kMaxHandshakes are under way (beyond, connections wait in the listen backlog). Once half of
// them are, a peer (an IP address; a uid on the unix socket) with kHandshakesPerPeer under way
// already has its further connections closed at once, before their handshake, and the worker
// says so: one peer cannot take the slots of the others, while a burst of clients of one host
// (tenants started together) is never turned away by a worker that has room.
constexpr int kMaxHandshakes = 64;
constexpr int kHandshakesPerPeer = 4;
struct Handshakes {  // in the memory shared with every forked process; slot free when pid is 0
  std::atomic<int32_t> pid[kMaxHandshakes];
  std::atomic<uint64_t> peer[kMaxHandshakes];
  // The spare the parent counts on to accept next. A spare whose handshake failed goes on
  // accepting while it is still that one (a connection that closes at once costs no fork); once
  // the parent has started another (the handshake took longer than kHandOverMs), it exits.
  std::atomic<int32_t> designated;
};
constexpr int64_t kHandOverMs = 20;
Handshakes* g_handshakes = nullptr;

// A spare's message to the parent on the pipe they share (one write each, atomic).
struct SpareNote {
  int32_t pid;
  char what;  // 'a': accepted a connection, shaking hands; 's': became a session; 'f': its
              // handshake failed and, still the designated spare, it accepts on
};
void Note(int fd, char what) {
  SpareNote n{static_cast<int32_t>(getpid()), what};
  ssize_t ignored = write(fd, &n, sizeof(n));
  (void)ignored;
}

// Who is at the other end of an accepted connection, as a key and in words.
uint64_t PeerKey(int fd, std::string* who) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return 0;
  char text[INET6_ADDRSTRLEN] = "?";
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
    *who = text;
    return (uint64_t{4} << 56) | ntohl(a->sin_addr.s_addr);
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
    *who = text;
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) {  // an IPv4 client of a dual-stack listener
      uint32_t v4 = 0;
      memcpy(&v4, a->sin6_addr.s6_addr + 12, 4);
      return (uint64_t{4} << 56) | ntohl(v4);
    }
    // Its /64: one host may hold a whole /64 of addresses.
    uint64_t h = 1469598103934665603ull;  // FNV-1a of the first 8 bytes
    for (int i = 0; i < 8; ++i) h = (h ^ a->sin6_addr.s6_addr[i]) * 1099511628211ull;
    return (uint64_t{6} << 56) | (h >> 8);
  }
  if (ss.ss_family == AF_UNIX) {
    ucred cred{};
    socklen_t n = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &n) != 0) return 0;
    *who = "uid " + std::to_string(cred.uid) + " (pid " + std::to_string(cred.pid) + ")";
    return (uint64_t{0x55} << 56) | cred.uid;
  }
  return 0;
}

struct AcceptContext {
  int notify_fd = -1;
  bool accepted = false;  // told the parent; this process shakes hands and then ends or serves
  int slot = -1;          // its slot in g_handshakes
  bool turned_away = false;  // the last connection was closed before its handshake
  int64_t last_turned_away_s = 0;
};

void ReleaseHandshakeSlot(AcceptContext* c) {
  if (g_handshakes != nullptr && c->slot >= 0) g_handshakes->pid[c->slot].store(0);
  c->slot = -1;
}

bool OnAccepted(int fd, void* ctx) {
  auto* c = static_cast<AcceptContext*>(ctx);
  std::string who = "?";
  const uint64_t key = PeerKey(fd, &who);
  if (g_handshakes != nullptr) {
    int same = 0, busy = 0;
    for (int i = 0; i < kMaxHandshakes; ++i) {
      if (g_handshakes->pid[i].load() == 0) continue;
      ++busy;
      if (g_handshakes->peer[i].load() == key) ++same;
    }
    if (same >= kHandshakesPerPeer && busy >= kMaxHandshakes / 2) {
      const int64_t now = time(nullptr);
      if (now != c->last_turned_away_s) {  // at most a line a second
        c->last_turned_away_s = now;
        fprintf(stderr, "tfusion-worker: turned away a connection from %s: %d of its handshakes are under way, "
                "%d in all (at most %d per peer once %d are)\n", who.c_str(), same, busy, kHandshakesPerPeer,
                kMaxHandshakes / 2);
      }
      c->turned_away = true;
      return false;
    }
    // (Two spares counting at once, one handed over and its successor, may each let one more
    // in: the bound is a few, not exact.)
    for (int i = 0; i < kMaxHandshakes && c->slot < 0; ++i) {
      int32_t free_pid = 0;
      if (g_handshakes->pid[i].compare_exchange_strong(free_pid, static_cast<int32_t>(getpid()))) {
        g_handshakes->peer[i].store(key);
        c->slot = i;
      }
    }
  }
  c->accepted = true;
  Note(c->notify_fd, 'a');
  return true;
}

uint32_t SpinSessions(const WorkerOptions& o) {
  if (o.spin_sessions >= 0) return static_cast<uint32_t>(o.spin_sessions);
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  return cores >= 8 ? static_cast<uint32_t>(cores / 4) : 1;
}

// A session closes every listening socket it inherited (without unlinking the unix path, which
// belongs to the parent), so a restarted worker can bind again while old sessions run.
void CloseInheritedListeners(int keep_fd) {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return;
  std::set<int> fds;
  while (dirent* e = readdir(d)) {
    int fd = atoi(e->d_name);
    if (fd > 2 && fd != dirfd(d) && fd != keep_fd) fds.insert(fd);
  }
  closedir(d);
  for (int fd : fds) {
    int listening = 0;
    socklen_t len = sizeof(listening);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening) close(fd);
  }
}

// The spare: waits for one client, tells the parent, and becomes that client's session.
[[noreturn]] void SpareMain(const WorkerOptions& o,
                            std::vector<std::unique_ptr<transport::Listener>>& listeners,
                            const transport::TlsContext* tls, pid_t parent, int notify_fd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(0);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  transport::ServerPolicy policy;
  policy.token = reinterpret_cast<const uint8_t*>(o.token.data());
  policy.token_length = o.token.size();
  // A tenant program holds a session ticket (tfusion run --remote), never the token itself; it
  // names the ticket by its id and proves it knows the ticket's mac.
  policy.credential_key = [](const uint8_t* id, size_t n, transport::AuthKey* key, void* ctx) {
    const std::string mac = SessionTicketKey(*static_cast<const std::string*>(ctx),
                                             std::string(reinterpret_cast<const char*>(id), n),
                                             time(nullptr));
    if (mac.empty() || mac.size() > sizeof(key->bytes)) return false;
    memcpy(key->bytes, mac.data(), mac.size());
    key->length = mac.size();
    return true;
  };
  policy.credential_ctx = const_cast<std::string*>(&o.token);
  transport::TransportOptions topt;
  topt.tls_server = tls;
  topt.shm_spin_ns = o.spin_us * 1000u;
  topt.tcp_spin_ns = o.spin_us * 1000u;
  topt.spin_load = g_live_sessions;
  topt.spin_load_max = SpinSessions(o);
  AcceptContext accept_ctx;
  accept_ctx.notify_fd = notify_fd;
  topt.on_accept = &OnAccepted;
  topt.on_accept_ctx = &accept_ctx;
  const int slice_ms = listeners.size() > 1 ? 50 : 500;
  for (;;) {
    for (auto& l : listeners) {
      std::unique_ptr<transport::Transport> t;
      transport::ClientHello peer;
      transport::TransportStatus st = l->Accept(policy, topt, slice_ms, &t, &peer);
      if (st.code() == transport::TransportErrc::kTimeout && !accept_ctx.accepted) continue;
      if (!st.ok()) {
        if (accept_ctx.accepted) {  // its handshake failed
          fprintf(stderr, "tfusion-worker: %s: %s\n", l->address(), st.message());
          ReleaseHandshakeSlot(&accept_ctx);
          accept_ctx.accepted = false;
          // Still the spare the parent counts on: accept on. Else another one took over: end.
          if (g_handshakes == nullptr || g_handshakes->designated.load() != static_cast<int32_t>(getpid())) _exit(0);
          Note(notify_fd, 'f');
          continue;
        }
        if (!accept_ctx.turned_away) fprintf(stderr, "tfusion-worker: %s: %s\n", l->address(), st.message());
        accept_ctx.turned_away = false;  // said in OnAccepted
        continue;
      }
      ReleaseHandshakeSlot(&accept_ctx);
      Note(notify_fd, 's');
      close(notify_fd);
      CloseInheritedListeners(-1);
      fprintf(stderr, "tfusion-worker[%d]: session %llx for client pid %u on %.*s via %s\n",
              static_cast<int>(getpid()), static_cast<unsigned long long>(t->session().session_id),
              peer.client_pid, static_cast<int>(peer.host_id_length), peer.host_id,
              t->description());
      _exit(RunSession(o, std::move(t),
                       std::string(reinterpret_cast<const char*>(peer.credential_id),
                                   std::min<size_t>(peer.credential_id_length, sizeof(peer.credential_id)))));
    }
  }
}

std::atomic<bool> g_keeper_stop{false};
void OnKeeperStop(int) { g_keeper_stop.store(true); }

// The keeper process (WorkerOptions::keeper): closes the listeners it inherited, runs the hook.
[[noreturn]] void KeeperMain(const WorkerOptions& o, pid_t parent, int notify_fd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(0);
  struct sigaction sa = {};
  sa.sa_handler = &OnKeeperStop;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  close(notify_fd);
  CloseInheritedListeners(-1);
  o.keeper(g_keeper_stop);
  _exit(0);
}

}  // namespace

int RunWorker(const WorkerOptions& o) {
  if (o.listen.empty()) {
    fprintf(stderr, "tfusion worker: nothing to listen on (give --listen HOST:PORT or unix:/path)\n");
    return 2;
  }
  if (o.driver_path.empty()) {
    fprintf(stderr, "tfusion worker: no driver library given\n");
    return 2;
  }
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    fprintf(stderr, "tfusion worker: give --tls-cert and --tls-key together\n");
    return 2;
  }
  // Made once, before any session forks: every session serves TLS with it.
  std::shared_ptr<transport::TlsContext> tls;
  if (!o.tls_cert.empty()) {
    transport::TransportStatus st =
        transport::NewTlsServerContext(o.tls_cert.c_str(), o.tls_key.c_str(), &tls);
    if (!st.ok()) {
      fprintf(stderr, "tfusion worker: %s\n", st.message());
      return 2;
    }
  }
  std::vector<std::unique_ptr<transport::Listener>> listeners;
  std::string ready;
  for (const auto& addr : o.listen) {
    std::unique_ptr<transport::Listener> l;
    const bool is_unix = addr.rfind("unix:", 0) == 0;
    transport::TransportStatus st =
        is_unix ? transport::ListenShm(addr.c_str() + 5, &l) : transport::ListenTcp(addr.c_str(), &l);
    if (!st.ok()) {
      fprintf(stderr, "tfusion worker: cannot listen on %s: %s\n", addr.c_str(), st.message());
      return 2;
    }
    fprintf(stderr, "tfusion-worker: listening on %s%s%s\n", is_unix ? "unix:" : "", l->address(),
            !is_unix && tls ? " (TLS)" : "");
    ready += std::string(is_unix ? "unix " : "tcp ") + l->address() + "\n";
    listeners.push_back(std::move(l));
  }
  if (!o.ready_file.empty()) {
    std::string tmp = o.ready_file + ".tmp";
    if (FILE* f = fopen(tmp.c_str(), "w")) {
      fputs(ready.c_str(), f);
      fclose(f);
      rename(tmp.c_str(), o.ready_file.c_str());
    }
  }
  if (o.install_signal_handlers) {
    struct sigaction sa = {};
    sa.sa_handler = &OnStopSignal;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
  }
  signal(SIGPIPE, SIG_IGN);
  if (g_live_sessions == nullptr) {
    struct Shared {
      std::atomic<uint32_t> live_sessions;
      Handshakes handshakes;
    };
    void* page = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (page != MAP_FAILED) {  // else: always spin, and no limit per peer
      auto* shared = new (page) Shared{};
      g_live_sessions = &shared->live_sessions;
      g_handshakes = &shared->handshakes;
    }
  }
  if (g_live_sessions != nullptr) g_live_sessions->store(0);  // this run's sessions only
  if (g_handshakes != nullptr)
    for (auto& pid : g_handshakes->pid) pid.store(0);
  std::set<pid_t> sessions;
  std::set<pid_t> handshaking;  // spares that accepted a connection and shake hands
  int64_t spare_busy_since_ms = 0;  // the spare accepted a connection then; 0 = it waits
  const pid_t self = getpid();
  pid_t spare = 0;
  pid_t keeper = 0;
  int64_t keeper_started = 0;  // CLOCK_MONOTONIC s of its last start
  int64_t full_said = 0;       // when "every handshake slot is in use" was last said
  // One pipe from every spare to the parent (SpareNote messages).
  int notify[2] = {-1, -1};
  if (pipe2(notify, O_CLOEXEC) != 0) {
    fprintf(stderr, "tfusion worker: pipe: %s\n", strerror(errno));
    return 2;
  }
  fcntl(notify[0], F_SETFL, fcntl(notify[0], F_GETFL) | O_NONBLOCK);
  auto stopping = [&] { return g_signal_stop.load() || (o.stop && o.stop->load()); };
  auto monotonic_s = [] {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<int64_t>(ts.tv_sec);
  };
  auto monotonic_ms = [] {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1'000'000;
  };
  int64_t periodic_last = monotonic_s();
  while (!stopping()) {
    if (o.periodic && monotonic_s() - periodic_last >= o.periodic_s) {
      periodic_last = monotonic_s();
      o.periodic();
    }
    if (o.keeper && keeper == 0 && monotonic_s() - keeper_started >= 1) {
      keeper_started = monotonic_s();
      keeper = fork();
      if (keeper < 0) {
        fprintf(stderr, "tfusion worker: fork (zero keeper): %s\n", strerror(errno));
        keeper = 0;
      } else if (keeper == 0) {
        close(notify[1]);
        KeeperMain(o, self, notify[0]);
      }
    }
    if (spare == 0 && static_cast<int>(handshaking.size()) >= kMaxHandshakes && monotonic_s() != full_said) {
      full_said = monotonic_s();
      fprintf(stderr, "tfusion worker: all %d handshake slots are in use; new connections wait\n", kMaxHandshakes);
    }
    // A spare shaking hands for longer than kHandOverMs (a silent peer, a slow one) hands over:
    // the next spare is started, and it ends or becomes a session on its own.
    if (spare != 0 && spare_busy_since_ms != 0 && monotonic_ms() - spare_busy_since_ms >= kHandOverMs) {
      handshaking.insert(spare);
      spare = 0;
      spare_busy_since_ms = 0;
    }
    if (spare == 0 && static_cast<int>(handshaking.size()) < kMaxHandshakes) {
      spare = fork();
      if (spare < 0) {
        fprintf(stderr, "tfusion worker: fork: %s\n", strerror(errno));
        spare = 0;
        sleep(1);
        continue;
      }
      if (spare == 0) {
        close(notify[0]);
        SpareMain(o, listeners, tls.get(), self, notify[1]);
      }
      if (g_handshakes != nullptr) g_handshakes->designated.store(static_cast<int32_t>(spare));
    }
    pollfd p{notify[0], POLLIN, 0};
    const int wait_ms = spare_busy_since_ms != 0
        ? static_cast<int>(std::clamp<int64_t>(kHandOverMs - (monotonic_ms() - spare_busy_since_ms), 1, kHandOverMs))
        : 200;
    if (poll(&p, 1, wait_ms) > 0) {
      SpareNote note;
      while (read(notify[0], &note, sizeof(note)) == static_cast<ssize_t>(sizeof(note))) {
        if (note.what == 'a' && note.pid == spare) {  // shaking hands: handed over if it takes long
          spare_busy_since_ms = monotonic_ms();
        } else if (note.what == 'f' && note.pid == spare) {  // failed; it accepts on
          spare_busy_since_ms = 0;
        } else if (note.what == 'f') {  // handed over already, and another spare accepts: end it
          kill(note.pid, SIGKILL);
        } else if (note.what == 's') {  // became a session
          if (note.pid == spare) {
            spare = 0;
            spare_busy_since_ms = 0;
          } else if (handshaking.erase(note.pid) == 0) {
            continue;  // reaped already
          }
          if (sessions.insert(note.pid).second && g_live_sessions != nullptr) g_live_sessions->fetch_add(1);
        }
      }
    }
    int status;
    pid_t dead;
    while ((dead = waitpid(-1, &status, WNOHANG)) > 0) {
      if (g_handshakes != nullptr) {  // a spare killed while shaking hands frees its slot
        for (auto& pid : g_handshakes->pid) {
          int32_t was = static_cast<int32_t>(dead);
          pid.compare_exchange_strong(was, 0);
        }
      }
      const bool was_session = sessions.count(dead) != 0;
      handshaking.erase(dead);
      if (dead == spare) {
        spare = 0;
        spare_busy_since_ms = 0;
      }
      if (dead == keeper) {
        keeper = 0;
        fprintf(stderr, "tfusion worker: the zero keeper (pid %d) ended (%s %d); starting another\n",
                static_cast<int>(dead), WIFSIGNALED(status) ? "signal" : "status",
                WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
        continue;
      }
      if (sessions.erase(dead) != 0 && g_live_sessions != nullptr) g_live_sessions->fetch_sub(1);
      // A spare that never became a session made nothing to clean up (a flood of connections
      // that close at once would otherwise cost a scan of every region each). One whose note
      // came too late is swept by `periodic`.
      if (was_session && o.session_ended) o.session_ended(dead);
    }
  }
  // Reaps `pid` if it ends within `seconds` (or was already reaped); false if it is still running.
  auto reaped_within = [&](pid_t pid, int64_t seconds) {
    const int64_t deadline = monotonic_s() + seconds;
    for (;;) {
      const pid_t r = waitpid(pid, nullptr, WNOHANG);
      if (r == pid || (r < 0 && errno == ECHILD)) return true;
      if (monotonic_s() >= deadline) return false;
      usleep(20'000);
    }
  };
  // No new clients from here: the listeners close at once (a unix socket's name goes), and the
  // spare, which accepts on copies of them, is killed, not left to take a client while the keeper
  // and the sessions are waited for below.
  for (auto& l : listeners) l->Close();
  if (spare > 0) kill(spare, SIGKILL);
  for (pid_t h : handshaking) kill(h, SIGKILL);
  if (keeper > 0) {
    kill(keeper, SIGTERM);  // it stops between two scans (a checkpoint under way finishes first)
    if (!reaped_within(keeper, 5)) {
      kill(keeper, SIGKILL);
      if (!reaped_within(keeper, 10)) {
        fprintf(stderr, "tfusion worker: the zero keeper (pid %d) did not end\n", static_cast<int>(keeper));
      }
    }
  }
  // Stopping the worker ends its sessions (they would die with it anyway: PR_SET_PDEATHSIG), and
  // the spare, which may have become one as the worker stopped. Each is waited for up to
  // kStopWaitS, so that what it leaves behind (its vGPU) is cleaned up as when it ends alone; one
  // the driver takes longer to tear down is left to exit on its own, and the worker says so.
  constexpr int64_t kStopWaitS = 10;
  std::set<pid_t> ending = sessions;
  if (spare > 0) ending.insert(spare);
  ending.insert(handshaking.begin(), handshaking.end());
  for (pid_t s : ending) kill(s, SIGKILL);
  // All were killed at once: each gets what is left of the same kStopWaitS.
  const int64_t stop_deadline = monotonic_s() + kStopWaitS;
  for (auto it = ending.begin(); it != ending.end();) {
    if (reaped_within(*it, std::max<int64_t>(0, stop_deadline - monotonic_s()))) {
      if (o.session_ended) o.session_ended(*it);
      it = ending.erase(it);
    } else {
      ++it;
    }
  }
  for (pid_t s : ending) {
    fprintf(stderr, "tfusion worker: session %d did not end within %lld s of being killed; its vGPU stays\n",
            static_cast<int>(s), static_cast<long long>(kStopWaitS));
  }
  if (g_live_sessions != nullptr) g_live_sessions->store(0);
  close(notify[0]);
  close(notify[1]);
  for (pid_t dead; (dead = waitpid(-1, nullptr, WNOHANG)) > 0;) {
    if (ending.count(dead) != 0 && o.session_ended) o.session_ended(dead);  // one that just made it
  }
  return 0;
}

}  // namespace tf::worker
