/* Test-only entry points of the fake CUDA driver (tests/fakecuda). Tests resolve them with dlsym
 * on the handle of the fake libcuda.so.1; the typedefs below name their signatures. */
#ifndef TF_TESTS_FAKECUDA_FAKECUDA_API_H_
#define TF_TESTS_FAKECUDA_FAKECUDA_API_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A host function standing in for a device kernel. params is the launch's kernelParams array:
 * params[i] points at argument i. Runs on the launching stream's worker thread. */
typedef void (*FakecudaKernelFn)(void** params, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                                 unsigned block_x, unsigned block_y, unsigned block_z, void* user);

/* Registers kernel_name in module module_name (a module image is the text
 * "fakecuda:<module_name>"). The argument layout is unknown, so a launch passes the caller's
 * kernelParams pointers through: they must stay valid until the kernel has run. Returns 0, or -1
 * on a NULL argument. Re-registering a name replaces it. Callable before cuInit. */
int fakecuda_register_kernel(const char* module_name, const char* kernel_name, FakecudaKernelFn fn,
                             void* user);
typedef int (*fakecuda_register_kernel_t)(const char*, const char*, FakecudaKernelFn, void*);

/* As fakecuda_register_kernel, with the byte size of each of num_params arguments: launches copy
 * the arguments (as CUDA does) and cuFuncGetParamInfo answers. */
int fakecuda_register_kernel_ex(const char* module_name, const char* kernel_name,
                                FakecudaKernelFn fn, void* user, size_t num_params,
                                const size_t* param_sizes);
typedef int (*fakecuda_register_kernel_ex_t)(const char*, const char*, FakecudaKernelFn, void*,
                                             size_t, const size_t*);

/* The n-th next call (1 = the very next) of function_name returns cuda_error without doing
 * anything. function_name may be the base name or an exported versioned name ("cuMemAlloc" and
 * "cuMemAlloc_v2" are the same function). n <= 0 disarms. One armed fault per function. */
void fakecuda_fail_nth(const char* function_name, int n, int cuda_error);
typedef void (*fakecuda_fail_nth_t)(const char*, int, int);

/* The driver's checkpoint of process pid as another process sees it (fake_checkpoint.cc): its
 * CUprocessState, how many of its entry point calls arrived while it was not running (they block
 * until it is unlocked), and the device memory bytes its last checkpoint held aside. Returns 0,
 * or -1 when pid is not a live process that initialised the fake. Callable before cuInit. */
int fakecuda_checkpoint_info(int pid, unsigned* state, unsigned* calls_while_locked,
                             unsigned long long* saved_bytes);
typedef int (*fakecuda_checkpoint_info_t)(int, unsigned*, unsigned*, unsigned long long*);

/* Leaves a slot in the checkpoint table under `pid` with nobody to answer in it, as a process
 * that had that pid before and died leaves one (pids are reused; the table outlives its
 * processes). Returns 0, or -1 when the table is full or cannot be opened. */
int fakecuda_checkpoint_leave_stale_slot(int pid);
typedef int (*fakecuda_checkpoint_leave_stale_slot_t)(int);

#ifdef __cplusplus
}
#endif

#endif /* TF_TESTS_FAKECUDA_FAKECUDA_API_H_ */
