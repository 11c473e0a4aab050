/* Internal: DISTRO__CLONES compiles a hot kernel for AVX-512, AVX2 and
 * baseline x86-64 and picks one when the library loads (GCC target_clones,
 * an ELF ifunc). The library builds with -ffp-contract=off and no fast-math,
 * so every clone performs the same IEEE operations in the same order and the
 * results are bit-identical whichever clone a CPU gets. Elsewhere (other
 * compilers or architectures), and in a DISTRO_PORTABLE build (baseline
 * x86-64 only, which the tests compare against the default build), it is a
 * no-op. */
#ifndef DISTRO_COMMON_CLONES_H
#define DISTRO_COMMON_CLONES_H

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__ELF__) && !DISTRO_PORTABLE
#define DISTRO__CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DISTRO__CLONES
#endif

#endif
