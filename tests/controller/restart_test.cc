// kill -9 of a controller on the embedded store: nothing acknowledged is lost.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <set>
#include <thread>
#include <vector>

#include "controller/sqlite_store.h"
#include "test_cluster.h"

namespace tf::controller {
namespace {

// A child controller allocates from `threads` threads (their commits group-committed together)
// and reports every acknowledged id; it is killed with SIGKILL mid-stream. Every acknowledged
// allocation must be in the store, and GPU usage must agree with the allocations exactly.
void KillNineDuringAllocations(int threads, SqliteDurability durability) {
  testing::TempDir dir;
  const std::string db = dir.path() + "/state.db";
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: a controller that allocates as fast as it can and reports each acknowledged id.
    close(fds[0]);
    SystemClock clock;
    auto store = std::move(SqliteStore::Open(db, durability)).value();
    Controller c(store.get(), &clock, MakeSchedulerPlacement(), nullptr);
    if (!c.Rebuild().ok()) _exit(3);
    testing::AddNodes(c, 4, 8);
    auto loop = [&] {
      for (;;) {
        auto a = c.Allocate({"", "", 0.5, 16, 1, "", ""});
        if (!a.ok()) _exit(4);
        std::string line = a->id + "\n";  // < PIPE_BUF: one atomic write per id
        if (write(fds[1], line.data(), line.size()) != static_cast<ssize_t>(line.size())) _exit(5);
      }
    };
    std::vector<std::thread> ts;
    for (int t = 1; t < threads; ++t) ts.emplace_back(loop);
    loop();
  }
  close(fds[1]);
  std::set<std::string> acked;
  std::string buf;
  char chunk[256];
  while (acked.size() < 300) {
    ssize_t n = read(fds[0], chunk, sizeof chunk);
    ASSERT_GT(n, 0) << "child died early";
    buf.append(chunk, n);
    size_t nl;
    while ((nl = buf.find('\n')) != std::string::npos) {
      acked.insert(buf.substr(0, nl));
      buf.erase(0, nl + 1);
    }
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  close(fds[0]);

  FakeClock clock;
  auto store = std::move(SqliteStore::Open(db)).value();
  Controller c(store.get(), &clock, MakeSchedulerPlacement(), nullptr);
  ASSERT_TRUE(c.Rebuild().ok());
  std::set<std::string> stored;
  MilliTflops used = 0;
  for (const Allocation& a : c.ListAllocations()) {
    stored.insert(a.id);
    for (const Vgpu& v : a.vgpus) used += v.milli_tflops;
  }
  for (const std::string& id : acked) EXPECT_TRUE(stored.count(id)) << id << " was acknowledged but lost";
  MilliTflops gpu_used = 0;
  for (const GpuStatus& g : c.ListGpus("")) {
    gpu_used += g.gpu.used_milli_tflops;
    EXPECT_LE(g.gpu.used_milli_tflops, g.gpu.milli_tflops);
  }
  EXPECT_EQ(gpu_used, used);  // GPU usage agrees with the allocations exactly
}

TEST(SqliteRestart, KillNineLosesNoAcknowledgedAllocation) {
  KillNineDuringAllocations(1, SqliteDurability::kPower);
}

TEST(SqliteRestart, KillNineDuringGroupCommitsLosesNoAcknowledgedAllocation) {
  KillNineDuringAllocations(6, SqliteDurability::kPower);
}

// Durability "process" (synchronous=NORMAL) gives up power loss, not a crash of the process: the
// WAL frames of an acknowledged batch are in the kernel when it is acknowledged.
TEST(SqliteRestart, ProcessDurabilityKillNineLosesNoAcknowledgedAllocation) {
  KillNineDuringAllocations(1, SqliteDurability::kProcess);
}

TEST(SqliteRestart, ProcessDurabilityKillNineDuringGroupCommitsLosesNoAcknowledgedAllocation) {
  KillNineDuringAllocations(6, SqliteDurability::kProcess);
}

TEST(SqliteDurability, OnlyPowerOrProcessAndProcessOnlyForSqlite) {
  EXPECT_EQ(*ParseSqliteDurability("power"), SqliteDurability::kPower);
  EXPECT_EQ(*ParseSqliteDurability("process"), SqliteDurability::kProcess);
  auto bad = ParseSqliteDurability("fast");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'power'"), std::string::npos);
  EXPECT_EQ(OpenStore("etcd:http://127.0.0.1:1", "process").status().code(), StatusCode::kInvalidArgument);
  testing::TempDir dir;
  auto s = OpenStore("sqlite:" + dir.path() + "/s.db", "process");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(static_cast<SqliteStore*>(s->get())->durability(), SqliteDurability::kProcess);
}

}  // namespace
}  // namespace tf::controller
