/* The GPT trainer under mpirun (one rank per process) against the same run on
 * in-process ranks: the final parameters must be bit-identical, for every
 * optimizer, and a checkpoint written under MPI must resume in-process.
 * GPT_TRAIN and MPIEXEC come from tests/gpt.cmake (MPI builds only). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#if !defined(GPT_TRAIN) || !defined(MPIEXEC)
/* A build without MPI (or without the examples): nothing to compare. */
Test(gpt_mpi, same_parameters_as_in_process_ranks) { cr_skip_test("built without MPI or without the GPT example"); }
#else

#include "gpt_cli.h" /* its corpus, setup, teardown and run */

/* One thread per rank on both sides: the same arithmetic in each rank. */
#define MPI_TINY "--layers 2 --dim 32 --heads 2 --context 32 --batch 4 --threads 1 --eval-every 5 --checksum --quiet"

/* Runs the trainer (under mpirun with `mpi`), returns its parameter checksum. */
static unsigned long long checksum(int mpi, const char *args) {
  char cmd[4096], *out;
  if (mpi)
    snprintf(cmd, sizeof cmd, "'%s' --allow-run-as-root --oversubscribe -np 2 '%s' --mpi --data '%s' " MPI_TINY " %s",
             MPIEXEC, GPT_TRAIN, corpus, args);
  else
    snprintf(cmd, sizeof cmd, "'%s' --ranks 2 --data '%s' " MPI_TINY " %s", GPT_TRAIN, corpus, args);
  int rc = run(cmd, &out);
  cr_assert_eq(rc, 0, "exit %d: %s\n%s", rc, cmd, out);
  const char *p = strstr(out, "param checksum ");
  cr_assert(p, "no checksum:\n%s", out);
  cr_assert_null(strstr(p + 1, "param checksum "), "more than one rank printed:\n%s", out);
  unsigned long long v = strtoull(p + 15, NULL, 16);
  free(out);
  return v;
}

TestSuite(gpt_mpi, .init = setup, .fini = teardown, .timeout = 240);

Test(gpt_mpi, same_parameters_as_in_process_ranks) {
  static const char *runs[] = {"--optim adamw --steps 12", "--optim distro --steps 12",
                               "--optim distro-adamw --steps 12", "--optim distro --values sign1 --topk 8 --steps 12",
                               /* DiLoCo: two learners, then one learner of two ranks */
                               "--optim diloco --learners 2 --H 4 --fragments 2 --outer-codec int4 --steps 12",
                               "--optim diloco --learners 1 --ranks-per-learner 2 --inner distro --H 5 --steps 12",
                               /* the exchange on the optimizer's helper thread (MPI_THREAD_MULTIPLE) */
                               "--optim distro --overlap-step --steps 12",
                               "--optim distro-adamw --overlap-step --steps 12",
                               /* buckets gathered on the helper thread during backward */
                               "--optim distro-adamw --overlap-backward --steps 12"};
  for (int i = 0; i < 9; i++) {
    const unsigned long long local = checksum(0, runs[i]), mpi = checksum(1, runs[i]);
    cr_expect_eq(local, mpi, "%s: in-process %016llx, MPI %016llx", runs[i], local, mpi);
  }
}

/* Under MPI a timeout makes the library poll each collective instead of
 * waiting in MPI_Wait: the parameters must not change. */
Test(gpt_mpi, comm_timeout_same_parameters) {
  static const char *runs[] = {"--optim adamw --steps 12", "--optim distro-adamw --overlap-step --steps 12",
                               "--optim distro-adamw --overlap-backward --steps 12"};
  for (int i = 0; i < 3; i++) {
    char args[512];
    snprintf(args, sizeof args, "%s --comm-timeout 600", runs[i]);
    const unsigned long long local = checksum(0, runs[i]), mpi = checksum(1, args);
    cr_expect_eq(local, mpi, "%s: in-process %016llx, MPI with --comm-timeout %016llx", runs[i], local, mpi);
  }
}

/* The newest process whose argv[0] is the trainer and whose arguments name
 * `tag` (from /proc, so no procps is needed); 0 if none. */
static int youngest_rank(const char *tag) {
  DIR *d = opendir("/proc");
  if (!d) return 0;
  int best = 0;
  for (struct dirent *e; (e = readdir(d));) {
    const int pid = atoi(e->d_name);
    if (pid <= best) continue;
    char path[64], buf[8192];
    snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    if (strcmp(buf, GPT_TRAIN)) continue; /* argv[0] */
    for (size_t i = 0; i < n; i++) /* the arguments, NUL-separated */
      if (!strcmp(buf + i, tag)) { best = pid; break; }
  }
  closedir(d);
  return best;
}

/* A rank that stops (SIGSTOP: a hung node) must not hang the others: with
 * --comm-timeout each waiting rank fails its step with the library's message
 * and the job ends (MPI_Abort), well before the outer `timeout` that marks a
 * hang (exit 124). */
Test(gpt_mpi, stalled_rank_ends_the_job) {
  char cmd[4096], tag[300], *out;
  snprintf(tag, sizeof tag, "%s/stall-data.txt", dir); /* names this run's processes */
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", corpus, tag);
  cr_assert_eq(system(cmd), 0);
  snprintf(cmd, sizeof cmd,
           "timeout -k 5 120 '%s' --allow-run-as-root --oversubscribe -np 2 '%s' --mpi --data '%s' --layers 1 --dim 32 "
           "--heads 2 --context 32 --batch 2 --threads 1 --steps 1000000 --eval-every 0 --print-every 1 "
           "--optim distro --comm-timeout 3 2>&1",
           MPIEXEC, GPT_TRAIN, tag);
  FILE *p = popen(cmd, "r");
  cr_assert(p);
  /* Once rank 0 has printed a step, both ranks run: stop the youngest. */
  char line[1024];
  size_t cap = 1 << 16, n = 0;
  out = malloc(cap);
  out[0] = 0;
  int stopped = 0;
  while (fgets(line, sizeof line, p)) {
    const size_t len = strlen(line);
    if (n + len + 1 > cap) out = realloc(out, cap *= 2);
    memcpy(out + n, line, len + 1);
    n += len;
    if (!stopped && !strncmp(line, "step", 4)) {
      const int pid = youngest_rank(tag);
      cr_assert(pid > 0, "no rank process found");
      cr_assert_eq(kill(pid, SIGSTOP), 0);
      stopped = pid;
    }
  }
  const int st = pclose(p);
  if (stopped) kill(stopped, SIGKILL); /* if the launcher left it behind */
  const int rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  cr_assert(stopped, "the run printed no step:\n%s", out);
  cr_expect_neq(rc, 124, "the job hung until the outer timeout:\n%s", out);
  cr_expect_neq(rc, 0, "the job succeeded with a stopped rank:\n%s", out);
  cr_expect(strstr(out, "did not complete within 3 s (a peer stopped?)"), "no timeout message:\n%s", out);
  free(out);
}

/* Without --threads each MPI process takes its share of the node's cores,
 * not all of them (2 ranks here: cores / 2). */
Test(gpt_mpi, default_threads_split_the_node) {
  char cmd[4096], *out;
  snprintf(cmd, sizeof cmd,
           "'%s' --allow-run-as-root --oversubscribe --bind-to none -np 2 '%s' --mpi --data '%s' --layers 1 --dim 32 "
           "--heads 2 --context 32 --batch 2 --steps 2 --eval-every 0",
           MPIEXEC, GPT_TRAIN, corpus);
  int rc = run(cmd, &out);
  cr_assert_eq(rc, 0, "%s\n%s", cmd, out);
  const char *p = strstr(out, "threads: ");
  cr_assert(p, "no threads line:\n%s", out);
  int threads = 0, cores = 0, here = 0;
  cr_assert_eq(sscanf(p, "threads: %d per rank (%d cores here, %d MPI rank(s)", &threads, &cores, &here), 3, "%s", p);
  cr_assert_eq(here, 2, "the 2 ranks of this node were counted as %d", here);
  cr_assert_eq(threads, cores / 2 > 1 ? cores / 2 : 1, "%d threads per rank for %d cores and 2 ranks", threads, cores);
  free(out);
}

Test(gpt_mpi, checkpoint_from_mpi_resumes_in_process) {
  char args[2048];
  const unsigned long long want = checksum(0, "--optim distro --steps 12");
  snprintf(args, sizeof args, "--optim distro --steps 12 --stop-after 7 --save '%s/ck.bin'", dir);
  checksum(1, args);
  snprintf(args, sizeof args, "--optim distro --steps 12 --resume '%s/ck.bin'", dir);
  cr_assert_eq(checksum(0, args), want, "MPI checkpoint + in-process resume differs from one in-process run");
}
#endif
