/* The nn kernels and network in float (what the model runs): nn_layers.inc and
 * nn_net.inc compiled with REAL = float. */
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

#define REAL float
#define FN(name) name##_f
#define NET mq_net_f_t
#define FC_FAST 1 /* fc_x86.c's products (float only) */
#define GEMM cblas_sgemm
#define SQRT sqrtf
#define MARK(stage) mq_nn_mark(stage)
#define POW powf
#define WIDE MQ_NN_WIDE

#include "nn_layers.inc"
#include "nn_net.inc"
