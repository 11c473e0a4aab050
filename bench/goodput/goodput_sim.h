/* Goodput simulator: chip failures against synchronous data-parallel training,
 * elastic data-parallel training and Decoupled DiLoCo with M learners.
 *
 * A discrete-event simulation over a fixed wall-clock horizon. All state lives
 * in the call; the only randomness is a PRNG seeded from params.seed, so the
 * same parameters give the same result. The model is described in
 * docs/goodput.md. Times are in seconds unless the name says otherwise. */
#ifndef GOODPUT_SIM_H
#define GOODPUT_SIM_H

#include <stddef.h>
#include <stdint.h>

enum { GOODPUT_OK = 0, GOODPUT_EINVAL = -1, GOODPUT_ENOMEM = -2 };

typedef struct goodput_params {
  /* Cluster and method. */
  long chips;    /* N: every chip in the cluster, spares included */
  int learners;  /* M: 1 is data-parallel, > 1 is Decoupled DiLoCo */
  int quorum;    /* K: learners the syncer needs to merge a fragment */
  int elastic;   /* 1: a failure removes its unit and the learner continues on fewer chips;
                    0: the learner restarts at full size on a hot spare */
  int coalesce;  /* 1: failures during a pause are folded into it; 0: each restarts the pause */

  /* Failures and repair. */
  double mtbf_chip_h; /* mean time between failures of one chip, hours */
  long unit_chips;    /* chips one failure takes out of service (a host) */
  double repair_h;    /* repair and return of a failed unit, hours */

  /* Per-failure costs. */
  double t_detect;       /* from the failure to the decision to act */
  double t_reconfig;     /* elastic downscale: drop the unit, rebuild collectives, rebalance */
  double t_restart;      /* rigid: swap in a spare, relaunch, restore state from memory */
  double t_peer;         /* rigid learner (M > 1): pull a consistent state from a healthy peer */
  double t_upscale;      /* elastic upscale: add repaired units back */
  double upscale_wait;   /* longest a repaired unit waits for a reconfiguration to ride on */

  /* Training. */
  double step_s;  /* one inner step; a failure discards the step in flight */
  double ckpt_s;  /* rigid M = 1: progress since the last state snapshot is lost */
  double jitter;  /* per-step, per-chip relative std of compute time (speed variation) */
  int inner_steps;  /* H: inner steps between two syncs of one fragment */
  int fragments;    /* P: fragments, synced at staggered offsets */
  int tau;          /* overlap, in steps, between sending a fragment and applying it */
  double gamma;     /* grace-window safety margin, in [0, 1) */
  double t_sync;    /* syncer time to merge one fragment */

  /* Simulation. */
  double horizon_h; /* simulated wall-clock time, hours */
  uint64_t seed;
} goodput_params;

typedef struct goodput_result {
  double goodput;       /* useful chip-time / (chips x horizon) */
  double uptime;        /* fraction of wall time with >= K learners training */
  double learner_up;    /* mean fraction of learners training */
  /* Where chip-time went; the five add up to 1. */
  double frac_useful, frac_straggler, frac_lost, frac_paused, frac_out;
  long failures;        /* chip failures drawn */
  long absorbed;        /* failures on a chip already out of service */
  long pauses;          /* learner pauses started (downscale, upscale, restart) */
  long upscales;        /* dedicated upscale pauses */
  long rounds;          /* syncer merge rounds (M > 1) */
  double stalled;       /* fraction of rounds that had to wait for quorum */
  double participation; /* mean fraction of learners merged per round */
  double grace_s;       /* grace window with quorum on time */
} goodput_result;

/* Fills *p with the documented defaults (docs/goodput.md). */
void goodput_params_default(goodput_params *p);

/* GOODPUT_OK, or GOODPUT_EINVAL with a message in err (if err is not NULL). */
int goodput_validate(const goodput_params *p, char *err, size_t errlen);

/* Runs one configuration. Returns GOODPUT_OK, GOODPUT_EINVAL or GOODPUT_ENOMEM;
 * on error *r is zeroed and err holds the reason. Never prints, never exits. */
int goodput_simulate(const goodput_params *p, goodput_result *r, char *err, size_t errlen);

/* Renewal-reward closed form for one learner of the model, valid exactly when
 * repair_h = 0, jitter = 0 and coalesce = 1, and approximately otherwise:
 * goodput and uptime (uptime for M learners and quorum K). GOODPUT_EINVAL on
 * invalid parameters. */
int goodput_closed_form(const goodput_params *p, double *goodput, double *uptime, char *err, size_t errlen);

/* Expected maximum of n independent standard normals (n >= 1). */
double goodput_expected_max_normal(long n);

#endif
