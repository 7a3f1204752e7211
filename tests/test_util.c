/* Tests of the small helpers of mqgrad/util.h that no other test reaches through a caller. */
#include <math.h>

#include <criterion/criterion.h>

#include "mqgrad/util.h"

Test(util, median_sorts_in_place_and_takes_the_middle)
{
    double odd[] = {3.0, -1.0, 7.5, 2.0, 2.0};
    cr_expect_eq(mq_median(odd, 5), 2.0);
    const double sorted[] = {-1.0, 2.0, 2.0, 3.0, 7.5};
    for (int i = 0; i < 5; i++)
        cr_expect_eq(odd[i], sorted[i], "value %d: %g, expected %g", i, odd[i], sorted[i]);
    double even[] = {10.0, 4.0, 1.0, 6.0};
    cr_expect_eq(mq_median(even, 4), 5.0, "the mean of the middle two");
    cr_expect_eq(even[0], 1.0);
    cr_expect_eq(even[3], 10.0);
    double one[] = {-0.25};
    cr_expect_eq(mq_median(one, 1), -0.25);
    cr_expect(isnan(mq_median(NULL, 0)), "no values: NaN");
}
