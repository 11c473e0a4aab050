/* Goodput simulator core. See goodput_sim.h and docs/goodput.md. */
#include "goodput_sim.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- defaults ---------------------------------------------------------- */

void goodput_params_default(goodput_params *p) {
  memset(p, 0, sizeof *p);
  p->chips = 1200000;
  p->learners = 1;
  p->quorum = 1;
  p->elastic = 1;
  p->coalesce = 1;
  p->mtbf_chip_h = 8760.0; /* one year, the paper's figure */
  p->unit_chips = 4;       /* one host of 4 accelerators */
  p->repair_h = 48.0;      /* triage, swap and burn-in of a host */
  p->t_detect = 5.0;
  p->t_reconfig = 12.0;
  p->t_restart = 45.0;
  p->t_peer = 20.0;
  p->t_upscale = 12.0;
  p->upscale_wait = 60.0;
  p->step_s = 2.0;
  p->ckpt_s = 2.0; /* every DP replica holds the state: only the step in flight is lost */
  p->jitter = 0.002;
  p->inner_steps = 24;
  p->fragments = 24;
  p->tau = 2;
  p->gamma = 0.5;
  p->t_sync = 1.0;
  p->horizon_h = 168.0;
  p->seed = 1;
}

/* ---- validation -------------------------------------------------------- */

static int fail(char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return GOODPUT_EINVAL;
}

/* A finite number >= lo. */
static int check_min(double v, double lo) { return isfinite(v) && v >= lo; }

int goodput_validate(const goodput_params *p, char *err, size_t errlen) {
  if (!p) return fail(err, errlen, "params is NULL");
  if (p->chips < 1) return fail(err, errlen, "chips must be >= 1 (got %ld)", p->chips);
  if (p->learners < 1) return fail(err, errlen, "learners M must be >= 1 (got %d)", p->learners);
  if ((long)p->learners > p->chips)
    return fail(err, errlen, "learners M=%d exceeds chips N=%ld", p->learners, p->chips);
  if (p->quorum < 1) return fail(err, errlen, "quorum K must be >= 1 (got %d)", p->quorum);
  if (p->quorum > p->learners)
    return fail(err, errlen, "quorum K=%d exceeds learners M=%d", p->quorum, p->learners);
  if (p->elastic != 0 && p->elastic != 1) return fail(err, errlen, "elastic must be 0 or 1");
  if (p->coalesce != 0 && p->coalesce != 1) return fail(err, errlen, "coalesce must be 0 or 1");
  if (!(p->mtbf_chip_h > 0)) /* INFINITY: chips never fail */
    return fail(err, errlen, "mtbf_chip_h must be > 0 (got %g)", p->mtbf_chip_h);
  if (p->unit_chips < 1) return fail(err, errlen, "unit_chips must be >= 1 (got %ld)", p->unit_chips);
  if (p->unit_chips > p->chips / p->learners)
    return fail(err, errlen, "unit_chips=%ld exceeds the chips of one learner (%ld)", p->unit_chips,
                p->chips / p->learners);
  const struct {
    const char *name;
    double v;
  } times[] = {{"repair_h", p->repair_h},         {"t_detect", p->t_detect},   {"t_reconfig", p->t_reconfig},
               {"t_restart", p->t_restart},       {"t_peer", p->t_peer},       {"t_upscale", p->t_upscale},
               {"upscale_wait", p->upscale_wait}, {"t_sync", p->t_sync}};
  for (size_t i = 0; i < sizeof times / sizeof *times; i++)
    if (!check_min(times[i].v, 0.0)) return fail(err, errlen, "%s must be >= 0 (got %g)", times[i].name, times[i].v);
  if (!(isfinite(p->step_s) && p->step_s > 0)) return fail(err, errlen, "step_s must be > 0 (got %g)", p->step_s);
  if (!(isfinite(p->ckpt_s) && p->ckpt_s > 0)) return fail(err, errlen, "ckpt_s must be > 0 (got %g)", p->ckpt_s);
  if (!(isfinite(p->jitter) && p->jitter >= 0 && p->jitter < 1))
    return fail(err, errlen, "jitter must be in [0, 1) (got %g)", p->jitter);
  if (p->inner_steps < 1) return fail(err, errlen, "inner_steps H must be >= 1 (got %d)", p->inner_steps);
  if (p->fragments < 1) return fail(err, errlen, "fragments P must be >= 1 (got %d)", p->fragments);
  if (p->tau < 0) return fail(err, errlen, "tau must be >= 0 (got %d)", p->tau);
  if (!(isfinite(p->gamma) && p->gamma >= 0 && p->gamma < 1))
    return fail(err, errlen, "gamma must be in [0, 1) (got %g)", p->gamma);
  if (!(isfinite(p->horizon_h) && p->horizon_h > 0))
    return fail(err, errlen, "horizon_h must be > 0 (got %g)", p->horizon_h);
  return GOODPUT_OK;
}

/* ---- random numbers: xoshiro256** seeded by splitmix64 ------------------ */

typedef struct {
  uint64_t s[4];
} rng;

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static void rng_seed(rng *r, uint64_t seed) {
  for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(rng *r) {
  uint64_t *s = r->s;
  uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return out;
}

/* Uniform in [0, 1). */
static double rng_unif(rng *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }

static double rng_exp(rng *r, double rate) { return rate > 0 ? -log1p(-rng_unif(r)) / rate : INFINITY; }

static double rng_normal(rng *r) {
  double u = 1.0 - rng_unif(r), v = rng_unif(r);
  return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* Poisson by inversion for small means, rounded normal for large ones. */
static long rng_poisson(rng *r, double mean) {
  if (mean <= 0) return 0;
  if (mean > 50) {
    double x = floor(mean + sqrt(mean) * rng_normal(r) + 0.5);
    return x < 0 ? 0 : (long)x;
  }
  double limit = exp(-mean), prod = rng_unif(r);
  long k = 0;
  while (prod > limit) {
    prod *= rng_unif(r);
    k++;
  }
  return k;
}

/* ---- speed variation --------------------------------------------------- */

/* E[max of n iid N(0,1)] = int_0^inf (1 - F^n) - int_-inf^0 F^n, F the normal CDF. */
double goodput_expected_max_normal(long n) {
  if (n <= 1) return 0.0;
  const double h = 1e-3, lim = 12.0;
  double sum = 0.0;
  for (double x = -lim + h / 2; x < lim; x += h) {
    double logF = log(0.5 * erfc(-x / sqrt(2.0)));
    double Fn = exp((double)n * logF);
    sum += x >= 0 ? (1.0 - Fn) : -Fn;
  }
  return sum * h;
}

/* Fraction of a synchronous step a group of n chips spends computing: every
 * step waits for the slowest chip, 1 + jitter * E[max] in units of the mean. */
static double sync_efficiency(double jitter, long n) { return 1.0 / (1.0 + jitter * goodput_expected_max_normal(n)); }

/* ---- event queue: binary min-heap ordered by (time, insertion) ---------- */

enum { EV_PAUSE_END, EV_RETURN, EV_UPSCALE };

typedef struct {
  double t;
  uint64_t seq;
  int type;
  int learner;
  uint64_t tag; /* epoch or token the event belongs to; stale events are skipped */
  long chips;
} event;

typedef struct {
  event *a;
  size_t n, cap;
  uint64_t seq;
} heap;

static int ev_before(const event *x, const event *y) { return x->t < y->t || (x->t == y->t && x->seq < y->seq); }

static int heap_push(heap *h, event e) {
  if (h->n == h->cap) {
    size_t cap = h->cap ? 2 * h->cap : 1024;
    event *a = realloc(h->a, cap * sizeof *a);
    if (!a) return GOODPUT_ENOMEM;
    h->a = a;
    h->cap = cap;
  }
  e.seq = h->seq++;
  size_t i = h->n++;
  while (i > 0 && ev_before(&e, &h->a[(i - 1) / 2])) {
    h->a[i] = h->a[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  h->a[i] = e;
  return GOODPUT_OK;
}

static event heap_pop(heap *h) {
  event top = h->a[0], last = h->a[--h->n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= h->n) break;
    if (c + 1 < h->n && ev_before(&h->a[c + 1], &h->a[c])) c++;
    if (!ev_before(&h->a[c], &last)) break;
    h->a[i] = h->a[c];
    i = c;
  }
  if (h->n) h->a[i] = last;
  return top;
}

/* ---- learners ---------------------------------------------------------- */

enum { RUNNING, PAUSED, WAITING };

/* Elastic: n = active + ready + repair.
 * Rigid:   n = (job - missing) + spare + repair; missing job chips are in repair. */
typedef struct {
  long n, active, ready, repair, spare, job, missing;
  int state;
  double since;     /* RUNNING: start of the segment */
  double pause_end; /* PAUSED: when the pause ends */
  double t_last;    /* last time out/paused chip-time was integrated */
  uint64_t epoch;   /* bumped when a pause is rescheduled */
  uint64_t token;   /* bumped when the upscale timer is cancelled */
  int armed;        /* an upscale timer is pending */
  double eta;       /* sync efficiency of this learner */
  double useful, straggler, lost, paused, out; /* chip-seconds */
} learner;

typedef struct {
  const goodput_params *p;
  rng r;
  heap h;
  learner *L;
  int M;
  double lambda;   /* cluster failure rate, 1/s */
  double horizon;  /* s */
  double repair;   /* s */
  double last_up;  /* last time uptime was integrated */
  double up_time;  /* wall time with >= K learners training */
  double learner_time; /* sum over learners of time training */
  long failures, absorbed, pauses, upscales;
  long rounds, stalled_rounds;
  double merged;   /* sum over rounds of merged / M */
  double *ends;    /* scratch for a round: pause ends, one per learner */
} sim;

static long healthy_job(const sim *s, const learner *l) { return s->p->elastic ? l->active : l->job - l->missing; }

static int is_training(const sim *s, const learner *l) { return l->state == RUNNING && healthy_job(s, l) > 0; }

/* Integrates out-of-service and paused chip-time of l up to now. */
static void integrate(sim *s, learner *l, double now) {
  double dt = now - l->t_last;
  if (dt <= 0) return;
  l->out += (double)(l->repair + l->ready + l->spare) * dt;
  if (l->state != RUNNING) l->paused += (double)healthy_job(s, l) * dt;
  l->t_last = now;
}

/* Integrates uptime up to now. */
static void integrate_uptime(sim *s, double now) {
  double dt = now - s->last_up;
  if (dt <= 0) return;
  int n = 0;
  for (int m = 0; m < s->M; m++) n += is_training(s, &s->L[m]);
  if (n >= s->p->quorum) s->up_time += dt;
  s->learner_time += dt * n;
  s->last_up = now;
}

/* Work a failure discards from a running segment of length seg. */
static double lost_work(const sim *s, double seg) {
  const goodput_params *p = s->p;
  if (p->elastic) return fmod(seg, p->step_s);
  if (s->M == 1) return fmod(seg, p->ckpt_s);
  /* A rigid learner adopts a peer's state: each fragment's progress since its
   * last merge is lost; the P fragments' last merges are spread over H steps. */
  double w = p->inner_steps * p->step_s;
  return seg >= w ? w / 2 : seg - seg * seg / (2 * w);
}

/* Closes the running segment of l at now; lossy: a failure ended it. */
static void close_segment(sim *s, learner *l, double now, int lossy) {
  double seg = now - l->since;
  double lost = lossy ? lost_work(s, seg) : 0.0;
  double chips = (double)healthy_job(s, l);
  l->lost += chips * lost;
  l->useful += chips * (seg - lost) * l->eta;
  l->straggler += chips * (seg - lost) * (1.0 - l->eta);
}

static double failure_pause(const sim *s) {
  const goodput_params *p = s->p;
  if (p->elastic) return p->t_detect + p->t_reconfig;
  return p->t_detect + p->t_restart + (s->M > 1 ? p->t_peer : 0.0);
}

static int start_pause(sim *s, int m, double now, double len) {
  learner *l = &s->L[m];
  l->state = PAUSED;
  l->pause_end = now + len;
  l->epoch++;
  s->pauses++;
  event e = {.t = l->pause_end, .type = EV_PAUSE_END, .learner = m, .tag = l->epoch};
  return heap_push(&s->h, e);
}

static int schedule_return(sim *s, int m, double now, long chips) {
  event e = {.t = now + s->repair, .type = EV_RETURN, .learner = m, .chips = chips};
  return heap_push(&s->h, e);
}

/* Takes one unit (or what is left) out of *from. */
static long take(long *from, long unit) {
  long u = *from < unit ? *from : unit;
  *from -= u;
  return u;
}

/* One chip failure at now on chip c of the cluster. */
static int on_failure(sim *s, double now, long c) {
  const goodput_params *p = s->p;
  long base = p->chips / s->M, extra = p->chips % s->M;
  long big = extra * (base + 1);
  int m = c < big ? (int)(c / (base + 1)) : (int)(extra + (c - big) / base);
  long off = c < big ? c % (base + 1) : (c - big) % base;
  learner *l = &s->L[m];
  integrate(s, l, now);
  s->failures++;

  /* The chip's position picks its state: [repair | ready or spare | training]. */
  if (off < l->repair) {
    s->absorbed++;
    return GOODPUT_OK;
  }
  off -= l->repair;
  long *idle = p->elastic ? &l->ready : &l->spare;
  if (off < *idle) {
    long u = take(idle, p->unit_chips);
    l->repair += u;
    return schedule_return(s, m, now, u);
  }

  /* A training (or pausing) chip: a running segment ends before the unit goes. */
  int was_running = l->state == RUNNING;
  if (was_running) close_segment(s, l, now, 1);
  long u;
  if (p->elastic) {
    u = take(&l->active, p->unit_chips);
  } else {
    long healthy = l->job - l->missing;
    u = take(&healthy, p->unit_chips);
    l->missing += u;
  }
  l->repair += u;
  int rc = schedule_return(s, m, now, u);
  if (rc) return rc;
  if (was_running || (l->state == PAUSED && !p->coalesce)) return start_pause(s, m, now, failure_pause(s));
  return GOODPUT_OK; /* folded into the pause (or the wait for spares) in progress */
}

static void resume(learner *l, double now) {
  l->state = RUNNING;
  l->since = now;
}

static int on_pause_end(sim *s, const event *e) {
  learner *l = &s->L[e->learner];
  if (e->tag != l->epoch || l->state != PAUSED) return GOODPUT_OK;
  integrate(s, l, e->t);
  if (s->p->elastic) {
    /* The reconfiguration also takes in every repaired unit. */
    l->active += l->ready;
    l->ready = 0;
    l->armed = 0;
    l->token++;
    resume(l, e->t);
  } else if (l->spare >= l->missing) {
    l->spare -= l->missing;
    l->missing = 0;
    resume(l, e->t);
  } else {
    l->state = WAITING; /* no hot spare left: wait for a repair */
  }
  return GOODPUT_OK;
}

static int on_return(sim *s, const event *e) {
  const goodput_params *p = s->p;
  learner *l = &s->L[e->learner];
  integrate(s, l, e->t);
  l->repair -= e->chips;
  if (!p->elastic) {
    l->spare += e->chips;
    if (l->state == WAITING && l->spare >= l->missing) {
      l->spare -= l->missing;
      l->missing = 0;
      resume(l, e->t);
    }
    return GOODPUT_OK;
  }
  l->ready += e->chips;
  if (l->state == RUNNING && !l->armed) {
    l->armed = 1;
    event u = {.t = e->t + p->upscale_wait, .type = EV_UPSCALE, .learner = e->learner, .tag = l->token};
    return heap_push(&s->h, u);
  }
  return GOODPUT_OK;
}

/* No failure gave the repaired units a ride: pause just to add them. */
static int on_upscale(sim *s, const event *e) {
  learner *l = &s->L[e->learner];
  if (e->tag != l->token || !l->armed) return GOODPUT_OK;
  l->armed = 0;
  if (l->state != RUNNING || l->ready == 0) return GOODPUT_OK;
  integrate(s, l, e->t);
  close_segment(s, l, e->t, 0); /* planned at a step boundary: nothing lost */
  s->upscales++;
  return start_pause(s, e->learner, e->t, s->p->t_upscale);
}

/* One merge round of the syncer at t0 (M > 1). Quorum is reached when the
 * K-th learner is training; the grace window then admits learners whose
 * pause ends within it. */
static void sync_round(sim *s, double t0) {
  const goodput_params *p = s->p;
  int M = s->M, K = p->quorum, running = 0, npaused = 0;
  double *ends = s->ends;
  for (int m = 0; m < M; m++) {
    const learner *l = &s->L[m];
    if (is_training(s, l)) running++;
    else if (l->state == PAUSED) ends[npaused++] = l->pause_end;
  }
  /* Sort the known pause ends (M is small). */
  for (int i = 1; i < npaused; i++)
    for (int j = i; j > 0 && ends[j] < ends[j - 1]; j--) {
      double t = ends[j];
      ends[j] = ends[j - 1];
      ends[j - 1] = t;
    }
  s->rounds++;
  double tq = t0;
  if (running < K) {
    s->stalled_rounds++;
    if (running + npaused < K) return; /* quorum waits on a repair: nothing merged in time */
    tq = ends[K - running - 1];
  }
  double grace = p->gamma * (p->tau * p->step_s - (tq - t0) - p->t_sync);
  if (grace < 0) grace = 0;
  int merged = running;
  for (int i = 0; i < npaused; i++) merged += ends[i] <= tq + grace;
  s->merged += (double)merged / M;
}

/* Units in repair at time 0, as if the cluster had been running for ever:
 * Poisson many, with residual repair times uniform over the repair time. */
static int warm_start(sim *s, int m) {
  const goodput_params *p = s->p;
  learner *l = &s->L[m];
  double mean = (double)l->n / (p->mtbf_chip_h * 3600.0) * s->repair;
  long k = rng_poisson(&s->r, mean);
  for (long i = 0; i < k; i++) {
    long *from = p->elastic ? &l->active : &l->spare;
    if (*from == 0) break;
    long u = take(from, p->unit_chips);
    l->repair += u;
    event e = {.t = rng_unif(&s->r) * s->repair, .type = EV_RETURN, .learner = m, .chips = u};
    int rc = heap_push(&s->h, e);
    if (rc) return rc;
  }
  return GOODPUT_OK;
}

/* Rigid learners keep a pool of hot spares: the expected units in repair plus
 * three standard deviations. The job runs on the rest. */
static long spare_reserve(const goodput_params *p, long n, double repair_s) {
  double mu = (double)n / (p->mtbf_chip_h * 3600.0) * repair_s;
  double units = ceil(mu + 3.0 * sqrt(mu));
  double chips = units * (double)p->unit_chips;
  return chips >= (double)n ? n : (long)chips;
}

static int init(sim *s, const goodput_params *p, char *err, size_t errlen) {
  memset(s, 0, sizeof *s);
  s->p = p;
  s->M = p->learners;
  s->lambda = (double)p->chips / (p->mtbf_chip_h * 3600.0);
  s->horizon = p->horizon_h * 3600.0;
  s->repair = p->repair_h * 3600.0;
  rng_seed(&s->r, p->seed);
  s->L = calloc((size_t)s->M, sizeof *s->L);
  s->ends = calloc((size_t)s->M, sizeof *s->ends);
  if (!s->L || !s->ends) {
    if (err && errlen) snprintf(err, errlen, "out of memory for %d learners", s->M);
    return GOODPUT_ENOMEM;
  }
  long base = p->chips / s->M, extra = p->chips % s->M;
  double eta_base = sync_efficiency(p->jitter, base);
  double eta_big = extra ? sync_efficiency(p->jitter, base + 1) : eta_base;
  for (int m = 0; m < s->M; m++) {
    learner *l = &s->L[m];
    l->n = base + (m < extra);
    l->eta = m < extra ? eta_big : eta_base;
    if (p->elastic) {
      l->active = l->n;
    } else {
      long reserve = spare_reserve(p, l->n, s->repair);
      if (reserve >= l->n) {
        if (err && errlen)
          snprintf(err, errlen, "a rigid learner of %ld chips cannot keep its spare pool of %ld chips", l->n,
                   reserve);
        return GOODPUT_EINVAL;
      }
      l->job = l->n - reserve;
      l->spare = reserve;
    }
    l->state = RUNNING;
    int rc = warm_start(s, m);
    if (rc) {
      if (err && errlen) snprintf(err, errlen, "out of memory for the event queue");
      return rc;
    }
  }
  return GOODPUT_OK;
}

static void finish(sim *s, goodput_result *r) {
  const goodput_params *p = s->p;
  integrate_uptime(s, s->horizon);
  double useful = 0, strag = 0, lost = 0, paused = 0, out = 0;
  for (int m = 0; m < s->M; m++) {
    learner *l = &s->L[m];
    integrate(s, l, s->horizon);
    if (l->state == RUNNING) close_segment(s, l, s->horizon, 0);
    useful += l->useful;
    strag += l->straggler;
    lost += l->lost;
    paused += l->paused;
    out += l->out;
  }
  double total = (double)p->chips * s->horizon;
  r->goodput = useful / total;
  r->frac_useful = useful / total;
  r->frac_straggler = strag / total;
  r->frac_lost = lost / total;
  r->frac_paused = paused / total;
  r->frac_out = out / total;
  r->uptime = s->up_time / s->horizon;
  r->learner_up = s->learner_time / (s->horizon * s->M);
  r->failures = s->failures;
  r->absorbed = s->absorbed;
  r->pauses = s->pauses;
  r->upscales = s->upscales;
  r->rounds = s->rounds;
  r->stalled = s->rounds ? (double)s->stalled_rounds / (double)s->rounds : 0.0;
  r->participation = s->rounds ? s->merged / (double)s->rounds : 1.0;
  double g = p->gamma * (p->tau * p->step_s - p->t_sync);
  r->grace_s = g > 0 ? g : 0;
}

int goodput_simulate(const goodput_params *p, goodput_result *r, char *err, size_t errlen) {
  if (!r) return fail(err, errlen, "result is NULL");
  memset(r, 0, sizeof *r);
  int rc = goodput_validate(p, err, errlen);
  if (rc) return rc;
  sim s;
  rc = init(&s, p, err, errlen);
  /* Merge rounds: one fragment every H*step/P seconds. */
  double round_dt = p->inner_steps * p->step_s / p->fragments;
  double next_round = s.M > 1 ? round_dt : INFINITY;
  double next_fail = rng_exp(&s.r, s.lambda);
  while (rc == GOODPUT_OK) {
    double t_heap = s.h.n ? s.h.a[0].t : INFINITY;
    double t = fmin(next_fail, fmin(next_round, t_heap));
    if (t > s.horizon) break;
    integrate_uptime(&s, t);
    if (t == t_heap) {
      event e = heap_pop(&s.h);
      if (e.type == EV_PAUSE_END) rc = on_pause_end(&s, &e);
      else if (e.type == EV_RETURN) rc = on_return(&s, &e);
      else rc = on_upscale(&s, &e);
    } else if (t == next_fail) {
      long c = (long)(rng_unif(&s.r) * (double)p->chips);
      rc = on_failure(&s, t, c);
      next_fail = t + rng_exp(&s.r, s.lambda);
    } else {
      sync_round(&s, t);
      next_round = t + round_dt;
    }
  }
  if (rc == GOODPUT_ENOMEM && err && errlen) snprintf(err, errlen, "out of memory for the event queue");
  if (rc == GOODPUT_OK) finish(&s, r);
  free(s.h.a);
  free(s.L);
  free(s.ends);
  return rc;
}

/* ---- closed form ------------------------------------------------------- */

/* Expected useful running time of an up period X ~ Exp(rate) under the model's
 * loss rule (see lost_work). */
static double useful_per_cycle(const goodput_params *p, double rate) {
  if (p->elastic || p->learners == 1) {
    /* Completed steps (or snapshots) of length s: s * sum_k P(X >= k s). */
    double sl = p->elastic ? p->step_s : p->ckpt_s;
    return sl / expm1(rate * sl);
  }
  double w = p->inner_steps * p->step_s, e = exp(-rate * w), x = rate * w;
  double below = (2.0 / (rate * rate)) * (1.0 - e * (1.0 + x + x * x / 2.0)) / (2.0 * w);
  return below + e * (w / 2.0 + 1.0 / rate);
}

static double binom_tail(int M, int K, double up) {
  double sum = 0.0;
  for (int j = K; j <= M; j++) {
    double c = 1.0;
    for (int i = 0; i < j; i++) c = c * (M - i) / (i + 1);
    sum += c * pow(up, j) * pow(1.0 - up, M - j);
  }
  return sum;
}

int goodput_closed_form(const goodput_params *p, double *goodput, double *uptime, char *err, size_t errlen) {
  int rc = goodput_validate(p, err, errlen);
  if (rc) return rc;
  double repair = p->repair_h * 3600.0;
  long n = p->chips / p->learners;
  double lam = (double)n / (p->mtbf_chip_h * 3600.0); /* one learner's failures, 1/s */
  /* Training chips: elastic loses the units in repair (each unit alternates
   * between Exp(MTBF/unit) in service and R in repair), rigid its spare pool. */
  double x = (double)p->unit_chips * repair / (p->mtbf_chip_h * 3600.0);
  double train = p->elastic ? 1.0 / (1.0 + x) : 1.0 - (double)spare_reserve(p, n, repair) / (double)n;
  double rate = lam * train; /* failures that stop the learner */
  if (lam == 0) { /* chips never fail */
    if (goodput) *goodput = train * sync_efficiency(p->jitter, n);
    if (uptime) *uptime = 1.0;
    return GOODPUT_OK;
  }
  double d = p->elastic ? p->t_detect + p->t_reconfig
                        : p->t_detect + p->t_restart + (p->learners > 1 ? p->t_peer : 0.0);
  /* Dedicated upscales per second of running (elastic, repairs > 0): a return
   * arms the timer after ~1/rate idle; the timer fires unless a failure comes
   * first within upscale_wait. Approximate: pauses are taken as short. */
  double nu = 0.0;
  if (p->elastic && repair > 0) {
    double miss = exp(-rate * p->upscale_wait);
    nu = rate * miss / (2.0 - miss);
  }
  /* Pauses per second of running: failures (d each) and upscales. */
  double up = 1.0 / (1.0 + rate * d + nu * p->t_upscale);
  if (goodput) *goodput = train * sync_efficiency(p->jitter, n) * useful_per_cycle(p, rate) * rate * up;
  if (uptime) *uptime = binom_tail(p->learners, p->quorum, up);
  return GOODPUT_OK;
}
