/* Parameter shape sets. Shapes follow the PyTorch layout (out, in). */
#include "shapes.h"

#include <stdlib.h>
#include <string.h>

typedef struct builder {
  bench_model *m;
  int cap;
} builder;

static int push(builder *b, const char *name, int ndim, int64_t d0, int64_t d1) {
  bench_model *m = b->m;
  if (m->ntensors == b->cap) {
    int cap = b->cap ? 2 * b->cap : 64;
    bench_tensor *t = realloc(m->t, (size_t)cap * sizeof *t);
    if (!t) return -1;
    m->t = t;
    b->cap = cap;
  }
  bench_tensor *t = &m->t[m->ntensors++];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->ndim = ndim;
  t->shape[0] = d0;
  t->shape[1] = ndim == 2 ? d1 : 0;
  t->numel = ndim == 2 ? d0 * d1 : d0;
  t->offset = m->nparams;
  m->nparams += t->numel;
  return 0;
}

static int finish(bench_model *m) {
  m->ndims = malloc((size_t)m->ntensors * sizeof *m->ndims);
  m->shapes = malloc((size_t)m->ntensors * sizeof *m->shapes);
  if (!m->ndims || !m->shapes) return -1;
  for (int i = 0; i < m->ntensors; i++) {
    m->ndims[i] = m->t[i].ndim;
    m->shapes[i] = m->t[i].shape;
  }
  return 0;
}

static int clamp_layers(int layers, int full) { return layers <= 0 || layers > full ? full : layers; }

/* GPT-2 small: vocab 50257, ctx 1024, d 768, 12 blocks, tied embedding. */
int bench_model_gpt2_124m(bench_model *m, int layers) {
  const int64_t V = 50257, T = 1024, C = 768;
  memset(m, 0, sizeof *m);
  m->name = "GPT-2 124M";
  m->full_layers = 12;
  m->layers = clamp_layers(layers, 12);
  builder b = {m, 0};
  char n[48];
  int e = 0;
  e |= push(&b, "wte", 2, V, C);
  e |= push(&b, "wpe", 2, T, C);
  for (int l = 0; l < m->layers && !e; l++) {
#define P1(s, d0) (snprintf(n, sizeof n, "h.%d." s, l), push(&b, n, 1, d0, 0))
#define P2(s, d0, d1) (snprintf(n, sizeof n, "h.%d." s, l), push(&b, n, 2, d0, d1))
    e |= P1("ln_1.weight", C);
    e |= P1("ln_1.bias", C);
    e |= P2("attn.c_attn.weight", 3 * C, C);
    e |= P1("attn.c_attn.bias", 3 * C);
    e |= P2("attn.c_proj.weight", C, C);
    e |= P1("attn.c_proj.bias", C);
    e |= P1("ln_2.weight", C);
    e |= P1("ln_2.bias", C);
    e |= P2("mlp.c_fc.weight", 4 * C, C);
    e |= P1("mlp.c_fc.bias", 4 * C);
    e |= P2("mlp.c_proj.weight", C, 4 * C);
    e |= P1("mlp.c_proj.bias", C);
  }
  e |= push(&b, "ln_f.weight", 1, C, 0);
  e |= push(&b, "ln_f.bias", 1, C, 0);
  if (e || finish(m)) {
    bench_model_free(m);
    return -1;
  }
  return 0;
}

/* Llama-2 1.2B of the DisTrO report: vocab 32000, hidden 2048, 16 blocks,
 * SwiGLU 8192, RMSNorm (no biases), untied head. */
int bench_model_llama_1b2(bench_model *m, int layers) {
  const int64_t V = 32000, H = 2048, I = 8192;
  memset(m, 0, sizeof *m);
  m->name = "Llama-2 1.2B";
  m->full_layers = 16;
  m->layers = clamp_layers(layers, 16);
  builder b = {m, 0};
  char n[48];
  int e = 0;
  e |= push(&b, "embed_tokens", 2, V, H);
  for (int l = 0; l < m->layers && !e; l++) {
    e |= P2("self_attn.q_proj", H, H);
    e |= P2("self_attn.k_proj", H, H);
    e |= P2("self_attn.v_proj", H, H);
    e |= P2("self_attn.o_proj", H, H);
    e |= P2("mlp.gate_proj", I, H);
    e |= P2("mlp.up_proj", I, H);
    e |= P2("mlp.down_proj", H, I);
    e |= P1("input_layernorm", H);
    e |= P1("post_attention_layernorm", H);
#undef P1
#undef P2
  }
  e |= push(&b, "norm", 1, H, 0);
  e |= push(&b, "lm_head", 2, V, H);
  if (e || finish(m)) {
    bench_model_free(m);
    return -1;
  }
  return 0;
}

void bench_model_free(bench_model *m) {
  if (!m) return;
  free(m->t);
  free(m->ndims);
  free((void *)m->shapes);
  memset(m, 0, sizeof *m);
}

int64_t bench_gpt2_params(int layers) {
  const int64_t V = 50257, T = 1024, C = 768;
  int64_t block = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C;
  return V * C + T * C + (int64_t)clamp_layers(layers, 12) * block + 2 * C;
}

int64_t bench_llama_params(int layers) {
  const int64_t V = 32000, H = 2048, I = 8192;
  int64_t block = 4 * H * H + 3 * I * H + 2 * H;
  return 2 * V * H + (int64_t)clamp_layers(layers, 16) * block + H;
}

void bench_model_print(const bench_model *m, FILE *f) {
  fprintf(f, "%s: %d of %d blocks, %d tensors, %lld parameters (%.3f B)\n", m->name, m->layers, m->full_layers,
          m->ntensors, (long long)m->nparams, m->nparams / 1e9);
}

int64_t bench_chunk_size(int64_t n, int64_t target) {
  if (n <= target) return n;
  for (int64_t d = target; d > 1; d--)
    if (n % d == 0) return d;
  return 1; /* prime n > target: the reference falls back to chunk 1 */
}

int64_t bench_kept_coefs(const bench_model *m, int64_t chunk, int64_t topk) {
  int64_t kept = 0;
  for (int i = 0; i < m->ntensors; i++) {
    const bench_tensor *t = &m->t[i];
    int64_t r = t->ndim == 2 ? t->shape[0] : 1;
    int64_t c = t->ndim == 2 ? t->shape[1] : t->shape[0];
    int64_t h = bench_chunk_size(r, chunk), w = bench_chunk_size(c, chunk);
    int64_t k = topk < h * w ? topk : h * w;
    kept += (r / h) * (c / w) * k;
  }
  return kept;
}
