/* Helpers shared by the trainer's files (see util.h). */
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

double gpt_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int first_failed_rank(distro_comm *comm, int ok) {
  const int world = distro_comm_size(comm);
  int32_t mine = ok ? 1 : 0, *all = malloc(sizeof *all * (size_t)world);
  if (!all) return -2;
  int first = -1;
  if (distro_comm_allgather(comm, &mine, sizeof mine, all) != DISTRO_OK) {
    first = -2;
  } else {
    for (int r = world - 1; r >= 0; r--)
      if (!all[r]) first = r;
  }
  free(all);
  return first;
}

const char *fmt_bytes(char *buf, size_t n, double b) {
  static const char *unit[] = {"B", "kB", "MB", "GB", "TB"};
  int u = 0;
  while (fabs(b) >= 1000 && u < 4) {
    b /= 1000;
    u++;
  }
  if (u == 0)
    snprintf(buf, n, "%.0f B", b);
  else
    snprintf(buf, n, "%.*f %s", b < 10 ? 2 : b < 100 ? 1 : 0, b, unit[u]);
  return buf;
}

const char *fmt_duration(char *buf, size_t n, double s) {
  if (!(s >= 0) || s > 1e7) {
    snprintf(buf, n, "--:--");
    return buf;
  }
  long t = (long)(s + 0.5);
  if (t >= 3600)
    snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else
    snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
  return buf;
}
