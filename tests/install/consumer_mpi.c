/* Install check: a trainer that calls MPI itself (MPI_Init, MPI_Allreduce)
 * next to distro's MPI communicator, built with nothing but
 * `pkg-config --cflags --libs distro`. Run as a singleton MPI process. */
#include <stdio.h>

#include <distro/distro.h>
#include <distro/mpi.h>

int main(int argc, char **argv) {
  if (MPI_Init(&argc, &argv) != MPI_SUCCESS) return 1;
  int rank = -1, one = 1, sum = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  distro_comm *comm = NULL;
  distro_status s = distro_comm_mpi(MPI_COMM_WORLD, &comm);
  int ok = s == DISTRO_OK && distro_comm_size(comm) == sum && distro_comm_rank(comm) == rank;
  if (!ok) fprintf(stderr, "consumer_mpi: %s (%s)\n", distro_status_string(s), distro_last_error());
  distro_comm_free(comm);
  MPI_Finalize();
  if (ok) printf("consumer_mpi: MPI and distro_comm_mpi agree on %d rank(s)\n", sum);
  return ok ? 0 : 1;
}
