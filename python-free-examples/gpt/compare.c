/* --compare (see compare.h). */
#include "compare.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

/* The rows of the comparison, each with its tuned settings (README.md,
 * "Tuning"). The all-reduce baseline first: the others are measured against it. */
#define DENSE_OUTER DISTRO_OUTER_DENSE, 0.0f, 0.0f, DISTRO_VALUES_F32
#define NO_DILOCO GPT_OPT_ADAMW, 0, 0, 0, DISTRO_OUTER_F32, 0.0f, 0.0f, DENSE_OUTER
static const variant VARIANTS[] = {
    /* name          optimizer             lr       warmup chunk topk decay   values */
    {"adamw",        GPT_OPT_ADAMW,        4e-3f,   0.15f, 0,    0,   0.0f,   DISTRO_VALUES_F32,   NO_DILOCO},
    {"distro",       GPT_OPT_DISTRO,       4e-3f,   0.15f, 32,   32,  0.999f, DISTRO_VALUES_SIGN1, NO_DILOCO},
    /* DisTrO-AdamW: the library's defaults with update = ADAMW, at the AdamW row's lr and warm-up. */
    {"distro-adamw", GPT_OPT_DISTRO_ADAMW, 4e-3f,   0.15f, 32,   32,  0.999f, DISTRO_VALUES_INT8,  NO_DILOCO},
    {"distro-ref",   GPT_OPT_DISTRO,       2e-3f,   0.05f, 64,   32,  0.999f, DISTRO_VALUES_F32,   NO_DILOCO},
    /* DiLoCo: 4 learners with AdamW inside (no DisTrO settings), outer lr 1 without momentum (README.md);
     * the first row is also the default of --optim diloco.
     *                                                                        inner        M  H   P  codec */
    {"diloco",       GPT_OPT_DILOCO,       4e-3f,   0.05f, 0,    0,   0.0f,   DISTRO_VALUES_F32,
     GPT_OPT_ADAMW, 4, 15, 1, DISTRO_OUTER_INT4, 1.0f, 0.0f, DENSE_OUTER},
    {"diloco-f32",   GPT_OPT_DILOCO,       4e-3f,   0.05f, 0,    0,   0.0f,   DISTRO_VALUES_F32,
     GPT_OPT_ADAMW, 4, 15, 1, DISTRO_OUTER_F32, 1.0f, 0.0f, DENSE_OUTER},
    {"diloco-stream", GPT_OPT_DILOCO,      4e-3f,   0.05f, 0,    0,   0.0f,   DISTRO_VALUES_F32,
     GPT_OPT_ADAMW, 4, 15, 3, DISTRO_OUTER_INT4, 1.0f, 0.0f, DENSE_OUTER},
    /* SparseLoCo: the diloco row's learners with sparse 2-bit outer gradients and error feedback, outer lr 2
     * and beta 0.9 (tuned, README.md "SparseLoCo"); also the default of --optim sparseloco.
     *                                                                          density  beta  values */
    {"sparseloco",   GPT_OPT_DILOCO,       4e-3f,   0.05f, 0,    0,   0.0f,   DISTRO_VALUES_F32,
     GPT_OPT_ADAMW, 4, 15, 1, DISTRO_OUTER_F32, 2.0f, 0.0f, DISTRO_OUTER_SPARSE, 0.02f, 0.9f, DISTRO_VALUES_INT2},
};
#define NVAR ((int)(sizeof VARIANTS / sizeof *VARIANTS))
/* --compare runs the first NSWAP rows (does the swap work: adamw, distro,
 * distro-adamw); --compare-all runs them all. */
#define NSWAP 3

const variant *tuned_variant(gpt_optim_kind k) {
  for (int i = 0; i < NVAR; i++)
    if (VARIANTS[i].optim == k) return &VARIANTS[i];
  return &VARIANTS[0];
}

const variant *named_variant(const char *name) {
  for (int i = 0; i < NVAR; i++)
    if (!strcmp(VARIANTS[i].name, name)) return &VARIANTS[i];
  return NULL;
}

void apply_variant(train_config *c, const variant *v, const compare_overrides *ov) {
  c->optim = v->optim;
  if (!ov->lr) c->lr = v->lr;
  if (!ov->warmup) c->warmup = (int)(v->warmup * (float)c->steps + 0.5f);
  if (v->optim == GPT_OPT_DILOCO) {
    if (!ov->inner) c->inner = v->inner;
    if (!ov->learners) c->learners = v->learners;
    if (!ov->H) c->diloco.H = v->H;
    if (!ov->fragments) c->diloco.fragments = v->fragments;
    if (!ov->codec) c->diloco.codec = v->codec;
    if (!ov->outer_lr) c->diloco.outer_lr = v->outer_lr;
    if (!ov->outer_momentum) c->diloco.outer_momentum = v->outer_momentum;
    c->diloco.compressor = v->compressor;
    if (v->compressor == DISTRO_OUTER_SPARSE) {
      if (!ov->density) c->diloco.density = v->density;
      if (!ov->ef_beta) c->diloco.ef_beta = v->ef_beta;
      if (!ov->sparse_values) c->diloco.sparse_values = v->sparse_values;
    }
    v = tuned_variant(c->inner); /* the inner optimizer's DisTrO settings */
  }
  if (v->optim == GPT_OPT_ADAMW) return;
  if (!ov->chunk) c->chunk = v->chunk;
  if (!ov->topk) c->topk = v->topk;
  if (!ov->decay) c->decay = v->decay;
  if (!ov->values) c->values = v->values;
}

static int in_path(const char *prog) {
  const char *path = getenv("PATH");
  if (!path) return 0;
  while (*path) {
    size_t n = strcspn(path, ":");
    char full[4096];
    snprintf(full, sizeof full, "%.*s/%s", (int)n, n ? path : ".", prog);
    if (access(full, X_OK) == 0) return 1;
    path += n + (path[n] == ':');
  }
  return 0;
}

/* A gnuplot single-quoted string: quotes doubled. */
static void gp_string(FILE *g, const char *s) {
  fputc('\'', g);
  for (; *s; s++) {
    if (*s == '\'') fputc('\'', g);
    fputc(*s, g);
  }
  fputc('\'', g);
}

static int plot(const char *path, const train_config *base, const train_result *res, const char *const *names,
                int n) {
  if (!in_path("gnuplot")) {
    fprintf(stderr,
            "gpt: no plot: gnuplot is not installed (not found in PATH); install it with "
            "'apt-get install gnuplot-nox' (make deps does) and rerun; the table above is complete\n");
    return -1;
  }
  unlink(path); /* so a stale file cannot pass for a new one */
  FILE *g = popen("gnuplot", "w");
  if (!g) {
    fprintf(stderr, "gpt: no plot: cannot start gnuplot\n");
    return -1;
  }
  for (int i = 0; i < n; i++) {
    fprintf(g, "$val%d << EOD\n", i);
    for (int e = 0; e < res[i].nevals; e++) fprintf(g, "%d %.6f\n", res[i].eval_step[e], res[i].eval_loss[e]);
    fprintf(g, "EOD\n$bytes%d << EOD\n", i);
    const int steps = res[i].steps_done;
    for (int k = 1; k <= 100; k++) {
      int s = (int)((double)steps * k / 100.0 + 0.5);
      if (s < 1) continue;
      fprintf(g, "%d %.6g\n", s, (double)s * res[i].sent_per_step * res[i].world);
    }
    fprintf(g, "EOD\n");
  }
  fprintf(g, "set terminal pngcairo size 1400,560 font 'sans,10'\nset output ");
  gp_string(g, path);
  fprintf(g,
          "\nset multiplot layout 1,2 title "
          "'byte-level GPT on %s: %d layers, dim %d, context %d, %d ranks x batch %d, %d steps'\n",
          base->data ? "your text" : "fortunes", base->model.layers, base->model.dim, base->model.context,
          res[0].world, base->batch, base->steps);
  fprintf(g, "set grid\nset key top right\nset xlabel 'step'\nset ylabel 'validation loss (nats per byte)'\n"
             "set title 'validation loss'\nplot ");
  for (int i = 0; i < n; i++)
    fprintf(g, "%s$val%d with linespoints lw 2 pt 7 ps 0.6 title '%s'", i ? ", " : "", i, names[i]);
  fprintf(g, "\nset logscale y\nset format y '10^{%%L}'\nset key bottom right\n"
             "set ylabel 'bytes sent, all ranks (log scale)'\nset title 'cumulative bytes sent (mean per step x steps)'\nplot ");
  for (int i = 0; i < n; i++)
    fprintf(g, "%s$bytes%d with lines lw 2 title '%s'", i ? ", " : "", i, names[i]);
  fprintf(g, "\nunset multiplot\nset output\n");
  int rc = pclose(g);
  FILE *f = fopen(path, "rb");
  long size = 0;
  if (f) {
    fseek(f, 0, SEEK_END);
    size = ftell(f);
    fclose(f);
  }
  if (rc != 0 || size <= 0) {
    fprintf(stderr, "gpt: gnuplot failed to write the plot '%s' (exit status %d; its messages are above)\n", path, rc);
    return -1;
  }
  return 0;
}

static int row(const char *const *names, int nrows, const char *name) {
  for (int i = 0; i < nrows; i++)
    if (!strcmp(names[i], name)) return i;
  return -1;
}

/* The targets of issue 6, on the DiLoCo rows (skipped if settings given on
 * the command line made the rows incomparable). */
static void diloco_targets(const train_result *res, const train_config *cfg, const char *const *names, int nrows) {
  const int a = row(names, nrows, "adamw"), f = row(names, nrows, "diloco-f32"), q = row(names, nrows, "diloco"),
            p = row(names, nrows, "diloco-stream");
  if (a < 0 || f < 0 || q < 0 || p < 0) return;
  const double gap = res[q].final_val / res[a].final_val - 1, fewer = res[a].sent_per_step / res[q].sent_per_step;
  printf("DiLoCo: %s (%d learners, H %d, %s outer gradients): val loss %+.2f%% vs adamw (target <= +3%%): %s;\n"
         "  %.0fx fewer bytes per step (target >= 100x): %s.\n",
         names[q], cfg[q].learners, cfg[q].diloco.H, outer_codec_name(cfg[q].diloco.codec), 100 * gap,
         gap <= 0.03 ? "met" : "MISSED", fewer, fewer >= 100 ? "met" : "MISSED");
  if (cfg[q].diloco.fragments == cfg[f].diloco.fragments && cfg[q].diloco.H == cfg[f].diloco.H) {
    const double qgap = res[q].final_val / res[f].final_val - 1, smaller = res[f].peak_sent / res[q].peak_sent;
    printf("  %s vs %s outer gradients: val loss %+.2f%% (target within 0.5%%): %s; outer payload %.2fx smaller "
           "(target 8x: %s)\n",
           outer_codec_name(cfg[q].diloco.codec), outer_codec_name(cfg[f].diloco.codec), 100 * qgap,
           fabs(qgap) <= 0.005 ? "met" : "MISSED", smaller, smaller >= 8 ? "met" : "MISSED");
  }
  if (cfg[p].diloco.codec == cfg[q].diloco.codec && cfg[p].diloco.fragments > 1) {
    const int P = cfg[p].diloco.fragments;
    const double lower = res[q].peak_sent / res[p].peak_sent, pgap = res[p].final_val / res[q].final_val - 1;
    printf("  streaming, %d fragments vs 1: peak bytes of a step %.2fx lower (target >= 0.8 x %d = %.1fx): %s; val "
           "loss %+.2f%% (target within 1%%): %s\n",
           P, lower, P, 0.8 * P, lower >= 0.8 * P ? "met" : "MISSED", 100 * pgap, fabs(pgap) <= 0.01 ? "met" : "MISSED");
  }
}

/* The target of issue 13: DisTrO-AdamW within 1% of the AdamW it replaces, at
 * that row's lr, with >= 50x fewer bytes. */
static void distro_adamw_target(const train_result *res, const train_config *cfg, const char *const *names,
                                int nrows) {
  const int a = row(names, nrows, "adamw"), d = row(names, nrows, "distro-adamw");
  if (a < 0 || d < 0 || res[d].sent_per_step <= 0) return;
  const double gap = res[d].final_val / res[a].final_val - 1, fewer = res[a].sent_per_step / res[d].sent_per_step;
  printf("DisTrO-AdamW: %s at lr %g (adamw's: %g): val loss %+.2f%% vs adamw (target <= +1%%): %s; %.0fx fewer bytes\n"
         "  per step (target >= 50x): %s.\n",
         names[d], (double)cfg[d].lr, (double)cfg[a].lr, 100 * gap, gap <= 0.01 && cfg[d].lr == cfg[a].lr ? "met" : "MISSED",
         fewer, fewer >= 50 ? "met" : "MISSED");
}

/* The targets of issue 17: sparseloco against the diloco row (int4) and the
 * all-reduce. Outer bytes: both rows' learners have one rank, so their
 * bytes per step are all outer. */
static void sparseloco_targets(const train_result *res, const train_config *cfg, const char *const *names,
                               int nrows) {
  const int a = row(names, nrows, "adamw"), q = row(names, nrows, "diloco"), s = row(names, nrows, "sparseloco");
  if (a < 0 || q < 0 || s < 0 || res[s].sent_per_step <= 0) return;
  const double gap = res[s].final_val / res[q].final_val - 1, fewer = res[q].sent_per_step / res[s].sent_per_step,
               vs_ar = res[a].sent_per_step / res[s].sent_per_step;
  printf("SparseLoCo: %s (%g%% density, %s values, H %d): val loss %+.2f%% vs %s (target <= +1%%): %s;\n"
         "  %.1fx fewer outer bytes per step than %s (target >= 20x): %s; %.0fx fewer than the all-reduce (target >= "
         "2000x): %s.\n",
         names[s], 100.0 * cfg[s].diloco.density, values_name(cfg[s].diloco.sparse_values), cfg[s].diloco.H,
         100 * gap, names[q], gap <= 0.01 ? "met" : "MISSED", fewer, names[q], fewer >= 20 ? "met" : "MISSED", vs_ar,
         vs_ar >= 2000 ? "met" : "MISSED");
}

/* The table as data: one row per run, raw numbers (bytes, seconds), for
 * python-free-examples/gpt/demo-report.sh. */
static int write_tsv(const char *path, const train_config *base, const train_config *cfg, const train_result *res,
                     const char *const *names, int nrows) {
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "gpt: cannot write '%s'\n", path);
    return -1;
  }
  fprintf(f, "# gpt-train --compare: %d ranks x batch %d x context %d, %d steps, %zu parameters, seed %llu\n",
          res[0].world, base->batch, base->model.context, base->steps, res[0].nparams,
          (unsigned long long)base->seed);
  fprintf(f, "row\toptimizer\tlr\tchunk\ttopk\tvalues\tlearners\tH\tfragments\touter\tval_loss\tsent_per_step\t"
             "peak_sent\trecv_per_step\ttotal_sent\twall_s\tstep_s\toptim_s\texchange_s\n");
  for (int i = 0; i < nrows; i++) {
    const train_config *c = &cfg[i];
    const train_result *r = &res[i];
    const int dl = c->optim == GPT_OPT_DILOCO, dm = step_optim_kind(c) != GPT_OPT_ADAMW;
    char outer[64] = "-";
    if (dl && c->diloco.compressor == DISTRO_OUTER_SPARSE)
      snprintf(outer, sizeof outer, "sparse-%s@%g%%", values_name(c->diloco.sparse_values), 100.0 * c->diloco.density);
    else if (dl)
      snprintf(outer, sizeof outer, "%s", outer_codec_name(c->diloco.codec));
    fprintf(f, "%s\t%s\t%g\t%d\t%d\t%s\t%d\t%d\t%d\t%s\t%.4f\t%.0f\t%.0f\t%.0f\t%.0f\t%.1f\t%.6f\t%.6f\t%.6f\n", names[i],
            optim_name(dl ? c->inner : c->optim), (double)c->lr, dm ? c->chunk : 0, dm ? c->topk : 0,
            dm ? values_name(c->values) : "-", dl ? c->learners : 0, dl ? c->diloco.H : 0, dl ? c->diloco.fragments : 0,
            outer, r->final_val, r->sent_per_step, r->peak_sent, r->recv_per_step, (double)r->total_sent, r->wall,
            r->step_seconds, r->optim_seconds, r->exchange_seconds);
  }
  if (fclose(f) != 0) {
    fprintf(stderr, "gpt: cannot write '%s'\n", path);
    return -1;
  }
  return 0;
}

int compare_run(const train_config *base, const compare_overrides *ov, const gpt_corpus *data, distro_comm *comm,
                const char *plot_path, const char *tsv_path, int all) {
  const int lead = !comm || distro_comm_rank(comm) == 0;
  const int nrows = all ? NVAR : NSWAP;
  train_result *res = calloc(NVAR, sizeof *res);
  train_config cfg[NVAR];
  const char *names[NVAR];
  char logs[NVAR][4200];
  if (!res) {
    fprintf(stderr, "gpt: out of memory\n");
    return 1;
  }
  const double t0 = gpt_now();
  for (int i = 0; i < nrows; i++) {
    const variant *v = &VARIANTS[i];
    train_config *c = &cfg[i];
    *c = *base;
    apply_variant(c, v, ov);
    c->label = v->name;
    if (c->optim == GPT_OPT_DILOCO) {
      /* The same tokens per step as the baseline, split over the learners. */
      const int rpl = c->ranks_per_learner;
      if (comm) {
        if (distro_comm_size(comm) % rpl) {
          if (lead) fprintf(stderr, "gpt: %s: %d MPI ranks are not a multiple of --ranks-per-learner %d\n", v->name,
                            distro_comm_size(comm), rpl);
          free(res);
          return 1;
        }
        c->learners = distro_comm_size(comm) / rpl;
      } else {
        const int seqs = base->ranks * base->batch;
        c->ranks = c->learners * rpl;
        if (seqs % c->ranks) {
          fprintf(stderr, "gpt: %s: the baseline's %d ranks x batch %d = %d sequences per step do not split over "
                          "%d learners x %d rank(s); change --batch or --learners\n",
                  v->name, base->ranks, base->batch, seqs, c->learners, rpl);
          free(res);
          return 1;
        }
        c->batch = seqs / c->ranks;
      }
    }
    names[i] = v->name;
    if (base->log_path) {
      /* run.csv -> run.adamw.csv, ... */
      const char *dot = strrchr(base->log_path, '.');
      const int has_ext = dot && !strchr(dot, '/');
      const int stem = has_ext ? (int)(dot - base->log_path) : (int)strlen(base->log_path);
      snprintf(logs[i], sizeof logs[i], "%.*s.%s%s", stem, base->log_path, v->name, has_ext ? dot : ".csv");
      c->log_path = logs[i];
    }
    if (lead) {
      printf("\n== %s: %s", v->name, optim_name(c->optim));
      char og[160];
      if (c->optim == GPT_OPT_DILOCO)
        printf(" (%d learners x %d rank(s) x batch %d, inner %s, H %d, %d fragment(s), %s)", c->learners,
               c->ranks_per_learner, c->batch, optim_name(c->inner), c->diloco.H, c->diloco.fragments,
               outer_gradients_desc(&c->diloco, og, sizeof og));
      if (step_optim_kind(c) != GPT_OPT_ADAMW)
        printf(", topk %d, chunk %d, decay %g, %s values", c->topk, c->chunk, (double)c->decay,
               values_name(c->values));
      printf(", lr %g ==\n", (double)c->lr);
      fflush(stdout);
    }
    if (train_run(c, data, comm, stdout, &res[i]) != 0) {
      free(res);
      return 1;
    }
  }
  const double total = gpt_now() - t0;
  if (!lead) {
    free(res);
    return 0;
  }

  /* The table. */
  const train_result *ref = &res[0];
  char b1[32], b2[32], b3[32], d1[32];
  printf("\n== Comparison: %d ranks x batch %d x context %d, %d steps (%.2f M tokens), %zu parameters, seed %llu ==\n",
         ref->world, base->batch, base->model.context, base->steps,
         (double)base->steps * ref->world * base->batch * base->model.context / 1e6, ref->nparams,
         (unsigned long long)base->seed);
  printf("%-13s %7s %-17s %8s %8s %14s %10s %14s %11s %10s %6s %14s\n", "optimizer", "lr", "chunk/topk/values",
         "val loss", "vs adamw", "sent/step/rank", "peak step", "recv/step/rank", "total sent", "less than", "wall",
         "optimizer");
  printf("%-13s %7s %-17s %8s %8s %14s %10s %14s %11s %10s %6s %14s\n", "", "", "/decay; DiLoCo:", "(final)", "",
         "(mean)", "per rank", "", "(all ranks)", "all-reduce", "", "share of step");
  printf("%-13s %7s %-17s\n", "", "", "M/H/P/outer codec");
  for (int i = 0; i < nrows; i++) {
    const train_result *r = &res[i];
    const double share = r->step_seconds > 0 ? r->optim_seconds / r->step_seconds : 0;
    const double own = r->step_seconds > 0 ? (r->optim_seconds - r->exchange_seconds) / r->step_seconds : 0;
    char less[32];
    snprintf(less, sizeof less, "%.0fx", ref->sent_per_step / (r->sent_per_step > 0 ? r->sent_per_step : 1));
    char comp[64] = "-", b4[32];
    if (cfg[i].optim == GPT_OPT_DILOCO && cfg[i].diloco.compressor == DISTRO_OUTER_SPARSE)
      snprintf(comp, sizeof comp, "%d/%d/%d/%s@%g%%", cfg[i].learners, cfg[i].diloco.H, cfg[i].diloco.fragments,
               values_name(cfg[i].diloco.sparse_values), 100.0 * cfg[i].diloco.density);
    else if (cfg[i].optim == GPT_OPT_DILOCO)
      snprintf(comp, sizeof comp, "%d/%d/%d/%s", cfg[i].learners, cfg[i].diloco.H, cfg[i].diloco.fragments,
               outer_codec_name(cfg[i].diloco.codec));
    else if (cfg[i].optim != GPT_OPT_ADAMW)
      snprintf(comp, sizeof comp, "%d/%d/%s/%g", cfg[i].chunk, cfg[i].topk, values_name(cfg[i].values),
               (double)cfg[i].decay);
    printf("%-13s %7.2g %-17s %8.4f %8.4f %14s %10s %14s %11s %10s %6s %6.1f%% (%.1f%%)\n", names[i],
           (double)cfg[i].lr, comp, r->final_val, r->final_val / ref->final_val,
           fmt_bytes(b1, sizeof b1, r->sent_per_step), fmt_bytes(b4, sizeof b4, r->peak_sent),
           fmt_bytes(b2, sizeof b2, r->recv_per_step), fmt_bytes(b3, sizeof b3, (double)r->total_sent), less,
           fmt_duration(d1, sizeof d1, r->wall), 100 * share, 100 * own);
  }
  printf("bytes: per rank per step from distro_step_stats (DisTrO: its payload, all-gathered; adamw: its share of\n"
         "a ring all-reduce of the fp32 gradients; DiLoCo: inner plus outer traffic, the outer payloads amortized\n"
         "over the steps in the mean, whole in the peak). optimizer share: distro_step_stats.seconds_total (DiLoCo:\n"
         "plus its outer work) / step time; in brackets without the inner collective, which with in-process ranks\n"
         "is mostly waiting for the slowest rank.\n");

  if (tsv_path && write_tsv(tsv_path, base, cfg, res, names, nrows) != 0) {
    free(res);
    return 1;
  }

  /* The targets of issue 3, checked on the best DisTrO variant. */
  int best = 1;
  for (int i = 1; i < nrows; i++)
    if (cfg[i].optim != GPT_OPT_DILOCO && res[i].final_val < res[best].final_val) best = i;
  const double gap = res[best].final_val / ref->final_val - 1;
  const double fewer = ref->sent_per_step / res[best].sent_per_step;
  double worst_share = 0;
  for (int i = 0; i < nrows; i++)
    if (res[i].step_seconds > 0 && res[i].optim_seconds / res[i].step_seconds > worst_share)
      worst_share = res[i].optim_seconds / res[i].step_seconds;
  printf("targets: best DisTrO variant %s: val loss %+.2f%% vs adamw (target <= +3%%): %s; %.0fx fewer bytes per step\n"
         "per rank than the fp32 all-reduce (target >= 50x): %s; optimizer share of step, worst variant %.1f%%\n"
         "(target <= 15%%): %s. Total time for the %d runs: %s.\n",
         names[best], 100 * gap, gap <= 0.03 ? "met" : "MISSED", fewer, fewer >= 50 ? "met" : "MISSED",
         100 * worst_share, worst_share <= 0.15 ? "met" : "MISSED", nrows, fmt_duration(d1, sizeof d1, total));
  distro_adamw_target(res, cfg, names, nrows);
  diloco_targets(res, cfg, names, nrows);
  sparseloco_targets(res, cfg, names, nrows);
  if (!all)
    printf("(the rows of the three optimizers a user swaps between; --compare-all adds distro-ref, the DiLoCo rows\n"
           "and sparseloco)\n");
  fflush(stdout);

  int rc = 0;
  if (plot_path) {
    if (plot(plot_path, base, res, names, nrows) == 0)
      printf("plot: %s\n", plot_path);
    else
      rc = 2;
  }
  free(res);
  return rc;
}
