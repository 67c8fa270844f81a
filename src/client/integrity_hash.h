// The keyed hash behind the driver's INTEGRITY_CHECK export table (docs/export-tables.md): an
// HMAC (RFC 2104) over MD2 (RFC 1319) with a fixed 16-byte key. No dependencies, so that tests can
// link it on its own.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tf::client::integrity {

// MD2 (RFC 1319), fed incrementally.
class Md2 {
 public:
  Md2() { Reset(); }
  void Reset();
  void Update(const void* data, size_t n);
  void Final(uint8_t digest[16]);

  // The state between blocks (for tests against published intermediate states).
  const uint8_t* x() const { return x_; }         // 48 bytes
  const uint8_t* checksum() const { return c_; }  // 16 bytes
  unsigned pending() const { return n_; }         // bytes of the current block

 private:
  void Compress();
  uint8_t x_[48];
  uint8_t c_[16];
  uint8_t block_[16];
  uint8_t last_;  // the last checksum byte written (L of RFC 1319)
  unsigned n_;
};

// The 16-byte key the driver uses (the result of a first pass that takes no input).
extern const uint8_t kKey[16];

// The record hashed first: the layout is fixed (48 bytes, little-endian, pointers 64-bit).
struct CheckInput {
  uint32_t driver_version;
  uint32_t caller_version;
  uint32_t pid;
  uint32_t tid;
  uint64_t cudart_table;
  uint64_t integrity_table;
  uint64_t check_function;
  uint64_t unix_seconds;
};
static_assert(sizeof(CheckInput) == 48);

// One per device, in ordinal order (28 bytes).
struct DeviceRecord {
  uint8_t uuid[16];
  int32_t pci_domain;
  int32_t pci_bus;
  int32_t pci_device;
};
static_assert(sizeof(DeviceRecord) == 28);

// The 128-bit answer, as two native-endian u64 words. caller_version % 10 of 0 or 1 selects
// fixed answers (older callers), anything else HMAC-MD2(kKey, input || devices).
void Compute(const CheckInput& input, const DeviceRecord* devices, size_t device_count,
             uint64_t out[2]);

}  // namespace tf::client::integrity
