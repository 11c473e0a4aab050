/* One all-gather of BYTES per rank through the installed library's MPI
 * communicator (distro_comm_mpi), timed: the probe bench/wan uses to show
 * that a link's rate limit is real. Built by the bench/wan scripts against an
 * installed prefix, the way an outside trainer links the library.
 *
 *   mpirun -np W wan_exchange [BYTES [REPS]]   (default 1000000 bytes, 1 rep)
 *
 * Rank 0 prints one line per repetition:
 *   exchange ranks=W bytes=B seconds=S
 * where S is the slowest rank's time for the call, after a barrier; a small
 * all-gather before the first timed one opens the TCP connections. Every
 * received byte is checked against the sender's pattern. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <distro/comm.h>
#include <distro/mpi.h>
#include <distro/status.h>

static unsigned char pattern(int rank, size_t i, int rep) {
  return (unsigned char)((size_t)rank * 131u + i * 7u + (size_t)rep * 29u + (i >> 11));
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1, rc = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  char *end = NULL;
  const unsigned long long bytes_arg = argc > 1 ? strtoull(argv[1], &end, 10) : 1000000ull;
  const long reps = argc > 2 ? strtol(argv[2], NULL, 10) : 1;
  if ((argc > 1 && (!end || *end || bytes_arg == 0 || bytes_arg > (1ull << 30))) || reps < 1 || reps > 100) {
    if (rank == 0) fprintf(stderr, "usage: wan_exchange [BYTES (1..2^30)] [REPS (1..100)]\n");
    MPI_Finalize();
    return 2;
  }
  const size_t bytes = (size_t)bytes_arg;
  distro_comm *comm = NULL;
  unsigned char *send = malloc(bytes), *recv = malloc(bytes * (size_t)world);
  unsigned char one = 1, ones[1024];
  if (!send || !recv || world > 1024) {
    fprintf(stderr, "wan_exchange: rank %d: out of memory or too many ranks\n", rank);
    goto out;
  }
  distro_status s = distro_comm_mpi(MPI_COMM_WORLD, &comm);
  if (s == DISTRO_OK) s = distro_comm_allgather(comm, &one, 1, ones); /* connections up */
  for (long rep = 0; s == DISTRO_OK && rep < reps; rep++) {
    for (size_t i = 0; i < bytes; i++) send[i] = pattern(rank, i, (int)rep);
    s = distro_comm_barrier(comm);
    const double t0 = MPI_Wtime();
    if (s == DISTRO_OK) s = distro_comm_allgather(comm, send, bytes, recv);
    double dt = MPI_Wtime() - t0, slowest = dt;
    if (s != DISTRO_OK) break;
    size_t wrong = 0;
    for (int r = 0; r < world; r++)
      for (size_t i = 0; i < bytes; i++) wrong += recv[(size_t)r * bytes + i] != pattern(r, i, (int)rep);
    unsigned long long wrong_all = 0, w = wrong;
    MPI_Allreduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(&w, &wrong_all, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (wrong_all) {
      if (rank == 0) fprintf(stderr, "wan_exchange: %llu received bytes differ from what was sent\n", wrong_all);
      goto out;
    }
    if (rank == 0) printf("exchange ranks=%d bytes=%zu seconds=%.6f\n", world, bytes, slowest);
  }
  if (s != DISTRO_OK) {
    fprintf(stderr, "wan_exchange: rank %d: %s: %s\n", rank, distro_status_string(s), distro_last_error());
    goto out;
  }
  rc = 0;
out:
  fflush(stdout);
  distro_comm_free(comm);
  free(send);
  free(recv);
  if (rc) MPI_Abort(MPI_COMM_WORLD, rc);
  MPI_Finalize();
  return rc;
}
