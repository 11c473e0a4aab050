/* See blas.h. */
#include "blas.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* OpenBLAS's kernel families without FMA: chosen on a CPU that has it, they
 * can only be the fallback for a model it does not know. */
static const char *const pre_fma[] = {"Katmai", "Coppermine", "Northwood", "Prescott", "Banias", "Atom",
                                      "Core2", "Penryn", "Dunnington", "Nehalem", "Opteron", "Opteron(SSE3)",
                                      "Barcelona", "Nano", "Bobcat", "Sandybridge", "Unknown"};

const char *gpt_blas_core(void) {
  const char *c = openblas_get_corename();
  return c ? c : "unknown";
}

static int core_has_fma(const char *core) {
  for (size_t i = 0; i < sizeof pre_fma / sizeof pre_fma[0]; i++)
    if (!strcasecmp(core, pre_fma[i])) return 0;
  return 1;
}

/* The family this CPU can run that OpenBLAS should have picked: SkylakeX
 * (AVX-512 F/CD/BW/DQ/VL), Haswell (AVX2 + FMA), or NULL when the CPU has
 * neither or OpenBLAS's own choice already uses FMA. */
static const char *better_core(void) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (core_has_fma(gpt_blas_core())) return NULL;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return NULL;
}

void gpt_blas_fix_core(char **argv) {
  const char *set = getenv("OPENBLAS_CORETYPE");
  if (set && *set) return;
  const char *better = better_core();
  if (!better) return;
  fprintf(stderr, "%s: OpenBLAS chose its %s kernels (it does not know this CPU); restarting with "
                  "OPENBLAS_CORETYPE=%s\n", argv[0], gpt_blas_core(), better);
  fflush(NULL);
  if (setenv("OPENBLAS_CORETYPE", better, 1) != 0) return;
  /* argv[0] as the shell found it (under valgrind /proc/self/exe would be
   * the tool); /proc/self/exe if that fails. */
  if (strchr(argv[0], '/')) execv(argv[0], argv);
  else execvp(argv[0], argv);
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE"); /* the exec failed: run on with what we have */
}
