/* Goodput simulator (bench/goodput): limits, closed forms, determinism,
 * monotonicity in the number of learners, parameter errors, and the paper's
 * table with the defaults. Nothing here measures time. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "goodput_sim.h"

static goodput_params defaults(void) {
  goodput_params p;
  goodput_params_default(&p);
  return p;
}

static goodput_result simulate(const goodput_params *p) {
  goodput_result r;
  char err[256] = "";
  int rc = goodput_simulate(p, &r, err, sizeof err);
  cr_assert_eq(rc, GOODPUT_OK, "simulate failed: %s", err);
  return r;
}

/* The five chip-time buckets cover the whole cluster. */
static void expect_accounted(const goodput_result *r) {
  double sum = r->frac_useful + r->frac_straggler + r->frac_lost + r->frac_paused + r->frac_out;
  cr_expect(fabs(sum - 1.0) < 1e-9, "chip-time buckets sum to %.12f", sum);
  cr_expect(r->goodput == r->frac_useful);
}

Test(goodput, no_failures_is_full_goodput) {
  goodput_params p = defaults();
  p.mtbf_chip_h = INFINITY;
  p.jitter = 0;
  p.horizon_h = 24;
  const int learners[] = {1, 2, 8};
  for (int e = 0; e <= 1; e++)
    for (size_t i = 0; i < sizeof learners / sizeof *learners; i++) {
      p.elastic = e;
      p.learners = learners[i];
      p.quorum = learners[i];
      goodput_result r = simulate(&p);
      cr_expect(fabs(r.goodput - 1.0) < 1e-12, "elastic=%d M=%d goodput %.15f", e, p.learners, r.goodput);
      cr_expect_eq(r.uptime, 1.0);
      cr_expect_eq(r.failures, 0);
      cr_expect_eq(r.pauses, 0);
      if (p.learners > 1) cr_expect_eq(r.participation, 1.0);
      expect_accounted(&r);
    }
}

/* One elastic learner, repairs instantaneous, no speed variation: an
 * alternating renewal process (docs/goodput.md derives the closed form). */
Test(goodput, single_elastic_learner_matches_renewal_closed_form) {
  goodput_params p = defaults();
  p.chips = 1200000;
  p.repair_h = 0;
  p.jitter = 0;
  p.horizon_h = 200;
  goodput_result r = simulate(&p);
  double g, u;
  cr_assert_eq(goodput_closed_form(&p, &g, &u, NULL, 0), GOODPUT_OK);
  /* By hand: rate l, pause d, step s: uptime 1/(1+l d), goodput s/(e^{l s}-1) / (1/l + d). */
  double l = 1200000.0 / (8760.0 * 3600.0), d = p.t_detect + p.t_reconfig, s = p.step_s;
  cr_expect(fabs(u - 1.0 / (1.0 + l * d)) < 1e-12);
  cr_expect(fabs(g - s / expm1(l * s) / (1.0 / l + d)) < 1e-12);
  /* About 27k renewal cycles: the standard error is ~0.2 points. */
  cr_expect(fabs(r.uptime - u) < 0.01, "uptime sim %.4f closed %.4f", r.uptime, u);
  cr_expect(fabs(r.goodput - g) < 0.01, "goodput sim %.4f closed %.4f", r.goodput, g);
  expect_accounted(&r);
}

Test(goodput, rigid_learner_matches_renewal_closed_form) {
  goodput_params p = defaults();
  p.chips = 600000;
  p.elastic = 0;
  p.repair_h = 0;
  p.jitter = 0;
  p.ckpt_s = 10;
  p.horizon_h = 200;
  goodput_result r = simulate(&p);
  double g, u;
  cr_assert_eq(goodput_closed_form(&p, &g, &u, NULL, 0), GOODPUT_OK);
  cr_expect(fabs(r.uptime - u) < 0.01, "uptime sim %.4f closed %.4f", r.uptime, u);
  cr_expect(fabs(r.goodput - g) < 0.01, "goodput sim %.4f closed %.4f", r.goodput, g);
  expect_accounted(&r);
}

/* Independent learners: uptime with quorum K is a binomial tail. */
Test(goodput, quorum_uptime_matches_binomial_closed_form) {
  goodput_params p = defaults();
  p.chips = 2400000;
  p.learners = 4;
  p.quorum = 3;
  p.repair_h = 0;
  p.jitter = 0;
  p.horizon_h = 200;
  goodput_result r = simulate(&p);
  double g, u;
  cr_assert_eq(goodput_closed_form(&p, &g, &u, NULL, 0), GOODPUT_OK);
  cr_expect(fabs(r.uptime - u) < 0.01, "uptime sim %.4f closed %.4f", r.uptime, u);
  cr_expect(fabs(r.goodput - g) < 0.01, "goodput sim %.4f closed %.4f", r.goodput, g);
}

/* Without coalescing every failure restarts the pause: uptime e^{-l d}. */
Test(goodput, no_coalescing_matches_exponential_uptime) {
  goodput_params p = defaults();
  p.chips = 1200000;
  p.coalesce = 0;
  p.repair_h = 0;
  p.jitter = 0;
  p.horizon_h = 200;
  goodput_result r = simulate(&p);
  double l = 1200000.0 / (8760.0 * 3600.0), d = p.t_detect + p.t_reconfig;
  cr_expect(fabs(r.uptime - exp(-l * d)) < 0.01, "uptime sim %.4f closed %.4f", r.uptime, exp(-l * d));
  expect_accounted(&r);
}

Test(goodput, fixed_seed_gives_identical_output) {
  goodput_params p = defaults();
  p.chips = 300000;
  p.learners = 4;
  p.horizon_h = 24;
  goodput_result a = simulate(&p), b = simulate(&p);
  cr_expect(memcmp(&a, &b, sizeof a) == 0, "two runs with seed %llu differ", (unsigned long long)p.seed);
  p.elastic = 0;
  a = simulate(&p);
  b = simulate(&p);
  cr_expect(memcmp(&a, &b, sizeof a) == 0, "rigid runs differ");
  p.seed = 2;
  goodput_result c = simulate(&p);
  cr_expect(c.failures != a.failures || c.goodput != a.goodput, "another seed changes the draw");
}

Test(goodput, more_learners_never_reduce_uptime) {
  goodput_params p = defaults();
  p.horizon_h = 48;
  const long chips[] = {150000, 600000, 1200000, 2400000};
  const int learners[] = {1, 2, 4, 8, 16};
  for (size_t i = 0; i < sizeof chips / sizeof *chips; i++) {
    double prev = -1;
    for (size_t k = 0; k < sizeof learners / sizeof *learners; k++) {
      p.chips = chips[i];
      p.learners = learners[k];
      goodput_result r = simulate(&p);
      cr_expect(r.uptime >= prev, "chips %ld: uptime %.6f at M=%d below %.6f", chips[i], r.uptime, learners[k],
                prev);
      prev = r.uptime;
      expect_accounted(&r);
    }
  }
}

/* Each bad parameter gives EINVAL and a message naming it; nothing printed. */
static void expect_invalid(const goodput_params *p, const char *word) {
  char err[256] = "";
  goodput_result r;
  memset(&r, 0xff, sizeof r);
  cr_expect_eq(goodput_validate(p, err, sizeof err), GOODPUT_EINVAL, "validate accepted (%s)", word);
  cr_expect(strstr(err, word) != NULL, "message '%s' does not mention %s", err, word);
  err[0] = 0;
  cr_expect_eq(goodput_simulate(p, &r, err, sizeof err), GOODPUT_EINVAL);
  cr_expect(strstr(err, word) != NULL, "simulate message '%s' does not mention %s", err, word);
  cr_expect_eq(r.goodput, 0.0, "result zeroed on error");
  cr_expect_eq(goodput_closed_form(p, NULL, NULL, NULL, 0), GOODPUT_EINVAL);
}

Test(goodput, invalid_parameters_are_reported) {
  goodput_params p;
#define BAD(field, value, word) \
  do {                          \
    p = defaults();             \
    p.field = value;            \
    expect_invalid(&p, word);   \
  } while (0)
  BAD(t_detect, -1, "t_detect");
  BAD(t_reconfig, -0.5, "t_reconfig");
  BAD(t_restart, -3, "t_restart");
  BAD(t_upscale, NAN, "t_upscale");
  BAD(repair_h, -1, "repair_h");
  BAD(chips, 0, "chips");
  BAD(learners, 0, "learners");
  BAD(quorum, 0, "quorum");
  BAD(mtbf_chip_h, 0, "mtbf_chip_h");
  BAD(mtbf_chip_h, NAN, "mtbf_chip_h");
  BAD(step_s, 0, "step_s");
  BAD(jitter, 1.0, "jitter");
  BAD(gamma, 1.0, "gamma");
  BAD(horizon_h, -5, "horizon_h");
  BAD(elastic, 2, "elastic");
  BAD(unit_chips, 0, "unit_chips");
#undef BAD
  p = defaults();
  p.chips = 10;
  p.learners = 11;
  expect_invalid(&p, "exceeds chips");
  p = defaults();
  p.learners = 4;
  p.quorum = 5;
  expect_invalid(&p, "exceeds learners");
  p = defaults();
  p.chips = 64;
  p.learners = 16;
  p.unit_chips = 8;
  expect_invalid(&p, "unit_chips");

  char err[64] = "";
  goodput_result r;
  cr_expect_eq(goodput_simulate(NULL, &r, err, sizeof err), GOODPUT_EINVAL);
  cr_expect(strlen(err) > 0);
  p = defaults();
  cr_expect_eq(goodput_simulate(&p, NULL, NULL, 0), GOODPUT_EINVAL, "NULL result, NULL err buffer");
  /* A tiny error buffer truncates, never overflows. */
  char tiny[8];
  p.quorum = 9;
  cr_expect_eq(goodput_validate(&p, tiny, sizeof tiny), GOODPUT_EINVAL);
  cr_expect_eq(strlen(tiny), sizeof tiny - 1);
}

Test(goodput, rigid_learner_too_small_for_its_spares) {
  goodput_params p = defaults();
  p.chips = 8;
  p.elastic = 0;
  p.mtbf_chip_h = 1;
  p.repair_h = 1000;
  char err[256] = "";
  goodput_result r;
  cr_expect_eq(goodput_simulate(&p, &r, err, sizeof err), GOODPUT_EINVAL);
  cr_expect(strstr(err, "spare") != NULL, "message: %s", err);
}

Test(goodput, expected_max_of_normals) {
  cr_expect_eq(goodput_expected_max_normal(1), 0.0);
  cr_expect(fabs(goodput_expected_max_normal(2) - 1.0 / sqrt(3.14159265358979323846)) < 1e-6);
  cr_expect(fabs(goodput_expected_max_normal(3) - 1.5 / sqrt(3.14159265358979323846)) < 1e-6);
  double m = goodput_expected_max_normal(1000000);
  cr_expect(m > 4.7 && m < 5.0, "E[max of 1e6 normals] = %f", m);
}

/* The target with the shipped defaults: every published cell within
 * +-5 points and the ordering rigid < elastic < M=2 < M=8 < M=16. */
Test(goodput, defaults_reproduce_the_paper_table) {
  const struct {
    long chips;
    int learners, elastic;
    double paper;
  } cells[] = {{1200000, 1, 1, 58}, {1200000, 2, 1, 70}, {1200000, 8, 1, 88}, {1200000, 16, 1, 93},
               {2400000, 1, 0, 18}, {2400000, 1, 1, 40}, {2400000, 8, 1, 80}, {2400000, 16, 1, 86}};
  for (size_t i = 0; i < sizeof cells / sizeof *cells; i++) {
    goodput_params p = defaults();
    p.chips = cells[i].chips;
    p.learners = cells[i].learners;
    p.elastic = cells[i].elastic;
    goodput_result r = simulate(&p);
    double g;
    cr_assert_eq(goodput_closed_form(&p, &g, NULL, NULL, 0), GOODPUT_OK);
    cr_expect(fabs(r.goodput - g) < 0.01, "closed form %.4f vs simulation %.4f", g, r.goodput);
    cr_expect(fabs(100 * r.goodput - cells[i].paper) <= 5.0, "%ld chips M=%d elastic=%d: %.1f%% vs paper %.0f%%",
              cells[i].chips, cells[i].learners, cells[i].elastic, 100 * r.goodput, cells[i].paper);
    if (cells[i].learners >= 8) cr_expect(r.uptime > 0.999, "uptime %.4f", r.uptime);
  }
  const long chips[] = {150000, 300000, 600000, 1200000, 2400000};
  const int learners[] = {1, 1, 2, 8, 16}, elastic[] = {0, 1, 1, 1, 1};
  for (size_t i = 0; i < sizeof chips / sizeof *chips; i++) {
    double prev = -1;
    for (int k = 0; k < 5; k++) {
      goodput_params p = defaults();
      p.chips = chips[i];
      p.learners = learners[k];
      p.elastic = elastic[k];
      goodput_result r = simulate(&p);
      cr_expect(r.goodput > prev, "chips %ld: order broken at M=%d elastic=%d", chips[i], learners[k], elastic[k]);
      prev = r.goodput;
    }
  }
}
