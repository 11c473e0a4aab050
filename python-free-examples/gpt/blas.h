/* The BLAS the model's matrix products run on.
 *
 * Debian 12's OpenBLAS (0.3.21, DYNAMIC_ARCH) picks its kernels by CPU
 * model number; on a CPU newer than it knows (Intel Xeon model 207 is one)
 * it falls back to its SSE3 "Prescott" kernels, which have no FMA and run
 * the model's GEMMs about 4x slower than the AVX-512 ones. OpenBLAS reads
 * OPENBLAS_CORETYPE once, when it is loaded, so the only cure from inside
 * the program is to set it and start over. */
#ifndef GPT_BLAS_H
#define GPT_BLAS_H

/* The kernel family OpenBLAS uses ("SkylakeX", "Haswell", "Prescott"...). */
const char *gpt_blas_core(void);

/* Call first thing in main(). If OpenBLAS fell back to a pre-FMA kernel on
 * a CPU that has FMA, and OPENBLAS_CORETYPE is unset (a user's setting is
 * kept), sets it and re-executes the program with the same arguments; on
 * return nothing was done (or the exec failed, and the program runs on as
 * it was). Writes one line to stderr when it restarts. */
void gpt_blas_fix_core(char **argv);

#endif
