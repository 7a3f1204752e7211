/* Tests that run the model in their own process run OpenBLAS as the programs do: the
 * programs call mq_nn_pick_blas_core first in main (the kernels the CPU's features allow,
 * OpenBLAS's idle threads asleep, the program run again with those settings); a test binary's
 * main is Criterion's, so a constructor does it before Criterion starts (glibc passes
 * constructors argv). On a CPU that OpenBLAS 0.3.21 does not know (an Intel Xeon of family 6
 * model 207) a test process kept its generic Prescott kernels otherwise, slower and with other
 * bits on two threads than on one for most of the paper model's shapes: kernels no program
 * runs. Included by test_nn.c and by harness.h (the in-process cluster's tests). */
#ifndef MQGRAD_TEST_BLAS_AS_PROGRAMS_H
#define MQGRAD_TEST_BLAS_AS_PROGRAMS_H

#include "mqgrad/nn.h"

__attribute__((constructor)) static void s_blas_as_the_programs(int argc, char **argv)
{
    (void)argc;
    mq_nn_pick_blas_core(argv);
}

#endif
