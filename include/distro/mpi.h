/* distro: MPI communicator (available when the library was built with MPI). */
#ifndef DISTRO_MPI_H
#define DISTRO_MPI_H

#include <mpi.h>
#include <distro/comm.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Wraps (a duplicate of) `mpi`; MPI must be initialized and stay so until
 * the comm is freed. Only present in builds with MPI (DISTRO_WITH_MPI). */
DISTRO_API distro_status distro_comm_mpi(MPI_Comm mpi, distro_comm **out);

#ifdef __cplusplus
}
#endif
#endif
