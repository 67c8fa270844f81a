// GpuCatalog: GPU model name -> FP16 dense tensor TFLOPS, VRAM (MiB) and SM count.
//
// Compute in TensorFusion is counted in TFLOPS of FP16 dense tensor throughput (DESIGN.md,
// "Units"). A GPU's capacity comes from this catalog, looked up by the device name that NVML or
// CUDA reports ("NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-32GB"), and may be overridden per
// deployment with a small text format (LoadOverrides).
//
// This file is linked into data-plane libraries built with -fno-exceptions: it throws nothing and
// parses numbers with std::from_chars.
//
// Thread safety: a GpuCatalog is a value; const methods may run concurrently, LoadOverrides may not
// run concurrently with anything else on the same object.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace tf {

struct GpuModelSpec {
  std::string name;         // canonical model name, e.g. "H100-SXM", "A100-80GB"
  double fp16_tflops = 0;   // FP16 dense tensor TFLOPS (no sparsity)
  int64_t vram_mib = 0;     // nominal VRAM in MiB (marketing GB x 1024)
  int sm_count = 0;         // streaming multiprocessors; 0 when unknown (overrides)
};

class GpuCatalog {
 public:
  // A catalog holding the built-in models and no overrides.
  GpuCatalog();

  // Finds the spec for an NVML/CUDA device name or a canonical model name. Matching is
  // case-insensitive and token based (the name is split on anything that is not a letter or
  // digit): overrides are tried first (case-insensitive substring, longest substring first), then
  // built-in rules, most specific first ("A100 + 80GB" before "A100"). Returns kNotFound with the
  // name when nothing matches.
  StatusOr<GpuModelSpec> Lookup(std::string_view device_name) const;

  // Parses override lines `name_substring tflops [vram_mib]`; '#' starts a comment, blank lines
  // are skipped. tflops must be a finite number > 0, vram_mib an integer > 0. When vram_mib is
  // absent the VRAM and SM count come from the built-in model the substring matches (0 if none).
  // All-or-nothing: on error nothing is applied and the Status names the line.
  // A later override with the same substring (case-insensitive) replaces the earlier one.
  Status LoadOverrides(std::string_view text);

  const std::vector<GpuModelSpec>& builtin_models() const { return builtin_; }

 private:
  struct Rule {
    std::vector<std::string> tokens;  // every token must appear in the device name
    size_t model_index;
  };
  struct Override {
    std::string substring;  // lower case
    GpuModelSpec spec;
  };

  const GpuModelSpec* MatchBuiltin(std::string_view device_name) const;

  std::vector<GpuModelSpec> builtin_;
  std::vector<Rule> rules_;  // most specific first
  std::vector<Override> overrides_;  // longest substring first
};

// The share of one GPU's time that `tflops` represents on a GPU of `capacity_tflops`.
// REQUIRES nothing; returns kInvalidArgument unless 0 < tflops <= capacity_tflops and both finite.
StatusOr<double> ShareFromTflops(double tflops, double capacity_tflops);

}  // namespace tf
