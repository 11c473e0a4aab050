/* One training run (see train.h): every rank builds the same model, samples
 * its own shard, runs forward and backward on its local batch and calls
 * distro_optim_step, which does all the communication. */
#include "train.h"
#include "tensor_log.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef DISTRO_WITH_MPI
#include <distro/mpi.h>
#endif

#include "checkpoint.h"
#include "clip.h"
#include "eval.h"
#include "util.h"

#define PI 3.14159265358979323846

/* One step's figures on this rank, until the batch's all-reduce (below). */
enum { LOG_BATCH = 32 };
typedef struct {
  int step;
  float lr, loss, gnorm;
  uint64_t sent, recv;
  double dt, optim_s, exch_s, outer_s, exch_bg_s, elapsed;
} step_rec;

typedef struct {
  const train_config *cfg;
  const gpt_corpus *data;
  FILE *out;
  train_result *res;
  int threads; /* OpenMP threads per rank */
  /* DiLoCo: per world rank, its learner's and its column's communicators */
  distro_comm **inner_comms, **outer_comms;
} run_ctx;

/* Linear warm-up to lr, then cosine down to lr * lr_final at the last step. */
static float lr_at(const train_config *c, int step) {
  if (step < c->warmup) return c->lr * (float)(step + 1) / (float)c->warmup;
  const int span = c->steps - c->warmup;
  const double progress = span > 0 ? (double)(step - c->warmup) / span : 1.0;
  return c->lr * (float)(c->lr_final + (1.0 - c->lr_final) * 0.5 * (1.0 + cos(PI * progress)));
}

/* The per-step optimizer: DiLoCo's inner one, or the only one. */
gpt_optim_kind step_optim_kind(const train_config *c) {
  return c->optim == GPT_OPT_DILOCO || c->optim == GPT_OPT_DECOUPLED ? c->inner : c->optim;
}

#ifdef DISTRO_WITH_SYNC
/* The learner's event lines (join, syncer silent, errors) go to stderr. */
static void learner_log(void *ctx, const char *line) {
  (void)ctx;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  fprintf(stderr, "[%.3f] %s\n", (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec, line);
}
#endif

static double unix_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_ms(double ms) {
  if (ms <= 0) return;
  struct timespec ts = {(time_t)(ms / 1000), (long)(fmod(ms, 1000.0) * 1e6)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static distro_options make_options(const train_config *c) {
  const gpt_optim_kind k = step_optim_kind(c);
  distro_options o = distro_options_default(k == GPT_OPT_ADAMW ? DISTRO_ALG_ADAMW : DISTRO_ALG_DEMO);
  o.lr = c->lr;
  o.beta1 = c->beta1;
  o.beta2 = c->beta2;
  o.weight_decay = c->wd;
  if (k != GPT_OPT_ADAMW) {
    o.update = k == GPT_OPT_DISTRO ? DISTRO_UPDATE_SIGN : DISTRO_UPDATE_ADAMW;
    o.topk = c->topk;
    o.chunk = c->chunk;
    o.compression_decay = c->decay;
    o.values = c->values;
    o.overlap = c->overlap_step;
  }
  /* --clip-per-tensor: the library clips each tensor as the step reads it
   * (or, with the gradient-ready exchange, as it is marked ready). */
  if (c->clip_each) o.clip_norm = c->clip;
  return o;
}

/* gpt_backward_hooked's hook for --overlap-backward: tensors [first,
 * first + count) have their final gradient; the optimizer may send them. */
typedef struct {
  const gpt_model *m;
  distro_optim *opt;
  float lr;
  distro_status st; /* the first failure */
  char err[512];
} mark_ready;

static void mark_ready_hook(void *arg, int first, int count) {
  mark_ready *r = arg;
  for (int t = first; t < first + count && r->st == DISTRO_OK; t++)
    if ((r->st = distro_optim_grad_ready(r->opt, r->m->tensors[t].name, r->lr)) != DISTRO_OK)
      snprintf(r->err, sizeof r->err, "%s", distro_last_error());
}

static ckpt_meta make_meta(const train_config *c, int world) {
  ckpt_meta k;
  memset(&k, 0, sizeof k);
  k.model = c->model;
  k.optim = (int32_t)c->optim;
  k.world = world;
  k.topk = c->topk;
  k.chunk = c->chunk;
  k.values = (int32_t)c->values;
  return k;
}

/* Bytes: this rank's, in this step and since the start. */
static void print_progress(const run_ctx *x, int step, float loss, double val, double tok_s,
                           const distro_step_stats *st, uint64_t tot_sent, uint64_t tot_recv, double elapsed,
                           double eta, const char *extra) {
  const train_config *c = x->cfg;
  char b1[32], b2[32], b3[32], b4[32], d1[32], d2[32];
  FILE *o = x->out;
  if (c->label) fprintf(o, "[%s] ", c->label);
  fprintf(o, "step %*d/%d | loss %.4f", (int)snprintf(NULL, 0, "%d", c->steps), step, c->steps, loss);
  if (!isnan(val)) fprintf(o, " | val %.4f", val);
  fprintf(o, " | %.0f tok/s | sent %s recv %s (total %s / %s)%s | %s elapsed, ETA %s\n", tok_s,
          fmt_bytes(b1, sizeof b1, (double)st->bytes_sent), fmt_bytes(b2, sizeof b2, (double)st->bytes_received),
          fmt_bytes(b3, sizeof b3, (double)tot_sent), fmt_bytes(b4, sizeof b4, (double)tot_recv), extra,
          fmt_duration(d1, sizeof d1, elapsed), fmt_duration(d2, sizeof d2, eta));
  fflush(o);
}

/* --overlap-step: waits for the exchange in flight and applies it (every
 * rank), and adds its bytes, summed over the ranks, to the totals. Returns
 * 0, or -1 with err set. */
static int flush_step(distro_optim *opt, distro_comm *comm, uint64_t *tot_sent, uint64_t *tot_recv, char *err,
                      size_t errn) {
  distro_step_stats st;
  distro_status s = distro_optim_flush(opt, &st);
  if (s != DISTRO_OK) {
    snprintf(err, errn, "distro_optim_flush: %s: %s", distro_status_string(s), distro_last_error());
    return -1;
  }
  float red[4] = {(float)(st.bytes_sent >> 16), (float)(st.bytes_sent & 0xffff), (float)(st.bytes_received >> 16),
                  (float)(st.bytes_received & 0xffff)};
  if (distro_comm_allreduce_sum(comm, red, 4) != DISTRO_OK) {
    snprintf(err, errn, "all-reduce of the byte counts failed: %s", distro_last_error());
    return -1;
  }
  *tot_sent += ((uint64_t)red[0] << 16) + (uint64_t)red[1];
  *tot_recv += ((uint64_t)red[2] << 16) + (uint64_t)red[3];
  return 0;
}

#define FAIL(...)                                 \
  do {                                            \
    snprintf(err, sizeof err, __VA_ARGS__);       \
    ok = 0;                                       \
  } while (0)

#define EVAL(count)                                                                          \
  (dl ? evaluate_global(&m, dl, scratch, x->data, comm, (count), inp, tgt) \
      : evaluate(&m, x->data, comm, (count), inp, tgt))

static distro_status rank_main(distro_comm *comm, int rank, void *arg) {
  run_ctx *x = arg;
  const train_config *c = x->cfg;
  const int world = distro_comm_size(comm), B = c->batch, T = c->model.context;
  const int lead = rank == 0;
  train_result *res = x->res;
  char err[1024] = "";
  int ok = 1;
  gpt_model m;
  distro_optim *opt = NULL;
  distro_diloco *dl = NULL;
#ifdef DISTRO_WITH_SYNC
  distro_learner *lrn = NULL;
  distro_learner_stats ls;
  memset(&ls, 0, sizeof ls);
  ls.goodput = 1;
#endif
  const int decoupled = c->optim == GPT_OPT_DECOUPLED;
  real *scratch = NULL; /* DiLoCo: the local parameters while the global copy is evaluated */
  FILE *log = NULL;
  gpt_tensor_log *tlog = NULL;
  uint8_t *inp = malloc((size_t)B * T), *tgt = malloc((size_t)B * T);
  distro_status s = DISTRO_OK;
  /* The optimizer's communicator: the world, or with DiLoCo this rank's learner. */
  distro_comm *icomm = x->inner_comms ? x->inner_comms[rank] : comm;
  distro_comm *ocomm = x->outer_comms ? x->outer_comms[rank] : NULL;

  /* --comm-timeout: every collective of this rank (the optimizer's, DiLoCo's
   * and the trainer's own) gives up after that long, so a stalled peer ends
   * the run with the library's message instead of a hang. The library then
   * completes MPI collectives by polling, not in MPI_Wait. Before the
   * optimizer exists, so that its private duplicate inherits the timeout. */
  if (c->comm_timeout > 0) {
    distro_comm *cs[3] = {comm, icomm != comm ? icomm : NULL, ocomm};
    for (int i = 0; ok && i < 3; i++)
      if (cs[i] && (s = distro_comm_set_timeout(cs[i], c->comm_timeout)) != DISTRO_OK)
        FAIL("--comm-timeout: %s: %s", distro_status_string(s), distro_last_error());
  }

  /* Threads: this rank thread gets its own OpenMP team size (the setting is
   * per thread, so in-process ranks do not share it). */
  omp_set_num_threads(x->threads);

  /* Setup: the same initial weights on every rank (same seed). */
  memset(&m, 0, sizeof m);
  const distro_options o = make_options(c);
  if (!inp || !tgt || gpt_init(&m, &c->model, B, c->seed) != 0) FAIL("out of memory for the model");
  if (ok && (s = distro_optim_create(&o, icomm, &opt)) != DISTRO_OK)
    FAIL("distro_optim_create: %s: %s", distro_status_string(s), distro_last_error());
  for (int i = 0; ok && i < m.ntensors; i++) {
    const gpt_tensor *t = &m.tensors[i];
    s = distro_optim_add_param(opt, t->name, m.params + t->offset, m.grads + t->offset, t->ndim, t->shape);
    if (s != DISTRO_OK) FAIL("distro_optim_add_param: %s: %s", distro_status_string(s), distro_last_error());
  }
  if (ok && c->optim == GPT_OPT_DILOCO) {
    if (!(scratch = malloc(sizeof(real) * m.nparams))) FAIL("out of memory for the model");
    else if ((s = distro_diloco_create(&c->diloco, opt, ocomm, &dl)) != DISTRO_OK)
      FAIL("distro_diloco_create: %s: %s", distro_status_string(s), distro_last_error());
    const int radial = c->diloco.merge == DISTRO_MERGE_RADIAL || c->diloco.merge == DISTRO_MERGE_RADIAL_TOKENS;
    for (int i = 0; ok && radial && i < m.ntensors; i++) {
      /* Embedding rows that a window never touched have no direction to average. */
      const char *name = m.tensors[i].name;
      if (strcmp(name, "wte") && strcmp(name, "wpe") && strcmp(name, "head")) continue;
      if ((s = distro_diloco_set_tensor(dl, name, -1, DISTRO_DILOCO_PLAIN_MERGE)) != DISTRO_OK)
        FAIL("distro_diloco_set_tensor: %s: %s", distro_status_string(s), distro_last_error());
    }
  }
#ifdef DISTRO_WITH_SYNC
  if (ok && decoupled) {
    /* The learner's ranks are this run's ranks; rank 0 talks to the syncer. */
    distro_learner_options lo = distro_learner_options_default();
    lo.syncer = c->syncer;
    lo.learner_id = c->learner_id;
    if (c->serve_endpoint) lo.serve_endpoint = c->serve_endpoint;
    lo.curve_server_key = c->curve_server_key;
    lo.curve_keypair = c->curve_keypair;
    lo.insecure = c->insecure;
    if (c->sync_timeout > 0) lo.timeout_s = c->sync_timeout;
    lo.comm = comm;
    lo.log = learner_log;
    lo.tokens_per_step = (uint64_t)world * B * T; /* every rank's B x T tokens per step, declared at HELLO */
    if (!(scratch = malloc(sizeof(real) * m.nparams))) FAIL("out of memory for the model");
    else if ((s = distro_learner_create(&lo, &lrn)) != DISTRO_OK)
      FAIL("distro_learner_create: %s: %s", distro_status_string(s), distro_last_error());
    for (int i = 0; ok && i < m.ntensors; i++) {
      /* Embedding rows that a window never touched have no direction to average (radial merges). */
      const gpt_tensor *t = &m.tensors[i];
      const unsigned fl =
          !strcmp(t->name, "wte") || !strcmp(t->name, "wpe") || !strcmp(t->name, "head") ? DISTRO_DILOCO_PLAIN_MERGE : 0;
      if ((s = distro_learner_add_tensor(lrn, t->name, m.params + t->offset, (int64_t)t->numel, fl)) != DISTRO_OK)
        FAIL("distro_learner_add_tensor: %s: %s", distro_status_string(s), distro_last_error());
    }
  }
  /* Collective: every rank joins (or fails) together. */
  if (first_failed_rank(comm, ok) == -1 && decoupled) {
    if ((s = distro_learner_start(lrn)) != DISTRO_OK)
      FAIL("distro_learner_start (learner %d, syncer %s): %s: %s", c->learner_id, c->syncer, distro_status_string(s),
           distro_last_error());
    else if (lead && !c->quiet) {
      distro_learner_get_stats(lrn, &ls);
      if (c->label) fprintf(x->out, "[%s] ", c->label);
      fprintf(x->out, "learner %d joined the syncer at %s (%s), %d fragment(s)\n", c->learner_id, c->syncer,
              ls.joined_from_peer == 1   ? "state pulled from a peer"
              : ls.joined_from_peer == 2 ? "state fetched from the syncer"
                                         : "seeded the syncer",
              distro_learner_fragments(lrn));
      fflush(x->out);
    }
  }
#else
  if (decoupled) FAIL("--optim decoupled: this build has no syncer (libzmq was not found)");
#endif
  if (ok && lead && c->log_path) {
    log = fopen(c->log_path, c->resume_path ? "a" : "w");
    if (!log) FAIL("cannot open log file '%s'", c->log_path);
  }
  if (ok && lead && c->tensor_log_path &&
      !(tlog = gpt_tensor_log_open(c->tensor_log_path, c->resume_path != NULL, &m, err, sizeof err)))
    ok = 0;
  int who = first_failed_rank(comm, ok);
  if (who == -2) who = 0;
  if (who != -1) goto done;

  /* Resume: parameters, this rank's optimizer state and RNG, the step. */
  const ckpt_meta meta = make_meta(c, world);
  size_t lo, hi;
  corpus_shard(x->data, rank, world, c->sampling, &lo, &hi);
  /* The data order: seed and rank only (a decoupled learner: also its id and first step). */
  gpt_rng rng = rng_make(c->seed, 1000 + (uint64_t)rank +
                                      (decoupled ? 100000 * (uint64_t)(c->learner_id + 1) +
                                                       10000000 * (uint64_t)c->start_step
                                                 : 0));
  int64_t start = decoupled ? c->start_step : 0;
  if (c->resume_path) {
    who = checkpoint_load(comm, c->resume_path, &meta, &start, &m, opt, &rng.s, err, sizeof err);
    if (who != -1) goto done;
    if (start > c->steps) {
      FAIL("checkpoint '%s' is at step %lld, beyond --steps %d", c->resume_path, (long long)start, c->steps);
      who = 0;
      goto done;
    }
  }
  if (log && fseek(log, 0, SEEK_END) == 0 && ftell(log) == 0) /* new file (a resume appends) */
    fprintf(log, "step,lr,train_loss,val_loss,grad_norm,tokens,bytes_sent,bytes_recv,total_sent,total_recv,"
                 "step_s,optim_s,exchange_s,elapsed_s%s,outer_s,exchange_bg_s\n",
            decoupled ? ",unix_s,applies,reports,goodput,learner_tokens,bytes_up,bytes_down,useful_s,wasted_s,pending_s" : "");

  const int stop = c->stop_after > 0 && c->stop_after < c->steps ? c->stop_after : c->steps;
  const size_t eval_count = (size_t)c->eval_batches * (size_t)B;
  const double tokens_per_step = (double)world * B * T;
  uint64_t tot_sent = 0, tot_recv = 0; /* all ranks */
  uint64_t my_sent = 0, my_recv = 0;   /* this rank */
  double t_begin = gpt_now(), step_sum = 0, optim_sum = 0, exch_sum = 0;
  double iv_tokens = 0, iv_time = 0, peak_sent = 0;
  float loss_mean = NAN;
  step_rec pend[LOG_BATCH]; /* steps whose log figures are not reduced yet */
  float logred[7 * LOG_BATCH];
  int npend = 0;
  int timed_out = 0;
  if (lead) {
    res->nevals = 0;
    res->world = world;
    res->nparams = m.nparams;
  }

  if (start == 0 && c->eval_every > 0) { /* the starting point of the validation curve */
    const double v0 = EVAL(eval_count);
    if (lead) {
      res->eval_step[res->nevals] = 0;
      res->eval_loss[res->nevals++] = v0;
    }
  }
  for (int step = (int)start; step < stop; step++) {
    const double t0 = gpt_now();
    corpus_sample(x->data, lo, hi, &rng, B, T, inp, tgt);
    const float loss = (float)gpt_forward(&m, inp, tgt, B, T);
    gpt_zero_grad(&m);
    const float lr = lr_at(c, step);
    float gnorm = NAN;
    if (c->overlap_step == DISTRO_OVERLAP_BACKWARD) {
      mark_ready mr = {&m, opt, lr, DISTRO_OK, ""};
      gpt_backward_hooked(&m, mark_ready_hook, &mr);
      if (mr.st != DISTRO_OK) {
        FAIL("step %d: distro_optim_grad_ready: %s: %s", step + 1, distro_status_string(mr.st), mr.err);
        who = 0;
        goto done;
      }
    } else {
      gpt_backward(&m);
    }
    const int lib_clips = c->clip_each && c->clip > 0; /* options.clip_norm: it measures the norm too */
    if (!lib_clips) gnorm = gpt_clip_global(&m, c->clip); /* with --clip-per-tensor, clip 0: the norm only */
    const int tlogs = tlog && (step + 1) % c->tensor_every == 0;
    if (tlogs) gpt_tensor_log_before(tlog, &m);
    distro_step_stats st;
    double outer_s = 0; /* DiLoCo's outer sync on this thread (part of optim_s) */
    if (dl) {
      /* The learners' traffic counts as the step's: inner plus outer. */
      distro_diloco_stats ds;
      s = distro_diloco_step(dl, lr, (uint64_t)B * T, &ds);
      st = ds.inner;
      st.bytes_sent += ds.outer_bytes_sent;
      st.bytes_received += ds.outer_bytes_received;
      st.seconds_total += ds.seconds_outer;
      outer_s = ds.seconds_outer;
    } else {
      s = distro_optim_step(opt, lr, &st);
    }
#ifdef DISTRO_WITH_SYNC
    if (lrn && s == DISTRO_OK) {
      sleep_ms(c->step_delay_ms);
      s = distro_learner_step(lrn, (uint64_t)B * T, &ls);
    }
#endif
    if (s != DISTRO_OK) { /* every rank fails together: report once */
      FAIL("step %d: %s: %s: %s", step + 1, dl ? "distro_diloco_step" : decoupled ? "distro_optim_step or distro_learner_step" : "distro_optim_step",
           distro_status_string(s), distro_last_error());
      who = 0;
      goto done;
    }
    double lib_norm;
    if (lib_clips && distro_optim_grad_norm(opt, &lib_norm) == DISTRO_OK) gnorm = (float)lib_norm;
    if (tlogs) gpt_tensor_log_after(tlog, &m, step + 1, lr); /* a failed write shows at the close */
    const double dt = gpt_now() - t0;
    step_sum += dt;
    optim_sum += st.seconds_total;
    exch_sum += st.seconds_exchange;
    my_sent += st.bytes_sent;
    my_recv += st.bytes_received;
    iv_tokens += tokens_per_step;
    iv_time += dt;
    const int done_steps = step + 1;

    /* The loss and gradient norm averaged over ranks, and each step's bytes
     * summed over ranks (payload sizes vary with the data), for the log.
     * They are reduced in one collective per batch of steps, not one per
     * step: with an overlapped exchange on a slow link, a per-step
     * collective would queue behind the exchange's traffic and expose it
     * again. A batch ends at every step that prints, validates or saves, at
     * the last step and after LOG_BATCH steps; with one rank, a learner
     * (logs read while it runs) or --time-limit, at every step. */
    step_rec *r = &pend[npend++];
    r->step = done_steps;
    r->lr = lr;
    r->loss = loss;
    r->gnorm = gnorm;
    r->sent = st.bytes_sent;
    r->recv = st.bytes_received;
    r->dt = dt;
    r->optim_s = st.seconds_total;
    r->exch_s = st.seconds_exchange;
    r->outer_s = outer_s;
    r->exch_bg_s = st.seconds_exchange_bg;
    r->elapsed = gpt_now() - t_begin;
    const int evals = (c->eval_every > 0 && done_steps % c->eval_every == 0) || done_steps == stop;
    const int saves = c->save_path && ((c->save_every > 0 && done_steps % c->save_every == 0) || done_steps == stop);
    if (!(world == 1 || decoupled || c->time_limit > 0 || npend == LOG_BATCH || evals || saves || done_steps == stop ||
          done_steps % c->print_every == 0 || step == start))
      continue;

    /* The 7th: rank 0's clock says --time-limit is reached (all ranks stop at this step). */
    const int out_of_time = lead && c->time_limit > 0 && gpt_now() - t_begin >= c->time_limit;
    for (int i = 0; i < npend; i++) {
      float *q = logred + 7 * i;
      q[0] = pend[i].loss;
      q[1] = pend[i].gnorm;
      q[2] = (float)(pend[i].sent >> 16);
      q[3] = (float)(pend[i].sent & 0xffff);
      q[4] = (float)(pend[i].recv >> 16);
      q[5] = (float)(pend[i].recv & 0xffff);
      q[6] = i == npend - 1 ? (float)out_of_time : 0.0f;
    }
    if (distro_comm_allreduce_sum(comm, logred, (size_t)(7 * npend)) != DISTRO_OK) {
      FAIL("all-reduce of the loss failed: %s", distro_last_error());
      who = 0;
      goto done;
    }
    const int time_up = logred[7 * (npend - 1) + 6] > 0 && done_steps < stop;
    double val = NAN;
    if (evals || time_up) {
      val = EVAL(eval_count);
      if (lead && res->nevals < (int)(sizeof res->eval_step / sizeof *res->eval_step)) {
        res->eval_step[res->nevals] = done_steps;
        res->eval_loss[res->nevals++] = val;
      }
      pend[npend - 1].elapsed = gpt_now() - t_begin; /* the validation counts in the step that ran it */
    }
    char extra[160] = "";
#ifdef DISTRO_WITH_SYNC
    if (lrn) {
      char ls_line[40];
      snprintf(extra, sizeof extra, " | syncer: %llu applied, %llu reported, up %s, goodput %.3f",
               (unsigned long long)ls.applies, (unsigned long long)ls.reports,
               fmt_bytes(ls_line, sizeof ls_line, (double)ls.bytes_up), ls.goodput);
    }
#endif
    for (int i = 0; i < npend; i++) {
      const float *q = logred + 7 * i;
      const step_rec *p = &pend[i];
      loss_mean = q[0] / (float)world;
      const uint64_t step_sent = ((uint64_t)q[2] << 16) + (uint64_t)q[3];
      if ((double)step_sent / world > peak_sent) peak_sent = (double)step_sent / world;
      tot_sent += step_sent;
      tot_recv += ((uint64_t)q[4] << 16) + (uint64_t)q[5];
      if (!(lead && log)) continue;
      fprintf(log, "%d,%.9g,%.9g,%.9g,%.9g,%.0f,%llu,%llu,%llu,%llu,%.6f,%.6f,%.6f,%.3f", p->step, p->lr,
              loss_mean, i == npend - 1 ? val : NAN, q[1] / (float)world, (double)p->step * tokens_per_step,
              (unsigned long long)p->sent, (unsigned long long)p->recv, (unsigned long long)tot_sent,
              (unsigned long long)tot_recv, p->dt, p->optim_s, p->exch_s, p->elapsed);
#ifdef DISTRO_WITH_SYNC
      if (lrn) /* a learner's batch is one step: ls is this step's */
        fprintf(log, ",%.3f,%llu,%llu,%.6f,%llu,%llu,%llu,%.4f,%.4f,%.4f", unix_now(), (unsigned long long)ls.applies,
                (unsigned long long)ls.reports, ls.goodput, (unsigned long long)ls.tokens,
                (unsigned long long)ls.bytes_up, (unsigned long long)ls.bytes_down, ls.useful_s, ls.wasted_s,
                ls.pending_s);
#endif
      fprintf(log, ",%.6f,%.6f\n", p->outer_s, p->exch_bg_s);
    }
    npend = 0;
    if (lead && log && decoupled) fflush(log); /* a learner may be SIGKILLed: the launcher reads what it did */
    const double elapsed = gpt_now() - t_begin;
    if (lead && !c->quiet &&
        (done_steps % c->print_every == 0 || !isnan(val) || done_steps == stop || step == start || time_up)) {
      const double eta = elapsed / (done_steps - (double)start) * (stop - done_steps);
      print_progress(x, done_steps, loss_mean, val, iv_tokens / iv_time, &st, my_sent, my_recv, elapsed, eta,
                     extra);
      iv_tokens = iv_time = 0;
    }
    if (saves) {
      /* With --overlap-step the optimizer's state keeps the exchange in
       * flight (distro_optim_save), so saving does not change the run. */
      if (log) fflush(log); /* the log holds every step the checkpoint does */
      who = checkpoint_save(comm, c->save_path, &meta, done_steps, &m, opt, rng.s, err, sizeof err);
      if (who != -1) goto done;
      if (lead && !c->quiet) {
        if (c->label) fprintf(x->out, "[%s] ", c->label);
        fprintf(x->out, "saved %s (step %d)\n", c->save_path, done_steps);
      }
    }
    if (lead) res->steps_done = done_steps;
    if (time_up) {
      timed_out = 1;
      if (lead && !c->quiet) {
        if (c->label) fprintf(x->out, "[%s] ", c->label);
        fprintf(x->out, "time limit %.0f s reached after step %d\n", c->time_limit, done_steps);
      }
      break;
    }
  }


  /* --overlap-step: the last step's aggregate is still in flight. */
  if (c->overlap_step && flush_step(opt, comm, &tot_sent, &tot_recv, err, sizeof err) != 0) {
    ok = 0;
    who = 0;
    goto done;
  }

  /* The whole validation split, once training is complete. DiLoCo first
   * merges what every fragment learned since its last sync, so all learners
   * hold the same model (its bytes count too). */
  double final_val = NAN;
  if (dl && stop == c->steps) {
    distro_diloco_stats ds;
    s = distro_diloco_sync_all(dl, &ds);
    if (s != DISTRO_OK) {
      FAIL("distro_diloco_sync_all: %s: %s", distro_status_string(s), distro_last_error());
      who = 0;
      goto done;
    }
    float red[4] = {(float)(ds.outer_bytes_sent >> 16), (float)(ds.outer_bytes_sent & 0xffff),
                    (float)(ds.outer_bytes_received >> 16), (float)(ds.outer_bytes_received & 0xffff)};
    if (distro_comm_allreduce_sum(comm, red, 4) != DISTRO_OK) {
      FAIL("all-reduce of the byte counts failed: %s", distro_last_error());
      who = 0;
      goto done;
    }
    tot_sent += ((uint64_t)red[0] << 16) + (uint64_t)red[1];
    tot_recv += ((uint64_t)red[2] << 16) + (uint64_t)red[3];
  }
  double global_val = NAN;
  if (stop == c->steps || timed_out) {
    final_val = evaluate(&m, x->data, comm, corpus_val_windows(x->data, T), inp, tgt);
    if (lead && !c->quiet) {
      if (c->label) fprintf(x->out, "[%s] ", c->label);
      fprintf(x->out, "final val loss %.4f (whole validation split, %zu windows of %d bytes)%s\n", final_val,
              corpus_val_windows(x->data, T), T, decoupled ? ", this learner's parameters" : "");
    }
#ifdef DISTRO_WITH_SYNC
    if (lrn) {
      global_val = evaluate_learner(&m, lrn, scratch, x->data, comm, corpus_val_windows(x->data, T), inp, tgt);
      distro_learner_get_stats(lrn, &ls);
      if (lead && !c->quiet) {
        if (c->label) fprintf(x->out, "[%s] ", c->label);
        fprintf(x->out, "final val loss %.4f of the global copy as this learner last applied it; learner %d: "
                        "%lld steps, %llu fragments applied, %llu reported, goodput %.4f, %llu tokens\n",
                global_val, c->learner_id, (long long)ls.step, (unsigned long long)ls.applies,
                (unsigned long long)ls.reports, ls.goodput, (unsigned long long)ls.tokens);
      }
    }
#endif
  }
  if (lead && !c->quiet) { /* exact counts for launchers (bench/wan), the final DiLoCo merge included */
    if (c->label) fprintf(x->out, "[%s] ", c->label);
    fprintf(x->out, "library bytes, all ranks: sent %llu, received %llu", (unsigned long long)tot_sent,
            (unsigned long long)tot_recv);
#ifdef DISTRO_WITH_SYNC
    if (lrn)
      fprintf(x->out, "; to the syncer %llu, from it %llu", (unsigned long long)ls.bytes_up,
              (unsigned long long)ls.bytes_down);
#endif
    fprintf(x->out, "\n");
  }
  if (lead) {
    res->final_val = final_val;
    res->last_train = loss_mean;
    res->total_sent = tot_sent;
    res->total_recv = tot_recv;
    const double nsteps = stop - (double)start;
    res->sent_per_step = nsteps > 0 ? (double)tot_sent / world / nsteps : 0;
    res->recv_per_step = nsteps > 0 ? (double)tot_recv / world / nsteps : 0;
    res->peak_sent = peak_sent;
    res->wall = gpt_now() - t_begin;
    res->step_seconds = step_sum;
    res->optim_seconds = optim_sum;
    res->exchange_seconds = exch_sum;
    res->tokens_per_s = step_sum > 0 ? (stop - (double)start) * tokens_per_step / step_sum : 0;
    res->checksum = gpt_param_checksum(&m);
    res->global_val = global_val;
#ifdef DISTRO_WITH_SYNC
    res->goodput = ls.goodput;
    res->applies = ls.applies;
    res->reports = ls.reports;
#endif
    if (c->print_checksum) fprintf(x->out, "param checksum %016llx\n", (unsigned long long)res->checksum);
  }
  who = -1;
done:
  if (who == rank) {
    if (world > 1 && rank > 0) fprintf(stderr, "gpt: rank %d: %s\n", rank, err);
    else fprintf(stderr, "gpt: %s\n", err);
  }
  if (log) fclose(log);
  if (gpt_tensor_log_close(tlog) != 0 && who == -1) {
    fprintf(stderr, "gpt: the tensor log '%s' did not reach the disk whole\n", c->tensor_log_path);
    who = 0;
  }
#ifdef DISTRO_WITH_SYNC
  distro_learner_free(lrn);
#endif
  distro_diloco_free(dl);
  free(scratch);
  distro_optim_free(opt);
  gpt_free(&m);
  free(inp);
  free(tgt);
  return who == -1 ? DISTRO_OK : DISTRO_ERR_INVALID;
}

static void free_learner_comms(distro_comm *comm, int world, run_ctx *x) {
  (void)comm;
  for (int i = 0; i < world && x->inner_comms; i++) distro_comm_free(x->inner_comms[i]);
  for (int i = 0; i < world && x->outer_comms; i++) distro_comm_free(x->outer_comms[i]);
  free(x->inner_comms);
  free(x->outer_comms);
  x->inner_comms = x->outer_comms = NULL;
}

/* DiLoCo's communicators (docs/diloco.md, "the column design"): world rank
 * w = m*R + r is rank r of learner m's communicator (size R) and rank m of
 * column r's (size M). In-process: one local group per learner and per
 * column, indexed by world rank. MPI: two splits of MPI_COMM_WORLD; only
 * this process's entry is set. */
static int make_learner_comms(const train_config *c, distro_comm *comm, int world, run_ctx *x) {
  const int M = c->learners, R = c->ranks_per_learner;
  distro_status s = DISTRO_OK;
  if (M * R != world) {
    fprintf(stderr, "gpt: --learners %d x --ranks-per-learner %d is %d ranks, but the run has %d\n", M, R, M * R,
            world);
    return -1;
  }
  const int rank = comm ? distro_comm_rank(comm) : 0;
  x->inner_comms = calloc((size_t)world, sizeof *x->inner_comms);
  x->outer_comms = calloc((size_t)world, sizeof *x->outer_comms);
  distro_comm **tmp = calloc((size_t)(M > R ? M : R), sizeof *tmp);
  if (!x->inner_comms || !x->outer_comms || !tmp) {
    free(tmp);
    fprintf(stderr, "gpt: out of memory\n");
    return -1;
  }
  if (comm) {
#ifdef DISTRO_WITH_MPI
    MPI_Comm ic, oc;
    MPI_Comm_split(MPI_COMM_WORLD, rank / R, rank % R, &ic);
    MPI_Comm_split(MPI_COMM_WORLD, rank % R, rank / R, &oc);
    s = distro_comm_mpi(ic, &x->inner_comms[rank]);
    if (s == DISTRO_OK) s = distro_comm_mpi(oc, &x->outer_comms[rank]);
    /* distro_comm_mpi duplicates the communicator. */
    MPI_Comm_free(&ic);
    MPI_Comm_free(&oc);
#else
    s = DISTRO_ERR_INVALID;
#endif
  } else {
    for (int m = 0; s == DISTRO_OK && m < M; m++) {
      s = distro_comm_local_group(R, tmp);
      for (int r = 0; s == DISTRO_OK && r < R; r++) x->inner_comms[m * R + r] = tmp[r];
    }
    for (int r = 0; s == DISTRO_OK && r < R; r++) {
      s = distro_comm_local_group(M, tmp);
      for (int m = 0; s == DISTRO_OK && m < M; m++) x->outer_comms[m * R + r] = tmp[m];
    }
  }
  free(tmp);
  if (s != DISTRO_OK) {
    fprintf(stderr, "gpt: cannot build the learners' communicators: %s: %s\n", distro_status_string(s),
            distro_last_error());
    return -1;
  }
  return 0;
}

int train_run(const train_config *cfg, const gpt_corpus *data, distro_comm *comm, FILE *out, train_result *res) {
  memset(res, 0, sizeof *res);
  res->final_val = NAN;
  const int world = comm ? distro_comm_size(comm) : cfg->ranks;
  char err[1024];
  if (corpus_check(data, cfg->model.context, world, cfg->sampling, err, sizeof err) != 0) {
    if (!comm || distro_comm_rank(comm) == 0) fprintf(stderr, "gpt: %s\n", err);
    return -1;
  }
  run_ctx x = {cfg, data, out, res, cfg->threads, NULL, NULL};
  const int cores = omp_get_num_procs();
  int rc = -1;
  if (cfg->optim == GPT_OPT_DILOCO && make_learner_comms(cfg, comm, world, &x) != 0) goto out;
  /* The model splits its matrix products over OpenMP threads, each calling
   * sgemm: OpenBLAS's own pool (process-wide) would serialise those
   * concurrent calls or oversubscribe the cores (one rank with 2 threads ran
   * 6x slower with it on), so each call runs on its caller's thread. */
  openblas_set_num_threads(1);
  if (comm) {
    /* One rank per process: the node's cores split between its ranks (all
     * cores for each oversubscribed them, and OpenMP's spinning barriers
     * then made the first DeMo steps 100x slower: bench/wan/README.md). */
    const int here = cfg->node_ranks > 0 ? cfg->node_ranks : 1;
    if (x.threads <= 0) x.threads = cores / here > 1 ? cores / here : 1;
    if (distro_comm_rank(comm) == 0 && !cfg->quiet) {
      fprintf(out, "threads: %d per rank (%d cores here, %d MPI rank(s) on this node)\n", x.threads, cores, here);
      fflush(out);
    }
    rc = rank_main(comm, distro_comm_rank(comm), &x) == DISTRO_OK ? 0 : -1;
    goto out;
  }
  if (x.threads <= 0) x.threads = cores / world > 1 ? cores / world : 1;
  rc = distro_comm_run_local(world, rank_main, &x) == DISTRO_OK ? 0 : -1;
out:
  free_learner_comms(comm, world, &x);
  return rc;
}
