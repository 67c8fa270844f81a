// Kernels of the GPU tier (embedded as the fatbin tier_kernels). Time is read from
// %globaltimer, one nanosecond clock for the whole GPU, so intervals logged by different
// processes can be compared directly.

// A jump between two consecutive timer reads larger than this means the context was switched
// out (time-slicing with another tenant); that time is not this kernel's GPU time.
#define TF_PREEMPT_GAP_NS 10000ull
// Segments logged per kernel: [start, end) pairs; later gaps merge into the last one.
#define TF_SEGMENTS 4

__device__ __forceinline__ unsigned long long GlobalTimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Spins until `busy_ns` of running time have passed, not counting gaps where the context was
// switched out. Block 0 / thread 0 writes the running segments into log[0..2*TF_SEGMENTS) when
// `log` is not null (unused slots stay 0).
extern "C" __global__ void tf_spin(unsigned long long busy_ns, unsigned long long* log) {
  const bool logger = log != nullptr && blockIdx.x == 0 && threadIdx.x == 0;
  unsigned long long last = GlobalTimer();
  unsigned long long seg_start = last;
  unsigned long long busy = 0;
  int closed = 0;
  while (busy < busy_ns) {
    const unsigned long long now = GlobalTimer();
    const unsigned long long step = now - last;
    if (step > TF_PREEMPT_GAP_NS) {
      if (closed < TF_SEGMENTS - 1) {
        if (logger) {
          log[2 * closed] = seg_start;
          log[2 * closed + 1] = last;
        }
        ++closed;
        seg_start = now;
      }
    } else {
      busy += step;
    }
    last = now;
  }
  if (logger) {
    log[2 * closed] = seg_start;
    log[2 * closed + 1] = last;
  }
}

// Does nothing; launch-overhead measurements use it through bench/gpu.
extern "C" __global__ void tf_empty() {}
