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

/* ---- names of the options, for messages and tables ---- */

const char *optim_name(gpt_optim_kind k) {
  switch (k) {
    case GPT_OPT_ADAMW: return "adamw";
    case GPT_OPT_DISTRO: return "distro";
    case GPT_OPT_DISTRO_ADAMW: return "distro-adamw";
    case GPT_OPT_DILOCO: return "diloco";
    case GPT_OPT_DECOUPLED: return "decoupled";
  }
  return "?";
}

const char *values_name(distro_values v) {
  switch (v) {
    case DISTRO_VALUES_F32: return "f32";
    case DISTRO_VALUES_BF16: return "bf16";
    case DISTRO_VALUES_SIGN1: return "sign1";
    case DISTRO_VALUES_INT8: return "int8";
    case DISTRO_VALUES_INT4: return "int4";
    case DISTRO_VALUES_INT2: return "int2";
  }
  return "?";
}

const char *outer_codec_name(distro_outer_codec k) {
  switch (k) {
    case DISTRO_OUTER_F32: return "f32";
    case DISTRO_OUTER_BF16: return "bf16";
    case DISTRO_OUTER_INT8: return "int8";
    case DISTRO_OUTER_INT4: return "int4";
    case DISTRO_OUTER_FP4: return "fp4";
  }
  return "?";
}

const char *merge_name(distro_merge k) {
  switch (k) {
    case DISTRO_MERGE_MEAN: return "mean";
    case DISTRO_MERGE_TOKENS: return "tokens";
    case DISTRO_MERGE_RADIAL: return "radial";
    case DISTRO_MERGE_RADIAL_TOKENS: return "radial-tokens";
  }
  return "?";
}

const char *outer_gradients_desc(const distro_diloco_options *o, char *buf, size_t n) {
  if (o->compressor != DISTRO_OUTER_SPARSE)
    snprintf(buf, n, "%s outer gradients", outer_codec_name(o->codec));
  else
    snprintf(buf, n, "sparse %s outer gradients (%g%% of each %dx%d chunk%s, error feedback beta %g)",
             values_name(o->sparse_values), 100.0 * o->density, o->sparse_chunk, o->sparse_chunk,
             o->sparse_dct ? " of the DCT" : "", (double)o->ef_beta);
  return buf;
}
