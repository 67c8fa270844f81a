// The driver's private export tables (cuGetExportTable, the "dark API"), emulated in the remote
// client stub. cudart (static or shared) asks the driver for these tables by UUID at start-up and
// calls through them on nearly every runtime call; they are answered in this process and never
// forwarded: their functions take pointers into this process (fatbins, callbacks, thread ids).
// What each table is and what each entry does here: docs/export-tables.md.
//
// TFUSION_CLIENT_TRACE=1 logs every cuGetExportTable request and every call through an entry.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

namespace tf::client {

// cuGetExportTable: a known UUID gets its table (slot 0 of most tables is the table's byte size),
// an unknown one CUDA_ERROR_INVALID_VALUE and *table = nullptr, as the driver does.
CUresult GetExportTable(const void** table, const CUuuid* id);

// Runs the destructors registered through CONTEXT_LOCAL_STORAGE for `ctx` and forgets its entries.
// Called by cuCtxDestroy before the context goes; must be called without State().mu held (the
// destructors belong to cudart and may call the driver).
void ReleaseContextStorage(uint64_t ctx);

// The tables this stub knows, for tests and the trace.
struct ExportTableInfo {
  const char* name;
  CUuuid id;
  size_t slots;         // entries, the size word included
  bool has_size_word;   // slot 0 holds slots * sizeof(void*)
};
size_t KnownExportTables(const ExportTableInfo** out);

}  // namespace tf::client
