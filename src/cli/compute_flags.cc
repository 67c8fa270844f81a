#include "cli/compute_flags.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "cli/quantity.h"
#include "controller/model.h"

namespace tf::cli {
namespace {

constexpr double kWholeGpuPpm = 1'000'000;

// "--percent 30" / "--tflops 100": a flag as the user typed it, for messages.
std::string Typed(const char* flag, const std::string& value) { return std::string(flag) + " " + value; }

const char* RequestFlag(const ComputeFlags& f) { return f.tflops.empty() ? "--percent" : "--tflops"; }
const std::string& RequestValue(const ComputeFlags& f) { return f.tflops.empty() ? f.percent : f.tflops; }
const char* LimitFlag(const ComputeFlags& f) { return f.tflops_limit.empty() ? "--percent-limit" : "--tflops-limit"; }
const std::string& LimitValue(const ComputeFlags& f) { return f.tflops_limit.empty() ? f.percent_limit : f.tflops_limit; }

Status LimitBelowRequest(const ComputeFlags& f, const std::string& request_detail) {
  return InvalidArgument(Typed(LimitFlag(f), LimitValue(f)) + " is below the request " +
                         Typed(RequestFlag(f), RequestValue(f)) + request_detail +
                         ": the limit is the ceiling and must be at least the request");
}

// `value` TFLOPS of `flag` as a share of `gpu`, in ppm (at least 1).
StatusOr<uint64_t> TflopsPpm(const char* flag, const std::string& text, double value, const GpuForShares& gpu) {
  if (gpu.capacity_tflops <= 0) {
    return InvalidArgument("GPU model '" + gpu.name + "' is not in the catalog: use --percent and " +
                           "--percent-limit, or add it with TFUSION_CATALOG_OVERRIDES");
  }
  StatusOr<double> share = ShareFromTflops(value, gpu.capacity_tflops);
  if (!share.ok()) {
    char buf[200];
    std::snprintf(buf, sizeof(buf), "%s %s: GPU %d (%s) has %.1f TFLOPS", flag, text.c_str(), gpu.index,
                  gpu.name.c_str(), gpu.capacity_tflops);
    return InvalidArgument(buf);
  }
  uint64_t ppm = static_cast<uint64_t>(std::llround(*share * kWholeGpuPpm));
  return ppm == 0 ? 1 : ppm;
}

// At least 1 part per million, as TflopsPpm: a positive share that rounds to nothing is the least
// one (0 would be refused by the region as no share at all).
uint64_t PercentPpm(double percent) {
  const uint64_t ppm = static_cast<uint64_t>(std::llround(percent * 10'000));
  return ppm == 0 ? 1 : ppm;
}

}  // namespace

Status CheckComputeFlags(const ComputeFlags& f) {
  if (!f.tflops.empty() && !f.percent.empty()) return InvalidArgument("give either --tflops or --percent, not both");
  if (!f.tflops_limit.empty() && !f.percent_limit.empty())
    return InvalidArgument("give either --tflops-limit or --percent-limit, not both");
  if (!f.tflops.empty()) TF_RETURN_IF_ERROR(ParsePositive("--tflops", f.tflops).status());
  if (!f.percent.empty()) TF_RETURN_IF_ERROR(ParsePositive("--percent", f.percent, 100).status());
  if (!f.tflops_limit.empty()) TF_RETURN_IF_ERROR(ParsePositive("--tflops-limit", f.tflops_limit).status());
  if (!f.percent_limit.empty()) TF_RETURN_IF_ERROR(ParsePositive("--percent-limit", f.percent_limit, 100).status());
  const bool request = !f.tflops.empty() || !f.percent.empty();
  const bool limit = !f.tflops_limit.empty() || !f.percent_limit.empty();
  if (limit && !request) {
    return InvalidArgument(Typed(LimitFlag(f), LimitValue(f)) +
                           " needs a request: give --percent or --tflops too (the guaranteed share; "
                           "the limit is the ceiling above it)");
  }
  const bool same_unit = (!f.tflops.empty() && !f.tflops_limit.empty()) || (!f.percent.empty() && !f.percent_limit.empty());
  if (limit && same_unit && std::strtod(LimitValue(f).c_str(), nullptr) < std::strtod(RequestValue(f).c_str(), nullptr))
    return LimitBelowRequest(f, "");
  return Status::Ok();
}

StatusOr<ComputeShares> ResolveComputeShares(const ComputeFlags& f, const GpuForShares& gpu) {
  TF_RETURN_IF_ERROR(CheckComputeFlags(f));
  ComputeShares s;
  if (!f.percent.empty()) s.request_ppm = PercentPpm(std::strtod(f.percent.c_str(), nullptr));
  if (!f.tflops.empty()) {
    StatusOr<uint64_t> ppm = TflopsPpm("--tflops", f.tflops, std::strtod(f.tflops.c_str(), nullptr), gpu);
    if (!ppm.ok()) return ppm.status();
    s.request_ppm = *ppm;
  }
  s.limit_ppm = s.request_ppm;
  if (!f.percent_limit.empty()) s.limit_ppm = PercentPpm(std::strtod(f.percent_limit.c_str(), nullptr));
  if (!f.tflops_limit.empty()) {
    StatusOr<uint64_t> ppm =
        TflopsPpm("--tflops-limit", f.tflops_limit, std::strtod(f.tflops_limit.c_str(), nullptr), gpu);
    if (!ppm.ok()) return ppm.status();
    s.limit_ppm = *ppm;
  }
  if (s.limit_ppm < s.request_ppm) {
    // Only reachable with mixed units: say what the request is in the limit's unit.
    char detail[160];
    if (!f.tflops.empty()) {
      std::snprintf(detail, sizeof(detail), " (%.1f%% of GPU %d, %s)", s.request_ppm / 10'000.0, gpu.index,
                    gpu.name.c_str());
    } else {
      std::snprintf(detail, sizeof(detail), " (%.1f TFLOPS of GPU %d, %s)",
                    s.request_ppm / kWholeGpuPpm * gpu.capacity_tflops, gpu.index, gpu.name.c_str());
    }
    return LimitBelowRequest(f, detail);
  }
  return s;
}

StatusOr<PoolCompute> PoolComputeFromFlags(const ComputeFlags& f) {
  TF_RETURN_IF_ERROR(CheckComputeFlags(f));
  if ((!f.tflops.empty() && !f.percent_limit.empty()) || (!f.percent.empty() && !f.tflops_limit.empty())) {
    return InvalidArgument("give the limit in the request's unit when the pool places the vGPU (" +
                           Typed(RequestFlag(f), RequestValue(f)) + " with " +
                           (f.tflops.empty() ? "--tflops-limit" : "--percent-limit") +
                           "): the GPU, and so the conversion, is known only after placement");
  }
  PoolCompute c;
  if (!f.tflops.empty()) {
    c.tflops = std::strtod(f.tflops.c_str(), nullptr);
    if (!f.tflops_limit.empty()) c.tflops_limit = std::strtod(f.tflops_limit.c_str(), nullptr);
  } else {
    c.percent = f.percent.empty() ? 100.0 : std::strtod(f.percent.c_str(), nullptr);
    if (!f.percent_limit.empty()) c.percent_limit = std::strtod(f.percent_limit.c_str(), nullptr);
  }
  return c;
}

Status CheckRemoteComputeFlags(const ComputeFlags& f, const std::string& qos) {
  TF_RETURN_IF_ERROR(CheckComputeFlags(f));
  return ParseQosFlag(qos).status();
}

StatusOr<uint32_t> ParseQosFlag(const std::string& text) {
  if (text.empty()) return static_cast<uint32_t>(controller::Qos::kMedium);
  StatusOr<controller::Qos> q = controller::ParseQos(text);
  if (!q.ok()) return InvalidArgument("--qos: " + q.status().message());
  return static_cast<uint32_t>(*q);
}

StatusOr<GpuCatalog> LoadCatalog() {
  GpuCatalog catalog;
  const char* file = std::getenv("TFUSION_CATALOG_OVERRIDES");
  if (file == nullptr || *file == '\0') return catalog;
  FILE* in = std::fopen(file, "r");
  if (in == nullptr) return InvalidArgument(std::string("TFUSION_CATALOG_OVERRIDES: cannot read ") + file);
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), in)) > 0) text.append(buf, n);
  std::fclose(in);
  TF_RETURN_IF_ERROR(catalog.LoadOverrides(text));
  return catalog;
}

}  // namespace tf::cli
