/* goodput: the Decoupled DiLoCo goodput table, a sweep, CSV and a PNG plot.
 *
 *   goodput                 paper table + sweep with the defaults, files in --out
 *   goodput --one --chips 600000 --learners 8 --quorum 2
 *                           one configuration, with where the chip-time went
 *
 * Every knob of goodput_params has a flag (goodput --help); knobs apply to the
 * table and the sweep too. The model is in docs/goodput.md. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "goodput_sim.h"

#ifndef GOODPUT_OUT_DIR
#define GOODPUT_OUT_DIR "."
#endif

/* ---- options ----------------------------------------------------------- */

typedef struct {
  goodput_params p;
  int one, plot;
  const char *out;
} options;

static void usage(FILE *f) {
  fprintf(f,
          "usage: goodput [--one] [options]\n"
          "  without --one: the paper's table side by side, a sweep over 150k..2.4M chips and\n"
          "  M in {1,2,4,8,16}, written as CSV and a gnuplot PNG under --out\n"
          "  --one                 simulate only --chips/--learners/--quorum/--rigid\n"
          "  --chips N  --learners M  --quorum K  --rigid (no elasticity)  --no-coalesce\n"
          "  --mtbf-h H            chip MTBF, hours (8760)\n"
          "  --unit C              chips one failure takes out (4)\n"
          "  --repair-h H          repair and return, hours (48)\n"
          "  --detect S --reconfig S --restart S --peer S --upscale S --upscale-wait S  seconds\n"
          "  --step S --ckpt S --jitter X --inner-steps H --fragments P --tau T --gamma G --sync S\n"
          "  --horizon-h H         simulated hours per configuration (168)\n"
          "  --seed S              PRNG seed (1)\n"
          "  --out DIR             where CSV, gnuplot script and PNG go (%s)\n"
          "  --no-plot             skip the files\n",
          GOODPUT_OUT_DIR);
}

static int parse_double(const char *s, double *v) {
  char *end;
  *v = strtod(s, &end);
  return *s && !*end;
}

static int parse_long(const char *s, long *v) {
  char *end;
  *v = strtol(s, &end, 10);
  return *s && !*end;
}

static int parse_int(const char *s, int *v) {
  long x;
  if (!parse_long(s, &x) || x < INT_MIN || x > INT_MAX) return 0;
  *v = (int)x;
  return 1;
}

static int parse_args(int argc, char **argv, options *o) {
  goodput_params_default(&o->p);
  o->one = 0;
  o->plot = 1;
  o->out = GOODPUT_OUT_DIR;
  goodput_params *p = &o->p;
  const struct {
    const char *name;
    double *v;
  } dbl[] = {{"--mtbf-h", &p->mtbf_chip_h}, {"--repair-h", &p->repair_h},   {"--detect", &p->t_detect},
             {"--reconfig", &p->t_reconfig}, {"--restart", &p->t_restart}, {"--peer", &p->t_peer},
             {"--upscale", &p->t_upscale},   {"--upscale-wait", &p->upscale_wait},
             {"--step", &p->step_s},         {"--ckpt", &p->ckpt_s},       {"--jitter", &p->jitter},
             {"--gamma", &p->gamma},         {"--sync", &p->t_sync},       {"--horizon-h", &p->horizon_h}};
  const struct {
    const char *name;
    long *v;
  } lng[] = {{"--chips", &p->chips}, {"--unit", &p->unit_chips}};
  const struct {
    const char *name;
    int *v;
  } ints[] = {{"--learners", &p->learners},      {"--quorum", &p->quorum},       {"--tau", &p->tau},
              {"--inner-steps", &p->inner_steps}, {"--fragments", &p->fragments}};
  const struct {
    const char *name;
    int *v, value;
  } flags[] = {{"--one", &o->one, 1}, {"--no-plot", &o->plot, 0}, {"--rigid", &p->elastic, 0},
               {"--no-coalesce", &p->coalesce, 0}};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      exit(0);
    }
    int done = 0;
    for (size_t k = 0; k < sizeof flags / sizeof *flags; k++)
      if (!strcmp(a, flags[k].name)) {
        *flags[k].v = flags[k].value;
        done = 1;
      }
    if (done) continue;

    /* Everything else takes a value. */
    const char *val = i + 1 < argc ? argv[i + 1] : NULL;
    int known = 0, ok = 0;
    if (!strcmp(a, "--out")) {
      known = 1;
      ok = val != NULL;
      if (ok) o->out = val;
    }
    if (!strcmp(a, "--seed")) {
      long seed;
      known = 1;
      ok = val && parse_long(val, &seed);
      if (ok) p->seed = (uint64_t)seed;
    }
    for (size_t k = 0; k < sizeof dbl / sizeof *dbl; k++)
      if (!strcmp(a, dbl[k].name)) known = 1, ok = val && parse_double(val, dbl[k].v);
    for (size_t k = 0; k < sizeof lng / sizeof *lng; k++)
      if (!strcmp(a, lng[k].name)) known = 1, ok = val && parse_long(val, lng[k].v);
    for (size_t k = 0; k < sizeof ints / sizeof *ints; k++)
      if (!strcmp(a, ints[k].name)) known = 1, ok = val && parse_int(val, ints[k].v);
    if (!known) {
      fprintf(stderr, "goodput: unknown option %s (see --help)\n", a);
      return 0;
    }
    if (!ok) {
      if (val) fprintf(stderr, "goodput: %s: not a valid value: %s\n", a, val);
      else fprintf(stderr, "goodput: %s needs a value\n", a);
      return 0;
    }
    i++;
  }
  return 1;
}

/* ---- runs -------------------------------------------------------------- */

typedef struct {
  const char *label; /* long name, for the table */
  const char *key;   /* short name, for CSV */
  int learners, elastic;
} config;

static const config CONFIGS[] = {
    {"data-parallel, no elasticity", "dp_rigid", 1, 0}, {"elastic data-parallel", "dp_elastic", 1, 1},
    {"Decoupled DiLoCo M=2", "diloco_m2", 2, 1},        {"Decoupled DiLoCo M=4", "diloco_m4", 4, 1},
    {"Decoupled DiLoCo M=8", "diloco_m8", 8, 1},        {"Decoupled DiLoCo M=16", "diloco_m16", 16, 1},
};
enum { NCONFIG = sizeof CONFIGS / sizeof *CONFIGS };

static int run(const goodput_params *base, long chips, const config *c, goodput_result *r) {
  goodput_params p = *base;
  p.chips = chips;
  p.learners = c->learners;
  p.elastic = c->elastic;
  if (p.quorum > p.learners) p.quorum = p.learners;
  char err[256];
  if (goodput_simulate(&p, r, err, sizeof err) != GOODPUT_OK) {
    fprintf(stderr, "goodput: %ld chips, %s: %s\n", chips, c->label, err);
    return 0;
  }
  return 1;
}

static const char *chips_name(long chips, char *buf, size_t n) {
  if (chips >= 1000000 && chips % 100000 == 0) snprintf(buf, n, "%.1fM", chips / 1e6);
  else if (chips >= 1000) snprintf(buf, n, "%.0fk", chips / 1e3);
  else snprintf(buf, n, "%ld", chips);
  return buf;
}

/* ---- the paper's table ------------------------------------------------- */

/* Section 4 of docs/algorithms.md; paper < 0: not published. Uptime: 100% once M >= 4. */
static const struct {
  long chips;
  int config;
  double paper;
} PAPER[] = {
    {1200000, 1, 58}, {1200000, 2, 70}, {1200000, 3, -1}, {1200000, 4, 88}, {1200000, 5, 93},
    {2400000, 0, 18}, {2400000, 1, 40}, {2400000, 3, -1}, {2400000, 4, 80}, {2400000, 5, 86},
};
enum { NPAPER = sizeof PAPER / sizeof *PAPER };

static int paper_table(const goodput_params *p) {
  printf("Goodput vs Decoupled DiLoCo (Douillard, Dean et al., 2026), chip MTBF %.0f h\n", p->mtbf_chip_h);
  printf("%.0f h simulated per row, seed %llu; closed form: renewal-reward, docs/goodput.md\n\n", p->horizon_h,
         (unsigned long long)p->seed);
  printf("%-6s %-30s %8s %6s %6s %8s %8s %7s\n", "chips", "configuration", "goodput", "paper", "diff", "closed",
         "uptime", "paper");
  int within = 0, cells = 0;
  for (int i = 0; i < NPAPER; i++) {
    const config *c = &CONFIGS[PAPER[i].config];
    goodput_result r;
    if (!run(p, PAPER[i].chips, c, &r)) return 0;
    goodput_params q = *p;
    q.chips = PAPER[i].chips;
    q.learners = c->learners;
    q.elastic = c->elastic;
    if (q.quorum > q.learners) q.quorum = q.learners;
    double cf = NAN;
    goodput_closed_form(&q, &cf, NULL, NULL, 0);
    char name[32], paper[16] = "-", diff[16] = "-";
    if (PAPER[i].paper >= 0) {
      double d = 100 * r.goodput - PAPER[i].paper;
      snprintf(paper, sizeof paper, "%.0f%%", PAPER[i].paper);
      snprintf(diff, sizeof diff, "%+.1f", d);
      cells++;
      within += fabs(d) <= 5.0;
    }
    printf("%-6s %-30s %7.1f%% %6s %6s %7.1f%% %7.2f%% %7s\n", chips_name(PAPER[i].chips, name, sizeof name),
           c->label, 100 * r.goodput, paper, diff, 100 * cf, 100 * r.uptime, c->learners >= 4 ? "100%" : "-");
  }
  printf("\ncells within +-5 points of the paper: %d of %d\n", within, cells);
  return 1;
}

/* ---- sweep, CSV, plot -------------------------------------------------- */

enum { NSWEEP = 9 };

static int write_plot(const char *dir, double mtbf_h, const long *chips, goodput_result res[][NCONFIG]) {
  if (strchr(dir, '\'')) {
    fprintf(stderr, "goodput: --out must not contain a quote\n");
    return 0;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/goodput_wide.dat", dir);
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "goodput: cannot write %s\n", path);
    return 0;
  }
  fprintf(f, "# chips, then goodput %% of each config, then uptime %%:");
  for (int c = 0; c < NCONFIG; c++) fprintf(f, " %s", CONFIGS[c].key);
  fprintf(f, "\n");
  for (int i = 0; i < NSWEEP; i++) {
    fprintf(f, "%ld", chips[i]);
    for (int c = 0; c < NCONFIG; c++) fprintf(f, " %.3f", 100 * res[i][c].goodput);
    for (int c = 0; c < NCONFIG; c++) fprintf(f, " %.3f", 100 * res[i][c].uptime);
    fprintf(f, "\n");
  }
  fclose(f);

  snprintf(path, sizeof path, "%s/goodput_paper.dat", dir);
  f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "goodput: cannot write %s\n", path);
    return 0;
  }
  fprintf(f, "# chips goodput%% config-index (paper, docs/algorithms.md section 4)\n");
  for (int i = 0; i < NPAPER; i++)
    if (PAPER[i].paper >= 0) fprintf(f, "%ld %.0f %d\n", PAPER[i].chips, PAPER[i].paper, PAPER[i].config);
  fclose(f);

  snprintf(path, sizeof path, "%s/goodput.gp", dir);
  f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "goodput: cannot write %s\n", path);
    return 0;
  }
  fprintf(f,
          "# Written by goodput; run with: gnuplot goodput.gp\n"
          "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) { set terminal pngcairo size 1400,560 font ',11' }"
          " else { set terminal png size 1400,560 }\n"
          "set output '%s/goodput.png'\n"
          "set linetype 1 lc rgb '#7b2cbf'\nset linetype 2 lc rgb '#2a9d8f'\nset linetype 3 lc rgb '#56b4e9'\n"
          "set linetype 4 lc rgb '#e69f00'\nset linetype 5 lc rgb '#d62728'\nset linetype 6 lc rgb '#0b3c8c'\n"
          "set multiplot layout 1,2\n"
          "set logscale x 2\n"
          "set xtics ('150k' 150000, '300k' 300000, '600k' 600000, '1.2M' 1200000, '2.4M' 2400000)\n"
          "set xrange [140000:2600000]\n"
          "set grid\n"
          "set key bottom left\n"
          "set xlabel 'chips (MTBF %.0f h per chip)'\n"
          "set ylabel 'goodput %%'\n"
          "set yrange [0:100]\n"
          "set title 'Goodput: simulated (lines), paper (points)'\n"
          "d = '%s/goodput_wide.dat'\n"
          "p = '%s/goodput_paper.dat'\n"
          "plot ",
          dir, mtbf_h, dir, dir);
  for (int c = 0; c < NCONFIG; c++)
    fprintf(f, "d using 1:%d with linespoints lw 2 pt 7 ps 0.6 lc %d title '%s', ", c + 2, c + 1, CONFIGS[c].label);
  fprintf(f, "p using 1:2:($3+1) with points pt 4 ps 2.2 lw 2 lc variable title 'paper (squares)'\n");
  fprintf(f,
          "set title 'Uptime: time with >= K learners training'\n"
          "set ylabel 'uptime %%'\n"
          "plot ");
  for (int c = 0; c < NCONFIG; c++)
    fprintf(f, "d using 1:%d with linespoints lw 2 pt 7 ps 0.6 lc %d title '%s'%s", c + 2 + NCONFIG, c + 1,
            CONFIGS[c].label, c + 1 < NCONFIG ? ", " : "\n");
  fprintf(f, "unset multiplot\n");
  fclose(f);

  if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
    printf("gnuplot not found: wrote %s; no PNG\n", path);
    return 1;
  }
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "gnuplot '%s'", path);
  if (system(cmd) != 0) {
    fprintf(stderr, "goodput: gnuplot failed on %s\n", path);
    return 0;
  }
  printf("plot: %s/goodput.png\n", dir);
  return 1;
}

static int sweep(const options *o) {
  const goodput_params *p = &o->p;
  long chips[NSWEEP];
  for (int i = 0; i < NSWEEP; i++) chips[i] = lround(150000.0 * pow(2.0, i / 2.0));
  goodput_result res[NSWEEP][NCONFIG];
  for (int i = 0; i < NSWEEP; i++)
    for (int c = 0; c < NCONFIG; c++)
      if (!run(p, chips[i], &CONFIGS[c], &res[i][c])) return 0;

  printf("\nSweep: goodput %% (uptime %%), quorum K=%d\n%-6s", p->quorum, "chips");
  const char *heads[NCONFIG] = {"DP rigid", "DP elastic", "M=2", "M=4", "M=8", "M=16"};
  for (int c = 0; c < NCONFIG; c++) printf(" %15s", heads[c]);
  printf("\n");
  int ordered = 1;
  for (int i = 0; i < NSWEEP; i++) {
    char name[32];
    printf("%-6s", chips_name(chips[i], name, sizeof name));
    for (int c = 0; c < NCONFIG; c++) printf("     %4.1f (%5.1f)", 100 * res[i][c].goodput, 100 * res[i][c].uptime);
    printf("\n");
    /* rigid < elastic < M=2 < M=8 < M=16 */
    const int order[] = {0, 1, 2, 4, 5};
    for (int k = 0; k + 1 < 5; k++) ordered &= res[i][order[k]].goodput < res[i][order[k + 1]].goodput;
  }
  printf("ordering DP rigid < DP elastic < M=2 < M=8 < M=16 at every size: %s\n", ordered ? "yes" : "NO");

  if (!o->plot) return 1;
  char path[4096];
  snprintf(path, sizeof path, "%s/goodput.csv", o->out);
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "goodput: cannot write %s\n", path);
    return 0;
  }
  fprintf(f, "chips,config,learners,quorum,elastic,goodput,uptime,learner_up,participation,stalled,failures,"
             "absorbed,pauses,upscales,frac_useful,frac_straggler,frac_lost,frac_paused,frac_out\n");
  for (int i = 0; i < NSWEEP; i++)
    for (int c = 0; c < NCONFIG; c++) {
      const goodput_result *r = &res[i][c];
      int k = p->quorum > CONFIGS[c].learners ? CONFIGS[c].learners : p->quorum;
      fprintf(f, "%ld,%s,%d,%d,%d,%.6f,%.6f,%.6f,%.6f,%.6f,%ld,%ld,%ld,%ld,%.6f,%.6f,%.6f,%.6f,%.6f\n", chips[i],
              CONFIGS[c].key, CONFIGS[c].learners, k, CONFIGS[c].elastic, r->goodput, r->uptime, r->learner_up,
              r->participation, r->stalled, r->failures, r->absorbed, r->pauses, r->upscales, r->frac_useful,
              r->frac_straggler, r->frac_lost, r->frac_paused, r->frac_out);
    }
  fclose(f);
  printf("csv: %s\n", path);
  return write_plot(o->out, p->mtbf_chip_h, chips, res);
}

/* ---- one configuration ------------------------------------------------- */

static int one(const goodput_params *p) {
  goodput_result r;
  char err[256];
  if (goodput_simulate(p, &r, err, sizeof err) != GOODPUT_OK) {
    fprintf(stderr, "goodput: %s\n", err);
    return 0;
  }
  double cg = NAN, cu = NAN;
  goodput_closed_form(p, &cg, &cu, NULL, 0);
  printf("chips %ld, learners M=%d, quorum K=%d, %s, %.0f h simulated, seed %llu\n", p->chips, p->learners,
         p->quorum, p->elastic ? "elastic" : "rigid (no elasticity)", p->horizon_h, (unsigned long long)p->seed);
  printf("goodput          %6.2f%%   (closed form %.2f%%)\n", 100 * r.goodput, 100 * cg);
  printf("uptime           %6.2f%%   (closed form %.2f%%)\n", 100 * r.uptime, 100 * cu);
  printf("learners up      %6.2f%%\n", 100 * r.learner_up);
  printf("chip-time        useful %.2f%%, straggler wait %.2f%%, discarded work %.2f%%, paused %.2f%%, "
         "out of service %.2f%%\n",
         100 * r.frac_useful, 100 * r.frac_straggler, 100 * r.frac_lost, 100 * r.frac_paused, 100 * r.frac_out);
  printf("failures         %ld (%ld on chips already out), %ld pauses, %ld dedicated upscales\n", r.failures,
         r.absorbed, r.pauses, r.upscales);
  if (p->learners > 1)
    printf("syncer           %ld rounds, %.2f%% waited for quorum, %.1f%% of learners merged per round, "
           "grace %.2f s\n",
           r.rounds, 100 * r.stalled, 100 * r.participation, r.grace_s);
  return 1;
}

int main(int argc, char **argv) {
  options o;
  if (!parse_args(argc, argv, &o)) return 2;
  char err[256];
  /* Validate the knobs once, on a configuration every run shares. */
  goodput_params check = o.p;
  if (!o.one) { /* the smallest cluster and the most learners of the sweep */
    check.learners = 16;
    check.chips = 150000;
  }
  if (goodput_validate(&check, err, sizeof err) != GOODPUT_OK) {
    fprintf(stderr, "goodput: %s\n", err);
    return 2;
  }
  if (o.one) return one(&o.p) ? 0 : 1;
  if (!paper_table(&o.p)) return 1;
  return sweep(&o) ? 0 : 1;
}
