#include "scenario.h"

#include <charconv>
#include <map>
#include <sstream>
#include <vector>

#include "common/gpu_catalog.h"
#include "scheduler/scheduler.h"
#include "scheduler/workload_queue.h"

namespace tf::sched {
namespace {

struct Line {
  std::vector<std::string> words;            // positional
  std::map<std::string, std::string> flags;  // key=value
};

Line Parse(const std::string& text) {
  Line l;
  std::istringstream in(text);
  std::string w;
  while (in >> w) {
    size_t eq = w.find('=');
    if (eq == std::string::npos) {
      l.words.push_back(w);
    } else {
      l.flags[w.substr(0, eq)] = w.substr(eq + 1);
    }
  }
  return l;
}

bool Num(const std::string& s, double* out) {
  auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

class Interpreter {
 public:
  Status Run(const std::string& text) {
    std::istringstream in(text);
    std::string raw;
    int line_no = 0;
    while (std::getline(in, raw)) {
      ++line_no;
      size_t hash = raw.find('#');
      if (hash != std::string::npos) raw.resize(hash);
      Line l = Parse(raw);
      if (l.words.empty()) continue;
      Status s = Exec(l);
      if (!s.ok()) return Status(s.code(), "line " + std::to_string(line_no) + ": " + raw + "\n  " + s.message());
    }
    return Status::Ok();
  }

 private:
  Status Get(const Line& l, const std::string& key, double* v, bool required) {
    auto it = l.flags.find(key);
    if (it == l.flags.end()) {
      return required ? InvalidArgument("missing " + key + "=") : Status::Ok();
    }
    if (!Num(it->second, v)) return InvalidArgument("bad number for " + key + ": " + it->second);
    return Status::Ok();
  }

  Status Exec(const Line& l) {
    const auto& w = l.words;
    auto is = [&](std::initializer_list<const char*> prefix) {
      if (w.size() < prefix.size()) return false;
      size_t i = 0;
      for (const char* p : prefix) {
        if (w[i++] != p) return false;
      }
      return true;
    };
    if (is({"pool", "add"}) && w.size() == 3) {
      PoolSpec p{w[2], 1.0, PlacementMode::kNodeCompactGpuLowLoad};
      TF_RETURN_IF_ERROR(Get(l, "oversell", &p.tflops_oversell_ratio, false));
      if (l.flags.count("mode")) {
        auto m = ParsePlacementMode(l.flags.at("mode"));
        if (!m.ok()) return m.status();
        p.mode = *m;
      }
      return scheduler_.AddPool(p);
    }
    if (is({"node", "add"}) && w.size() == 3) {
      NodeSpec n;
      n.name = w[2];
      n.pool = l.flags.count("pool") ? l.flags.at("pool") : scheduler_.state().pools().empty() ? "" : scheduler_.state().pools()[0].name;
      double gpus = 0, tflops = 0, vram = 0, cpu = 0, mem = 0;
      TF_RETURN_IF_ERROR(Get(l, "gpus", &gpus, true));
      TF_RETURN_IF_ERROR(Get(l, "tflops", &tflops, false));
      TF_RETURN_IF_ERROR(Get(l, "vram", &vram, false));
      TF_RETURN_IF_ERROR(Get(l, "cpu", &cpu, false));
      TF_RETURN_IF_ERROR(Get(l, "mem", &mem, false));
      std::string model = l.flags.count("model") ? l.flags.at("model") : "";
      if (model.empty()) return InvalidArgument("missing model=");
      if (tflops == 0 || vram == 0) {
        auto spec = catalog_.Lookup(model);
        if (!spec.ok()) return spec.status();
        if (tflops == 0) tflops = spec->fp16_tflops;
        if (vram == 0) vram = static_cast<double>(spec->vram_mib);
        model = spec->name;
      }
      n.cpu_milli = static_cast<int64_t>(cpu);
      n.memory_mib = static_cast<int64_t>(mem);
      uint64_t all = gpus >= 64 ? ~uint64_t{0} : (uint64_t{1} << static_cast<int>(gpus)) - 1;
      bool nvlink = l.flags.count("nvlink") && l.flags.at("nvlink") == "all";
      for (int i = 0; i < static_cast<int>(gpus); ++i) {
        n.gpus.push_back(GpuSpec{model, tflops, static_cast<int64_t>(vram), i < gpus / 2 ? 0 : 1, nvlink ? all : 0});
      }
      TF_RETURN_IF_ERROR(scheduler_.AddNode(n));
      queue_.Retry();
      return Status::Ok();
    }
    if (is({"quota"}) && w.size() == 2) {
      TenantQuota q;
      double gpus = 0, vram = 0;
      TF_RETURN_IF_ERROR(Get(l, "tflops", &q.max_tflops, false));
      TF_RETURN_IF_ERROR(Get(l, "vram", &vram, false));
      TF_RETURN_IF_ERROR(Get(l, "gpus", &gpus, false));
      q.max_vram_mib = static_cast<int64_t>(vram);
      q.max_gpus = static_cast<int>(gpus);
      scheduler_.SetTenantQuota(w[1], q);
      queue_.Retry();
      return Status::Ok();
    }
    if (is({"submit"}) && w.size() >= 2) {
      Request r;
      r.id = w[1];
      r.tenant = l.flags.count("tenant") ? l.flags.at("tenant") : "default";
      r.pool = l.flags.count("pool") ? l.flags.at("pool") : "";
      double vram = 0, vram_limit = 0, gpus = 1, cpu = 0;
      TF_RETURN_IF_ERROR(Get(l, "tflops", &r.tflops_request, false));
      TF_RETURN_IF_ERROR(Get(l, "percent", &r.compute_percent_request, false));
      TF_RETURN_IF_ERROR(Get(l, "vram", &vram, false));
      TF_RETURN_IF_ERROR(Get(l, "vram_limit", &vram_limit, false));
      TF_RETURN_IF_ERROR(Get(l, "gpus", &gpus, false));
      TF_RETURN_IF_ERROR(Get(l, "cpu", &cpu, false));
      r.vram_request_mib = static_cast<int64_t>(vram);
      r.vram_limit_mib = static_cast<int64_t>(vram_limit);
      r.gpu_count = static_cast<int>(gpus);
      r.cpu_milli = static_cast<int64_t>(cpu);
      if (l.flags.count("qos")) {
        auto q = ParseQos(l.flags.at("qos"));
        if (!q.ok()) return q.status();
        r.qos = *q;
      }
      if (l.flags.count("models")) {
        std::istringstream ms(l.flags.at("models"));
        std::string m;
        while (std::getline(ms, m, '|')) {
          auto spec = catalog_.Lookup(m);
          r.gpu_models.push_back(spec.ok() ? spec->name : m);
        }
      }
      for (size_t i = 2; i < w.size(); ++i) {
        if (w[i] == "remote") {
          r.remote = true;
        } else {
          return InvalidArgument("unknown submit word '" + w[i] + "'");
        }
      }
      Status s = queue_.Submit(r);
      if (!s.ok()) rejected_[r.id] = s;
      return Status::Ok();
    }
    if (is({"release"}) && w.size() == 2) return queue_.Release(w[1]);
    if (is({"fail", "node"}) && w.size() == 3) return queue_.FailNode(w[2]);
    if (is({"expect", "placement"}) && w.size() == 3) {
      const WorkloadStatus* st = queue_.status(w[2]);
      if (st == nullptr || st->phase != WorkloadPhase::kRunning) {
        return FailedPrecondition("expected '" + w[2] + "' to be placed; it is " + Describe(w[2]));
      }
      if (l.flags.count("node") && st->node != l.flags.at("node")) {
        return FailedPrecondition("expected '" + w[2] + "' on " + l.flags.at("node") + ", it is on " + st->node);
      }
      if (l.flags.count("gpus")) {
        const Allocation* a = scheduler_.state().FindAllocation(w[2]);
        std::string got;
        for (int g : a->placement.gpus) got += (got.empty() ? "" : ",") + std::to_string(g);
        if (got != l.flags.at("gpus")) {
          return FailedPrecondition("expected '" + w[2] + "' on GPUs " + l.flags.at("gpus") + ", got " + got);
        }
      }
      return Status::Ok();
    }
    if (is({"expect", "pending"}) && w.size() == 3) {
      const WorkloadStatus* st = queue_.status(w[2]);
      if (st == nullptr || st->phase != WorkloadPhase::kPending) {
        return FailedPrecondition("expected '" + w[2] + "' to be pending; it is " + Describe(w[2]));
      }
      return Status::Ok();
    }
    if (is({"expect", "preempted"}) && w.size() == 3) {
      const WorkloadStatus* st = queue_.status(w[2]);
      if (st == nullptr || st->times_preempted == 0) {
        return FailedPrecondition("expected '" + w[2] + "' to have been preempted; it is " + Describe(w[2]));
      }
      return Status::Ok();
    }
    if (is({"expect", "rejected"}) && (w.size() == 3 || w.size() == 4)) {
      auto it = rejected_.find(w[2]);
      if (it == rejected_.end()) return FailedPrecondition("expected '" + w[2] + "' to be rejected");
      if (w.size() == 4 && StatusCodeName(it->second.code()) != w[3]) {
        return FailedPrecondition("expected rejection " + w[3] + ", got " + it->second.ToString());
      }
      return Status::Ok();
    }
    if (is({"expect", "free"}) && w.size() == 3) {
      double want = 0;
      TF_RETURN_IF_ERROR(Get(l, "tflops", &want, true));
      NodeId id = scheduler_.state().NodeIndex(w[2]);
      if (id < 0) return NotFound("no node " + w[2]);
      const NodeState& n = scheduler_.state().node(id);
      double got = ToTflops(n.schedulable_sum - n.used_sum);
      if (std::abs(got - want) > 1e-6) {
        return FailedPrecondition("expected " + std::to_string(want) + " TFLOPS free on " + w[2] + ", got " + std::to_string(got));
      }
      return Status::Ok();
    }
    return InvalidArgument("unknown command");
  }

  std::string Describe(const std::string& id) const {
    if (rejected_.count(id)) return "rejected (" + rejected_.at(id).ToString() + ")";
    const WorkloadStatus* st = queue_.status(id);
    if (st == nullptr) return "unknown";
    if (st->phase == WorkloadPhase::kRunning) return "running on " + st->node;
    return "pending (" + st->last_reason + ")";
  }

  GpuCatalog catalog_;
  Scheduler scheduler_;
  WorkloadQueue queue_{&scheduler_};
  std::map<std::string, Status> rejected_;
};

}  // namespace

Status RunScenario(const std::string& text) {
  Interpreter in;
  return in.Run(text);
}

}  // namespace tf::sched
