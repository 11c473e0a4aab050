/* bench/outside/plain_loop.c: DisTrO-AdamW against the AdamW it replaces, in a
 * plain C training loop built the way an outside trainer builds it (the
 * installed library through pkg-config; run.sh does that) rather than with
 * the project's own trainer.
 *
 * The loop is llm.c-style: one flat parameter buffer, one flat gradient
 * buffer, a hand-written forward/backward of a next-byte model (logits =
 * W . wte[x] + b, 256 bytes, width 64), `ranks` in-process ranks each on its
 * own shard of the text. The baseline averages the gradients with
 * distro_comm_allreduce_sum and runs its own AdamW (betas 0.9/0.95, eps 1e-8,
 * weight decay 0.1); the swap replaces those two calls with distro_optim_step
 * on distro_options_default(DISTRO_ALG_DEMO) with update = DISTRO_UPDATE_ADAMW,
 * the one changed field. Same lr and schedule (5% warm-up, cosine to 10%),
 * same data order, same initial weights. Prints the final loss on a held-out
 * split (the text's last 5%) and the bytes each rank sent per step.
 * --overlap lookahead|stale sets one more field, options.overlap, and calls
 * distro_optim_flush before the evaluation, as the header asks; --overlap
 * backward marks each tensor's gradient final after backward, the last
 * layer first (distro_optim_grad_ready), as a trainer does during it;
 * --values sets options.values, --topk options.topk.
 * The model is python-free-examples/replace_adamw's, copied on purpose: run.sh
 * compiles this one file as an outside program, and the examples stay
 * standalone (their README quotes their diff).
 *
 *   plain_loop --data FILE --optim adamw|distro-adamw --lr X [--seed N]
 *              [--steps 300] [--ranks 4] [--batch 64] [--overlap off|lookahead|stale|backward]
 *              [--values sign1|int8] [--topk N] */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <distro/distro.h>

#define V 256
#define C 64
#define NUM_TENSORS 3
#define NUM_PARAMS (2 * V * C + V)
static const char *names[NUM_TENSORS] = {"wte", "w", "b"};
static const int ndims[NUM_TENSORS] = {2, 2, 1};
static const int64_t shapes[NUM_TENSORS][2] = {{V, C}, {V, C}, {V, 1}};
static const size_t offsets[NUM_TENSORS] = {0, V * C, 2 * V * C};

typedef struct {
  const unsigned char *text;
  long train_len, val_lo, len; /* [0, train_len) trains; [val_lo, len - 1) is held out */
  int adamw, ranks, batch, steps, overlap, values, topk; /* values, topk: -1 the default */
  float lr;
  uint64_t seed;
  double val_loss, bytes_per_step;
} run;

static uint64_t next(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 33;
}

/* Mean cross-entropy of the byte after each of pos[0..n-1]; adds its
 * gradient to grads unless NULL. */
static double forward_backward(const float *params, float *grads, const unsigned char *text, const long *pos, long n) {
  const float *wte = params, *w = params + offsets[1], *b = params + offsets[2];
  double loss = 0;
  for (long s = 0; s < n; s++) {
    const int x = text[pos[s]], y = text[pos[s] + 1];
    const float *h = wte + x * C;
    float logits[V], maxv = -1e30f, sum = 0;
    for (int v = 0; v < V; v++) {
      float a = b[v];
      for (int i = 0; i < C; i++) a += w[v * C + i] * h[i];
      logits[v] = a;
      if (a > maxv) maxv = a;
    }
    for (int v = 0; v < V; v++) sum += logits[v] = expf(logits[v] - maxv);
    loss -= log((double)logits[y] / sum) / (double)n;
    if (!grads) continue;
    float *dwte = grads + x * C, *dw = grads + offsets[1], *db = grads + offsets[2];
    for (int v = 0; v < V; v++) {
      const float d = (logits[v] / sum - (v == y)) / (float)n;
      db[v] += d;
      for (int i = 0; i < C; i++) {
        dw[v * C + i] += d * h[i];
        dwte[i] += d * w[v * C + i];
      }
    }
  }
  return loss;
}

/* The trainer's own AdamW (decoupled weight decay, bias-corrected). */
static void adamw_update(float *p, const float *g, float *m, float *v, long n, float lr, long t) {
  const float b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  const float c1 = 1.0f - powf(b1, (float)t), c2 = 1.0f - powf(b2, (float)t);
  for (long i = 0; i < n; i++) {
    m[i] = b1 * m[i] + (1 - b1) * g[i];
    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
    p[i] -= lr * ((m[i] / c1) / (sqrtf(v[i] / c2) + eps) + wd * p[i]);
  }
}

static float schedule(const run *r, int step) {
  const int warm = r->steps / 20;
  if (step < warm) return r->lr * (float)(step + 1) / (float)warm;
  const float q = (float)(step - warm) / (float)(r->steps - warm);
  return r->lr * (0.1f + 0.45f * (1.0f + cosf(3.14159265f * q)));
}

static distro_status train(distro_comm *comm, int rank, void *arg) {
  run *r = arg;
  const int world = distro_comm_size(comm);
  float *params = calloc(NUM_PARAMS, sizeof(float)), *grads = calloc(NUM_PARAMS, sizeof(float));
  float *m = calloc(NUM_PARAMS, sizeof(float)), *v = calloc(NUM_PARAMS, sizeof(float));
  long *pos = malloc(sizeof(long) * (size_t)r->batch);
  distro_optim *opt = NULL;
  distro_status st = params && grads && m && v && pos ? DISTRO_OK : DISTRO_ERR_NOMEM;
  uint64_t init = r->seed; /* the same initial weights on every rank */
  for (long i = 0; st == DISTRO_OK && i < (long)offsets[2]; i++)
    params[i] = 0.1f * ((float)(next(&init) & 0xffffff) / (float)(1 << 24) - 0.5f);
  if (st == DISTRO_OK && !r->adamw) {
    distro_options o = distro_options_default(DISTRO_ALG_DEMO);
    o.update = DISTRO_UPDATE_ADAMW; /* the swap: one field */
    o.overlap = r->overlap;
    if (r->values >= 0) o.values = (distro_values)r->values; /* --values: one more field */
    if (r->topk > 0) o.topk = r->topk;                        /* --topk: one more field */
    st = distro_optim_create(&o, comm, &opt);
    for (int i = 0; st == DISTRO_OK && i < NUM_TENSORS; i++)
      st = distro_optim_add_param(opt, names[i], params + offsets[i], grads + offsets[i], ndims[i], shapes[i]);
  }
  const long lo = r->train_len * rank / world, hi = r->train_len * (rank + 1) / world;
  uint64_t data = r->seed * 7919 + (uint64_t)rank;
  double bytes = 0;
  for (int step = 0; st == DISTRO_OK && step < r->steps; step++) {
    for (int s = 0; s < r->batch; s++) pos[s] = lo + (long)(next(&data) % (uint64_t)(hi - lo - 1));
    memset(grads, 0, sizeof(float) * NUM_PARAMS);
    forward_backward(params, grads, r->text, pos, r->batch);
    const float lr = schedule(r, step);
    if (r->adamw) {
      st = distro_comm_allreduce_sum(comm, grads, NUM_PARAMS);
      for (long i = 0; i < NUM_PARAMS; i++) grads[i] /= (float)world;
      adamw_update(params, grads, m, v, NUM_PARAMS, lr, step + 1);
      bytes += 2.0 * (world - 1) / world * sizeof(float) * NUM_PARAMS; /* a ring all-reduce's share */
    } else {
      distro_step_stats s;
      for (int t = NUM_TENSORS - 1; t >= 0 && st == DISTRO_OK; t--) st = distro_optim_grad_ready(opt, names[t], lr);
      if (st == DISTRO_OK) st = distro_optim_step(opt, lr, &s);
      bytes += (double)s.bytes_sent;
    }
  }
  if (st == DISTRO_OK && opt) { /* overlap: the last exchange, before evaluating */
    distro_step_stats s;
    st = distro_optim_flush(opt, &s);
    bytes += (double)s.bytes_sent;
  }
  if (st != DISTRO_OK) fprintf(stderr, "rank %d: %s: %s\n", rank, distro_status_string(st), distro_last_error());
  if (st == DISTRO_OK && rank == 0) { /* every 4th held-out position */
    long n = (r->len - 1 - r->val_lo) / 4, *all = malloc(sizeof(long) * (size_t)n);
    if (!all) st = DISTRO_ERR_NOMEM;
    for (long i = 0; st == DISTRO_OK && i < n; i++) all[i] = r->val_lo + 4 * i;
    if (st == DISTRO_OK) r->val_loss = forward_backward(params, NULL, r->text, all, n);
    r->bytes_per_step = bytes / r->steps;
    free(all);
  }
  distro_optim_free(opt);
  free(params), free(grads), free(m), free(v), free(pos);
  return st;
}

int main(int argc, char **argv) {
  run r = {.ranks = 4, .batch = 64, .steps = 300, .seed = 1, .lr = NAN, .adamw = -1, .values = -1, .topk = -1};
  const char *path = NULL;
  for (int i = 1; i + 1 < argc; i += 2) {
    const char *a = argv[i], *v = argv[i + 1];
    if (!strcmp(a, "--data")) path = v;
    else if (!strcmp(a, "--optim")) r.adamw = !strcmp(v, "adamw") ? 1 : !strcmp(v, "distro-adamw") ? 0 : -1;
    else if (!strcmp(a, "--lr")) r.lr = strtof(v, NULL);
    else if (!strcmp(a, "--seed")) r.seed = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--steps")) r.steps = atoi(v);
    else if (!strcmp(a, "--ranks")) r.ranks = atoi(v);
    else if (!strcmp(a, "--batch")) r.batch = atoi(v);
    else if (!strcmp(a, "--values"))
      r.values = !strcmp(v, "sign1") ? DISTRO_VALUES_SIGN1 : !strcmp(v, "int8") ? DISTRO_VALUES_INT8 : -2;
    else if (!strcmp(a, "--topk")) r.topk = atoi(v);
    else if (!strcmp(a, "--overlap"))
      r.overlap = !strcmp(v, "off") ? DISTRO_OVERLAP_OFF
                  : !strcmp(v, "lookahead") ? DISTRO_OVERLAP_LOOKAHEAD
                  : !strcmp(v, "stale") ? DISTRO_OVERLAP_STALE
                  : !strcmp(v, "backward") ? DISTRO_OVERLAP_BACKWARD : -1;
    else return fprintf(stderr, "plain_loop: unknown option '%s'\n", a), 2;
  }
  if (!path || r.adamw < 0 || !(r.lr > 0) || r.steps < 20 || r.ranks < 1 || r.batch < 1 || r.seed == 0 ||
      r.overlap < 0 || r.values < -1 || r.topk == 0 || r.topk < -1 ||
      (r.adamw && (r.overlap || r.values >= 0 || r.topk > 0)))
    return fprintf(stderr, "usage: plain_loop --data FILE --optim adamw|distro-adamw --lr X [--seed N>0] "
                           "[--steps N>=20] [--ranks N] [--batch N] [--overlap off|lookahead|stale|backward] "
                           "[--values sign1|int8] [--topk N>0] "
                           "(the last three: distro-adamw)\n"),
           2;
  FILE *f = fopen(path, "rb");
  if (!f) return fprintf(stderr, "plain_loop: cannot open %s\n", path), 1;
  fseek(f, 0, SEEK_END);
  r.len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *text = malloc((size_t)r.len + 1);
  if (!text || r.len < 100000 || fread(text, 1, (size_t)r.len, f) != (size_t)r.len)
    return fprintf(stderr, "plain_loop: %s: need at least 100 kB of text\n", path), 1;
  fclose(f);
  r.text = text;
  r.val_lo = r.len - r.len / 20;
  r.train_len = r.val_lo;
  const distro_status st = distro_comm_run_local(r.ranks, train, &r);
  if (st != DISTRO_OK) return fprintf(stderr, "plain_loop: %s\n", distro_status_string(st)), 1;
  static const char *const mode[] = {"", " overlap lookahead", " overlap stale", " overlap backward"};
  char k[24] = "";
  if (r.topk > 0) snprintf(k, sizeof k, " topk %d", r.topk);
  printf("%s%s%s%s lr %g seed %llu: held-out loss %.4f, %.0f bytes sent per step per rank\n",
         r.adamw ? "adamw" : "distro-adamw", mode[r.overlap], r.values == DISTRO_VALUES_SIGN1 ? " values sign1" : "", k,
         (double)r.lr, (unsigned long long)r.seed, r.val_loss, r.bytes_per_step);
  free(text);
  return 0;
}
