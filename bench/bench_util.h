/* What the C benchmarks share: a monotonic clock, an aligned allocation that
 * exits with a message, and the copy bandwidth that their floors use. */
#ifndef DISTRO_BENCH_UTIL_H
#define DISTRO_BENCH_UTIL_H

#include <stddef.h>

double bench_now(void); /* seconds, CLOCK_MONOTONIC */
/* 64-byte aligned; on failure prints "WHO: out of memory" and exits. */
void *bench_alloc(const char *who, size_t bytes);
/* Copy bandwidth in GB/s, counted as bytes read + bytes written, best of 5;
 * each OpenMP thread copies its own slice so all cores pull on memory. */
double bench_copy_gbs(const char *who, size_t bytes);

#endif
