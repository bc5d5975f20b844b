/* The C interface of the plain GPU path (plain_path.cu), shared by its JIT-compiled library and the runtime
 * (src/compiler/plain_path.cpp). Plain C. */
#ifndef COMFUSE_PLAIN_PATH_H
#define COMFUSE_PLAIN_PATH_H

#include <stdint.h>

#define CF_PLAIN_ABI 2
#define CF_MAX_RANK 8

enum { CF_BF16 = 0, CF_F16 = 1, CF_F32 = 2 };

/* unary (and copy: cast / transpose / contiguous), binary, reductions */
enum {
  CF_COPY = 0, CF_NEG, CF_ABS, CF_EXP, CF_LOG, CF_SQRT, CF_RSQRT, CF_TANH, CF_SIGMOID, CF_RELU, CF_GELU,
  CF_GELU_TANH, CF_SILU, CF_SQUARE, CF_RECIPROCAL, CF_POW, CF_ROUND_BF16, CF_ROUND_F16,
  CF_ADD = 32, CF_SUB, CF_MUL, CF_DIV, CF_MAX, CF_MIN,
  CF_SUM = 64, CF_MEAN, CF_REDUCE_MAX, CF_REDUCE_MIN
};

typedef struct CfTensor {
  void* ptr;
  int dtype;
  int rank;
  int64_t shape[CF_MAX_RANK];
  int64_t stride[CF_MAX_RANK]; /* elements; 0 along a broadcast dim */
} CfTensor;

#ifdef __cplusplus
extern "C" {
#endif
typedef int (*CfPlainAbiFn)(void);
/* out = op(a) (b == NULL) or op(a, b), over out's shape; a and b are given with out's rank (broadcast strides) */
typedef int (*CfPlainElementwiseFn)(int op, const CfTensor* out, const CfTensor* a, const CfTensor* b, float param,
                                    void* stream, char* why, int len);
/* out = op over dim `dim` of the contiguous `in` */
typedef int (*CfPlainReduceFn)(int op, const CfTensor* in, int dim, const CfTensor* out, void* stream, char* why,
                               int len);
/* c[b] = a[b] x b[b]: contiguous operands, per-batch element offsets a_off / b_off in device memory */
typedef int (*CfPlainMatmulFn)(const CfTensor* a, const CfTensor* b, const CfTensor* c, int64_t batches, int64_t m,
                               int64_t n, int64_t k, int ta, int tb, const int64_t* a_off, const int64_t* b_off,
                               int mm_dtype, void* stream, char* why, int len);
#ifdef __cplusplus
}
#endif

#endif /* COMFUSE_PLAIN_PATH_H */
