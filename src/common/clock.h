/* Monotonic wall clock for the step's timing statistics. */
#ifndef DISTRO_COMMON_CLOCK_H
#define DISTRO_COMMON_CLOCK_H

/* Seconds on CLOCK_MONOTONIC (an arbitrary origin: differences only). */
double distro__now(void);

#endif
