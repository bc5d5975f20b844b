/* The C interface between a generated kernel library (Psi's translation unit compiled by the JIT into a shared
 * object) and the runtime that loads it (rt::KernelLibrary). Plain C, so the two sides need not agree on any C++
 * type: the library's host half builds the CUTLASS parameters (TMA descriptors) itself.
 *
 *   int comfuse_kernel_abi(void);                                  COMFUSE_KERNEL_ABI of the library
 *   const char* comfuse_kernel_name(void);                         "comfuse_<spec hash>"
 *   int comfuse_kernel_check(const ComfuseKernelArgs*, char* why, int why_len);
 *   int comfuse_kernel_launch(const ComfuseKernelArgs*, void* stream, char* why, int why_len);
 *
 * check and launch return 0 on success; otherwise they write the reason (NUL-terminated, truncated to why_len)
 * and return 1 for arguments the kernel cannot run (nothing was launched) or 2 for a CUDA error. */
#ifndef COMFUSE_ABI_H
#define COMFUSE_ABI_H

#include <stdint.h>

#define COMFUSE_KERNEL_ABI 1
#define COMFUSE_MAX_OUTPUTS 8
#define COMFUSE_MAX_PARAMS 16

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ComfuseKernelArgs {
  int abi;                                  /* COMFUSE_KERNEL_ABI */
  const void* a;                            /* [M, K] row-major, row stride lda (elements) */
  const void* b;                            /* [K, N] or, for the nn.Linear layout, [N, K]; row stride ldb */
  int64_t m, n, k, lda, ldb;
  void* out[COMFUSE_MAX_OUTPUTS];           /* the Spec's outputs in order, [M, N] with row stride ld */
  const void* param[COMFUSE_MAX_PARAMS];    /* the Spec's runtime parameters in order */
  int64_t ld;                               /* row stride of every [M, N] output and tile parameter */
  float* ws_partials;                       /* L2 transport workspace (reductions only), see workspace bytes */
  int* ws_counters;                         /* zero before the first launch */
  int transport;                            /* 0 L2, 1 DSMEM peer-to-peer, 2 DSMEM leader-follower */
  int max_clusters;                         /* > 0: cap the persistent grid (tests) */
} ComfuseKernelArgs;

typedef int (*ComfuseKernelAbiFn)(void);
typedef const char* (*ComfuseKernelNameFn)(void);
typedef int (*ComfuseKernelCheckFn)(const ComfuseKernelArgs*, char*, int);
typedef int (*ComfuseKernelLaunchFn)(const ComfuseKernelArgs*, void*, char*, int);

#ifdef __cplusplus
}
#endif

#endif /* COMFUSE_ABI_H */
