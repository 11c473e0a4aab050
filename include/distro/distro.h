/* distro: umbrella header (status, communicators, optimizer). */
#ifndef DISTRO_DISTRO_H
#define DISTRO_DISTRO_H

#include <distro/status.h>
#include <distro/comm.h>
#include <distro/optim.h>
#include <distro/diloco.h>
#include <distro/sync.h>

#endif
