/* The nn kernels and network in double (the reference the gradient-check tests use): nn_layers.inc and
 * nn_net.inc compiled with REAL = double. */
/* Vectorize the element-wise loops (LRN, ReLU, bias; common/CMakeLists.txt adds
 * -fno-math-errno, so sqrt does not stop them). Neither changes any result, so runs stay
 * bit-reproducible. */
#pragma GCC optimize("tree-vectorize")

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "mqgrad/util.h"
#include "nn_internal.h"

#define REAL double
#define FN(name) name##_d
#define NET mq_net_d_t
#define FC_FAST 0 /* fc_x86.c's products (float only) */
#define GEMM cblas_dgemm
#define SQRT sqrt
#define MARK(stage) ((void)(stage))
#define POW pow
#define WIDE

#include "nn_layers.inc"
#include "nn_net.inc"
