/* Small helpers shared by the trainer's files: time, agreement across ranks,
 * human-readable figures. */
#ifndef GPT_UTIL_H
#define GPT_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include <distro/distro.h>

double gpt_now(void); /* seconds, monotonic */

/* Collective: every rank passes whether its part went well. Returns -1 if
 * all did, else the lowest rank that failed (the same on every rank), or -2
 * if the communicator itself failed. */
int first_failed_rank(distro_comm *comm, int ok);

/* "12.3 kB", "4.56 MB": decimal units. */
const char *fmt_bytes(char *buf, size_t n, double bytes);
/* "1:05" or "1:02:03". */
const char *fmt_duration(char *buf, size_t n, double seconds);

#endif
