// Calls and time per opcode, for the profiles both ends can log (TFUSION_CLIENT_PROFILE in the
// client stub, TFUSION_WORKER_PROFILE in a worker session).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <utility>
#include <vector>

#include "tf_driver_api.h"
#include "transport/wire.h"

namespace tf::remote {

class OpTimes {
 public:
  struct Entry {
    uint64_t calls = 0;
    int64_t ns = 0;
  };

  void Add(uint16_t op, int64_t ns) {
    Entry& e = ops_[op];
    ++e.calls;
    e.ns += ns;
  }
  // The `most` opcodes that took the longest, longest first, with their names: the driver entry
  // point for a driver call, else "op 0xNNNN".
  struct Row {
    char name[48];
    Entry e;
  };
  std::vector<Row> Top(size_t most) const {
    std::vector<std::pair<uint16_t, Entry>> v(ops_.begin(), ops_.end());
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
    if (v.size() > most) v.resize(most);
    std::vector<Row> rows(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      const uint16_t op = v[i].first;
      if (transport::IsDriverCallOpcode(op)) {
        snprintf(rows[i].name, sizeof(rows[i].name), "%s",
                 driver::FunctionName(static_cast<driver::Fn>(transport::DriverCallId(op))));
      } else {
        snprintf(rows[i].name, sizeof(rows[i].name), "op 0x%04x", op);
      }
      rows[i].e = v[i].second;
    }
    return rows;
  }

 private:
  std::map<uint16_t, Entry> ops_;
};

}  // namespace tf::remote
