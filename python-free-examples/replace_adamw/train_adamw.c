/* train_adamw.c: the starting point. An llm.c-style training loop (one flat
 * parameter buffer, one flat gradient buffer, a hand-written backward pass and
 * an AdamW update) on a tiny next-byte model: logits = W . wte[x] + b.
 * train_distro.c is the same program after the swap; README.md shows the diff. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define V 128 /* ASCII */
#define C 32  /* embedding width */
#define BATCH 64
#define STEPS 300
#define RANKS 1

static const char TEXT[] =
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, "
    "it was the season of Darkness, it was the spring of hope, it was the winter of despair, we had "
    "everything before us, we had nothing before us, we were all going direct to Heaven, we were all going "
    "direct the other way - in short, the period was so far like the present period, that some of its "
    "noisiest authorities insisted on its being received, for good or for evil, in the superlative degree "
    "of comparison only.";

/* The tensors inside the flat buffers: name, shape (rows, cols), offset. */
#define NUM_TENSORS 3
static const char *names[NUM_TENSORS] = {"wte", "w", "b"};
static const int ndims[NUM_TENSORS] = {2, 2, 1};
static const int64_t shapes[NUM_TENSORS][2] = {{V, C}, {V, C}, {V, 1}};
static const size_t offsets[NUM_TENSORS] = {0, V * C, 2 * V * C};
#define NUM_PARAMS (2 * V * C + V)

/* Mean cross-entropy of next-byte prediction at positions pos[0..n-1];
 * accumulates its gradient into grads (unless NULL). */
static float forward_backward(const float *params, float *grads, const int *pos, int n) {
  const float *wte = params, *w = params + offsets[1], *b = params + offsets[2];
  float loss = 0;
  for (int s = 0; s < n; s++) {
    const int x = TEXT[pos[s]], y = TEXT[pos[s] + 1];
    const float *h = wte + x * C;
    float logits[V], maxv = -1e30f, sum = 0;
    for (int v = 0; v < V; v++) {
      logits[v] = b[v];
      for (int i = 0; i < C; i++) logits[v] += w[v * C + i] * h[i];
      if (logits[v] > maxv) maxv = logits[v];
    }
    for (int v = 0; v < V; v++) sum += logits[v] = expf(logits[v] - maxv);
    loss -= logf(logits[y] / sum) / n;
    if (!grads) continue;
    float *dwte = grads, *dw = grads + offsets[1], *db = grads + offsets[2];
    for (int v = 0; v < V; v++) {
      const float d = (logits[v] / sum - (v == y)) / n; /* d loss / d logit */
      db[v] += d;
      for (int i = 0; i < C; i++) {
        dw[v * C + i] += d * h[i];
        dwte[x * C + i] += d * w[v * C + i];
      }
    }
  }
  return loss;
}

static void adamw_update(float *params, const float *grads, float *m, float *v, size_t n, float lr, float beta1,
                         float beta2, float eps, float wd, int t) {
  for (size_t i = 0; i < n; i++) {
    m[i] = beta1 * m[i] + (1 - beta1) * grads[i];
    v[i] = beta2 * v[i] + (1 - beta2) * grads[i] * grads[i];
    const float mhat = m[i] / (1 - powf(beta1, (float)t)), vhat = v[i] / (1 - powf(beta2, (float)t));
    params[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * params[i]);
  }
}

static int train(int rank, int world) {
  float *params = malloc(NUM_PARAMS * sizeof(float)), *grads = NULL; /* allocated by the first backward */
  float *m = calloc(NUM_PARAMS, sizeof(float)), *v = calloc(NUM_PARAMS, sizeof(float));
  if (!params || !m || !v) return 1;
  for (int i = 0; rank == 0 && i < NUM_TENSORS; i++)
    printf("%-4s %dD %lld x %lld at offset %zu\n", names[i], ndims[i], (long long)shapes[i][0],
           (long long)shapes[i][1], offsets[i]);
  uint64_t rng = 42; /* the same initial weights on every rank */
  for (size_t i = 0; i < NUM_PARAMS; i++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    params[i] = i < offsets[2] ? 0.1f * ((float)(rng >> 40) / (1 << 24) - 0.5f) : 0.0f;
  }

  /* Each rank trains on its own shard of the text. */
  const int len = (int)sizeof TEXT - 2, lo = len * rank / world, hi = len * (rank + 1) / world;
  uint64_t data_rng = 1000 + (uint64_t)rank;
  for (int step = 0; step < STEPS; step++) {
    int pos[BATCH];
    for (int s = 0; s < BATCH; s++) {
      data_rng = data_rng * 6364136223846793005ull + 1442695040888963407ull;
      pos[s] = lo + (int)((data_rng >> 33) % (uint64_t)(hi - lo));
    }
    if (!grads && !(grads = malloc(NUM_PARAMS * sizeof(float)))) return 1; /* lazily, as llm.c does */
    memset(grads, 0, NUM_PARAMS * sizeof(float));
    const float loss = forward_backward(params, grads, pos, BATCH);
    const float lr = 1e-2f * (0.55f + 0.45f * cosf(3.14159265f * step / STEPS)); /* cosine to 10% */
    adamw_update(params, grads, m, v, NUM_PARAMS, lr, 0.9f, 0.95f, 1e-8f, 0.1f, step + 1);
    if (rank == 0 && (step % 50 == 0 || step == STEPS - 1)) printf("step %3d  loss %.4f\n", step, loss);
  }
  if (rank == 0) { /* the whole text, every position */
    int all[sizeof TEXT - 2];
    for (int i = 0; i < (int)sizeof TEXT - 2; i++) all[i] = i;
    printf("loss on the whole text: %.4f\n", forward_backward(params, NULL, all, (int)sizeof TEXT - 2));
  }
  free(params);
  free(grads);
  free(m);
  free(v);
  return 0;
}

int main(void) { return train(0, RANKS); }
