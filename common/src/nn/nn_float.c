/* The nn kernels and network in float (what the model runs): nn_layers.inc and
 * nn_net.inc compiled with REAL = float. */
/* Vectorize the element-wise loops (LRN, ReLU, bias); sqrt need not set errno. Neither
 * changes any result, so runs stay bit-reproducible. */
#pragma GCC optimize("tree-vectorize", "no-math-errno")

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
#define GEMM cblas_sgemm
#define SQRT sqrtf
#define POW powf

#include "nn_layers.inc"
#include "nn_net.inc"
