#include "sim/openb_trace.h"

#include <charconv>
#include <fstream>
#include <sstream>

#include "scheduler/scheduler.h"

namespace tf::sim {
namespace {

std::vector<std::string> SplitCsv(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : line) {
    if (c == ',') {
      out.push_back(cur);
      cur.clear();
    } else if (c != '\r') {
      cur.push_back(c);
    }
  }
  out.push_back(cur);
  return out;
}

bool ToInt(const std::string& s, int64_t* v) {
  if (s.empty()) {
    *v = 0;
    return true;
  }
  auto r = std::from_chars(s.data(), s.data() + s.size(), *v);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

// Rows with `columns` fields, or with `short_columns` fields padded with empty ones (the
// multigpuNN files carry only name, cpu_milli, memory_mib, num_gpu, gpu_milli).
StatusOr<std::vector<std::vector<std::string>>> ReadCsv(const std::string& path, size_t columns,
                                                       size_t short_columns) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot open trace file '" + path + "'");
  std::string line;
  std::getline(in, line);  // header
  std::vector<std::vector<std::string>> rows;
  int line_no = 1;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty() || line == "\r") continue;
    auto f = SplitCsv(line);
    if (f.size() == short_columns) f.resize(columns);
    if (f.size() != columns) {
      return InvalidArgument(path + ":" + std::to_string(line_no) + ": expected " + std::to_string(columns) +
                             " columns, got " + std::to_string(f.size()));
    }
    rows.push_back(std::move(f));
  }
  return rows;
}

}  // namespace

StatusOr<std::vector<TraceNode>> LoadNodes(const std::string& path) {
  auto rows = ReadCsv(path, 5, 5);
  if (!rows.ok()) return rows.status();
  std::vector<TraceNode> out;
  for (const auto& f : *rows) {
    TraceNode n;
    n.name = f[0];
    int64_t gpus = 0;
    if (!ToInt(f[1], &n.cpu_milli) || !ToInt(f[2], &n.memory_mib) || !ToInt(f[3], &gpus)) {
      return InvalidArgument(path + ": bad number in node '" + f[0] + "'");
    }
    n.gpus = static_cast<int>(gpus);
    n.model = f[4];
    out.push_back(std::move(n));
  }
  return out;
}

StatusOr<std::vector<TracePod>> LoadPods(const std::string& path) {
  auto rows = ReadCsv(path, 11, 5);
  if (!rows.ok()) return rows.status();
  std::vector<TracePod> out;
  for (const auto& f : *rows) {
    TracePod p;
    p.name = f[0];
    int64_t num_gpu = 0;
    if (!ToInt(f[1], &p.cpu_milli) || !ToInt(f[2], &p.memory_mib) || !ToInt(f[3], &num_gpu) ||
        !ToInt(f[4], &p.gpu_milli) || !ToInt(f[8], &p.creation_time) || !ToInt(f[9], &p.deletion_time)) {
      return InvalidArgument(path + ": bad number in pod '" + f[0] + "'");
    }
    p.num_gpu = static_cast<int>(num_gpu);
    if (p.num_gpu == 0) p.gpu_milli = 0;
    std::stringstream spec(f[5]);
    std::string model;
    while (std::getline(spec, model, '|')) {
      if (!model.empty()) p.gpu_spec.push_back(model);
    }
    p.qos = f[6];
    out.push_back(std::move(p));
  }
  return out;
}

Status BuildCluster(const std::vector<TraceNode>& nodes, const std::vector<TracePod>& pods,
                    sched::PlacementMode mode, sched::Scheduler* s, int replicate_to) {
  TF_RETURN_IF_ERROR(s->AddPool(sched::PoolSpec{"openb", 1.0, mode}));
  std::vector<const TraceNode*> gpu_nodes;
  for (const TraceNode& n : nodes) {
    if (n.gpus > 0) gpu_nodes.push_back(&n);
  }
  size_t total = replicate_to > 0 ? static_cast<size_t>(replicate_to) : gpu_nodes.size();
  for (size_t i = 0; i < total && !gpu_nodes.empty(); ++i) {
    const TraceNode& n = *gpu_nodes[i % gpu_nodes.size()];
    sched::NodeSpec spec;
    spec.name = i < gpu_nodes.size() ? n.name : n.name + "-r" + std::to_string(i / gpu_nodes.size());
    spec.pool = "openb";
    spec.cpu_milli = n.cpu_milli;
    spec.memory_mib = n.memory_mib;
    for (int g = 0; g < n.gpus; ++g) {
      sched::GpuSpec gpu;
      gpu.model = n.model;
      gpu.tflops = kSimGpuTflops;
      gpu.vram_mib = kSimGpuVramMib;
      spec.gpus.push_back(gpu);
    }
    TF_RETURN_IF_ERROR(s->AddNode(spec));
  }
  s->SetWorkloadMix(MixOf(pods, s->state()));
  return Status::Ok();
}

sched::Qos ToQos(const std::string& q) {
  if (q == "Guaranteed") return sched::Qos::kCritical;
  if (q == "LS") return sched::Qos::kHigh;
  if (q == "Burstable") return sched::Qos::kMedium;
  return sched::Qos::kLow;  // BE
}

sched::Request ToRequest(const TracePod& p, const std::string& id) {
  sched::Request r;
  r.id = id;
  r.tenant = "openb";
  r.pool = "openb";
  r.gpu_count = p.num_gpu;
  if (p.num_gpu > 0) r.tflops_request = static_cast<double>(p.gpu_milli);
  r.cpu_milli = p.cpu_milli;
  r.memory_mib = p.memory_mib;
  r.gpu_models = p.gpu_spec;
  r.qos = ToQos(p.qos);
  return r;
}

sched::WorkloadMix MixOf(const std::vector<TracePod>& pods, const sched::ClusterState& state) {
  std::vector<sched::WorkloadShape> shapes;
  for (const TracePod& p : pods) {
    sched::WorkloadShape s;
    s.weight = 1;
    s.gpu_count = p.num_gpu;
    s.gpu_milli = p.num_gpu > 0 ? p.gpu_milli : 0;
    s.cpu_milli = p.cpu_milli;
    s.model_mask = state.ModelMask(p.gpu_spec);
    shapes.push_back(s);
  }
  return sched::WorkloadMix(std::move(shapes));
}

}  // namespace tf::sim
