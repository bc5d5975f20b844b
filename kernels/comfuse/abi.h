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

#define COMFUSE_KERNEL_ABI 2
#define COMFUSE_MAX_OUTPUTS 8
#define COMFUSE_MAX_PARAMS 16

/* ComfuseKernelArgs::transport: the row reductions' cross-CTA exchange (kernel_config.h Transport, reduce::Transport) */
#define COMFUSE_TRANSPORT_L2 0
#define COMFUSE_TRANSPORT_DSMEM_P2P 1
#define COMFUSE_TRANSPORT_DSMEM_LEADER 2

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
  int transport;                            /* COMFUSE_TRANSPORT_* */
  int max_clusters;                         /* > 0: cap the persistent grid (tests) */
  int64_t ws_rows;                          /* the rows the workspace was sized for (comfuse_kernel_workspace's m;
                                               0: m): where a library-form pass keeps its scratch in it */
} ComfuseKernelArgs;

/* A back-to-back GEMM kernel library (kernels/comfuse/b2b_unit.cuh): O = epilogue2(F(X·W1)·W2), same abi and name
 * symbols, and
 *
 *   int comfuse_b2b_check(const ComfuseB2bArgs*, char* why, int why_len);
 *   int comfuse_b2b_launch(const ComfuseB2bArgs*, void* stream, char* why, int why_len);
 *
 * Dense row-major operands; the layouts of W1 and W2 are the library's (its Spec's transpose_b). With batch > 1
 * there are `batch` problems of rows / batch rows, X and O packed batch after batch; a batched weight likewise,
 * a shared one (batched = 0) only where the other weight is shared too (then batch must be 1). */
typedef struct ComfuseB2bArgs {
  int abi;                                  /* COMFUSE_KERNEL_ABI */
  const void* x;                            /* [rows, K] */
  const void* w1;                           /* [K, N1] or [N1, K] (per batch when batched) */
  const void* b1;                           /* [N1] or NULL */
  const void* w2;                           /* [N1, N2] or [N2, N1] */
  const void* b2;                           /* [N2] or NULL */
  void* out;                                /* [rows, N2] */
  int64_t rows, batch, k, n1, n2;
  int max_ctas;                             /* > 0: cap the persistent grid (tests) */
} ComfuseB2bArgs;

typedef int (*ComfuseKernelAbiFn)(void);
typedef const char* (*ComfuseKernelNameFn)(void);
typedef int (*ComfuseKernelCheckFn)(const ComfuseKernelArgs*, char*, int);
typedef int (*ComfuseKernelLaunchFn)(const ComfuseKernelArgs*, void*, char*, int);
typedef int (*ComfuseB2bCheckFn)(const ComfuseB2bArgs*, char*, int);
typedef int (*ComfuseB2bLaunchFn)(const ComfuseB2bArgs*, void*, char*, int);

#ifdef __cplusplus
}
#endif

#endif /* COMFUSE_ABI_H */
