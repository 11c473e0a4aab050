/* gpt-train: command line of the byte-level GPT trainer. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <distro/distro.h>
#ifdef DISTRO_WITH_MPI
#include <distro/mpi.h>
#endif

#include "blas.h"
#include "compare.h"
#include "train.h"

static void usage(FILE *f) {
  char defaults[1024] = "";
  size_t n = 0;
  static const char *names[] = {"adamw", "distro", "distro-adamw"};
  for (int k = 0; k < 3; k++) {
    const variant *v = tuned_variant((gpt_optim_kind)k);
    n += (size_t)snprintf(defaults + n, sizeof defaults - n, "                        %-13s lr %g, warm-up %g%%",
                          names[k], (double)v->lr, 100.0 * v->warmup);
    if (v->optim != GPT_OPT_ADAMW)
      n += (size_t)snprintf(defaults + n, sizeof defaults - n, ", chunk %d, topk %d, decay %g, %s values", v->chunk,
                            v->topk, (double)v->decay, values_name(v->values));
    n += (size_t)snprintf(defaults + n, sizeof defaults - n, "\n");
  }
  const variant *d = tuned_variant(GPT_OPT_DILOCO);
  n += (size_t)snprintf(defaults + n, sizeof defaults - n,
                        "                        %-13s lr %g, warm-up %g%%, inner %s, %d learners, H %d, %d fragment(s), "
                        "%s outer\n",
                        "diloco", (double)d->lr, 100.0 * d->warmup, optim_name(d->inner), d->learners, d->H,
                        d->fragments, outer_codec_name(d->codec));
  const variant *sp = named_variant("sparseloco");
  snprintf(defaults + n, sizeof defaults - n,
           "                        %-13s as diloco with H %d, outer lr %g, sparse %s outer gradients at %g%% density,\n"
           "                                      error feedback beta %g\n",
           "sparseloco", sp->H, (double)sp->outer_lr, values_name(sp->sparse_values), 100.0 * sp->density,
           (double)sp->ef_beta);
  fprintf(f,
"usage: gpt-train [options]             in-process ranks (threads)\n"
"       mpirun -np N gpt-train --mpi [options]   one rank per MPI process\n"
"\n"
"Trains a byte-level GPT on text, data-parallel, with AdamW all-reduce or DisTrO.\n"
"\n"
"data\n"
"  --data FILE         any text file (default: Debian's fortunes, %s)\n"
"model\n"
"  --layers N          transformer blocks (4)\n"
"  --dim N             channels (128)\n"
"  --heads N           attention heads (4)\n"
"  --context N         sequence length in bytes (128)\n"
"  --untied            separate output head (default: tied to the token embedding)\n"
"optimizer\n"
"  --optim NAME        adamw (gradient all-reduce + AdamW), distro (DeMo sign update),\n"
"                      distro-adamw (DisTrO exchange feeding AdamW), diloco (learners\n"
"                      with one of those inside, and an outer step), sparseloco (diloco\n"
"                      with sparse 2-bit outer gradients and error feedback) or decoupled\n"
"                      (one learner of a distro-syncer job); default distro\n"
"  --lr X              peak learning rate (default: the optimizer's, below)\n"
"  --lr-final F        final lr as a fraction of the peak (0.1)\n"
"  --warmup N          linear warm-up steps (default: the optimizer's fraction of the steps)\n"
"  --clip X            clip each rank's local gradient to global L2 norm X (1.0; 0: off).\n"
"                      The all-reduce happens inside the optimizer step, so for every\n"
"                      optimizer this is per rank, before averaging.\n"
"  --clip-per-tensor   clip each tensor instead, by its own norm, to X times the square\n"
"                      root of its usual share of the squared norm (an EMA over the\n"
"                      steps, from its share of the parameters), as backward completes it\n"
"  --wd X              decoupled weight decay (0)\n"
"  --beta1 X, --beta2 X  AdamW moments (adamw, distro-adamw) (0.9, 0.95)\n"
"  --topk N            DisTrO: coefficients kept per chunk\n"
"  --chunk N           DisTrO: DCT chunk edge\n"
"  --decay X           DisTrO: momentum decay\n"
"  --values V          DisTrO: f32, bf16, sign1 (1 bit per value: a vote), int8, int4\n"
"  --overlap-step      DisTrO (distro, distro-adamw): each step applies the previous\n"
"                      step's aggregate and leaves its own all-gather running in the\n"
"                      background, hidden behind the next forward/backward; meanwhile\n"
"                      each rank steps along the sign of its own whole momentum\n"
"                      (look-ahead; options.overlap; docs/design.md \"Overlap\")\n"
"  --overlap-stale     the same without the look-ahead step (one-step-stale, as Psyche)\n"
"  --overlap-backward  DisTrO: the blocking step, its all-gather started in parts during\n"
"                      backward as tensors' gradients become final (the gradient-ready\n"
"                      exchange; implies --clip-per-tensor)\n"
"  each --optim's defaults, tuned on the demo setting (README.md):\n"
"%s"
"DiLoCo (--optim diloco; docs/diloco.md)\n"
"  --inner NAME        the learners' optimizer: adamw, distro, distro-adamw (adamw)\n"
"  --learners M        learners (4)\n"
"  --ranks-per-learner R  data-parallel ranks inside a learner (1); the run has M x R ranks\n"
"  --H N               inner steps between two syncs of a fragment (15)\n"
"  --fragments P       streaming: P fragments synced at staggered steps (1)\n"
"  --overlap N         apply a sync N steps after it started, training meanwhile (0)\n"
"  --alpha X           on arrival: local <- X*local + (1-X)*global (0)\n"
"  --outer-lr X        outer Nesterov SGD learning rate (1: the learners' mean)\n"
"  --outer-momentum X  its momentum (0; the paper's 0.9 did worse here, README.md)\n"
"  --outer-codec C     outer gradients as f32, bf16, int8, int4 or fp4 (int4)\n"
"  --outer-block N     elements per scale of int8/int4/fp4 outer gradients (64)\n"
"  --merge M           mean, tokens, radial or radial-tokens (mean)\n"
"  --progress-thread   run each sync on a helper thread while inner steps continue\n"
"SparseLoCo (--optim sparseloco: the DiLoCo flags above, and docs/diloco.md)\n"
"  --density X         kept fraction of each chunk of the error-feedback buffer, (0, 1]\n"
"  --sparse-chunk N    chunk edge: N x N tiles of matrices, N^2-element runs otherwise (64)\n"
"  --dct on|off        top-k of each tile's DCT instead of the values (off)\n"
"  --ef-beta X         error feedback e <- X*e + outer gradient, [0, 1)\n"
"  --sparse-values V   int2 (2 bits + a scale per chunk), int4, int8, bf16 or f32\n"
"Decoupled DiLoCo (--optim decoupled; python-free-examples/decoupled/README.md)\n"
"                      this run is one learner of a job held by distro-syncer (which\n"
"                      sets the fragments, H, codec, merge and outer step); its --ranks\n"
"                      are one data-parallel learner, only rank 0 talks to the syncer\n"
"  --syncer ENDPOINT   the syncer's ZeroMQ endpoint (tcp://HOST:PORT, ipc://PATH)\n"
"  --learner-id N      this learner's id in the job, 0..255, unique\n"
"  --serve-endpoint EP where peers pull this learner's state when they join\n"
"                      (tcp://127.0.0.1:*; give a routable address when the learners\n"
"                      are on different hosts or network namespaces)\n"
"  --curve-server-key F --curve-keypair F\n"
"                      CURVE: the syncer's public key file and this learner's keypair\n"
"                      (distro-syncer --keygen); needed to reach a syncer or serve peers\n"
"                      on a non-loopback address, unless --insecure\n"
"  --sync-timeout S    the syncer silent this long: say hello again (2; slow links want more)\n"
"  --insecure          talk to the syncer and serve peers without CURVE on a routable\n"
"                      address (a private network only: docs/protocol.md, threat model)\n"
"  --inner NAME        the inner optimizer over the learner's ranks (adamw)\n"
"  --step-delay-ms X   sleep X ms after each step (emulates a slower learner)\n"
"  --time-limit S      stop after S seconds (final validation included)\n"
"  --start-step N      begin the lr schedule at step N (a learner restarted mid-run)\n"
"training\n"
"  --steps N           optimizer steps (300)\n"
"  --batch N           sequences per rank per step (8)\n"
"  --seed N            initialisation and data order (1)\n"
"  --sampling MODE     where each rank draws its windows: global (every rank from the whole\n"
"                      training split, its own random stream) or shard (rank r from the r-th\n"
"                      contiguous 1/N of it: ranks see different text) (global)\n"
"  --ranks N           in-process ranks (2)\n"
"  --threads N         OpenMP threads per rank (default: cores / ranks on this machine;\n"
"                      with --mpi, the MPI ranks sharing this node)\n"
"  --mpi               one rank per MPI process (run under mpirun)\n"
"  --comm-timeout S    give up on a collective after S seconds: a stalled rank stops the\n"
"                      run with an error instead of a hang (0: wait forever; default 0)\n"
"output\n"
"  --eval-every N      validation every N steps (25; 0: only at the end)\n"
"  --eval-batches N    batches per periodic validation (4); the final one uses the whole split\n"
"  --print-every N     progress line every N steps (10)\n"
"  --log FILE.csv      one CSV line per step (--compare: one file per optimizer)\n"
"  --tensor-log FILE.csv  rank 0's weight, gradient and update RMS per tensor, every\n"
"                      --tensor-every N steps (25); the update in units of the step's lr\n"
"  --save FILE         checkpoint at the end (and every --save-every N steps)\n"
"  --save-every N      also checkpoint every N steps (with --overlap-step the\n"
"                      exchange in flight is saved as it is: saving does not\n"
"                      change the run)\n"
"  --resume FILE       continue from a checkpoint (same model, optimizer and ranks)\n"
"  --stop-after N      stop (and save) after step N of the --steps schedule\n"
"  --checksum          print a checksum of the final parameters\n"
"  --quiet             no progress lines\n"
"comparison\n"
"  --compare           run the rows adamw, distro and distro-adamw on the same data, seed\n"
"                      and tokens and print a table (make demo);\n"
"  --compare-all       the same with every row above: also distro-ref (DeMo's reference\n"
"                      setting), the DiLoCo rows diloco-f32, diloco and diloco-stream,\n"
"                      and sparseloco (make demo-full);\n"
"                      settings you give apply to every row they concern. The DiLoCo\n"
"                      rows split the baseline's ranks x batch over their learners.\n"
"  --plot FILE.png     with --compare: plot validation loss and bytes with gnuplot\n"
"  --tsv FILE.tsv      with --compare: the table as data (demo-report.sh prints it)\n"
"  --help              this text\n",
          GPT_FORTUNES_DIR, defaults);
}

static int bad(const char *fmt, const char *a, const char *b) {
  fprintf(stderr, "gpt: ");
  fprintf(stderr, fmt, a, b);
  fprintf(stderr, " (see --help)\n");
  return 2;
}

static int parse_int(const char *flag, const char *s, int min, int *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < INT_MIN || v > INT_MAX)
    return bad("%s: '%s' is not an integer", flag, s);
  if (v < min) {
    char m[32];
    snprintf(m, sizeof m, "%d", min);
    return bad("%s must be >= %s", flag, m);
  }
  *out = (int)v;
  return 0;
}

static int parse_float(const char *flag, const char *s, float min, float *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v)) return bad("%s: '%s' is not a number", flag, s);
  if (v < min) {
    char m[32];
    snprintf(m, sizeof m, "%g", (double)min);
    return bad("%s must be >= %s", flag, m);
  }
  *out = (float)v;
  return 0;
}

int main(int argc, char **argv) {
  gpt_blas_fix_core(argv);
  train_config c;
  memset(&c, 0, sizeof c);
  c.model = (gpt_config){.context = 128, .layers = 4, .dim = 128, .heads = 4, .tied = 1};
  c.steps = 300;
  c.batch = 8;
  c.warmup = -1; /* the optimizer's fraction of the steps (apply_variant) */
  c.lr = NAN;
  c.lr_final = 0.1f;
  c.clip = 1.0f;
  c.wd = 0.0f;
  c.beta1 = 0.9f;
  c.beta2 = 0.95f;
  c.seed = 1;
  c.sampling = GPT_SAMPLE_GLOBAL;
  c.optim = GPT_OPT_DISTRO;
  c.topk = 32; /* the DisTrO settings come from the optimizer's row in compare.c */
  c.chunk = 64;
  c.decay = 0.999f;
  c.values = DISTRO_VALUES_F32;
  c.ranks = 2;
  c.inner = GPT_OPT_ADAMW;
  c.learners = 4;
  c.ranks_per_learner = 1;
  c.diloco = distro_diloco_options_default();
  int ranks_given = 0, diloco_flags = 0, inner_given = 0, decoupled_flags = 0, id_given = 0;
  int sparseloco = 0, sparse_flags = 0; /* --optim sparseloco: DiLoCo with sparse outer gradients */
  c.eval_every = 25;
  c.tensor_every = 25;
  c.eval_batches = 4;
  c.print_every = 10;
  compare_overrides ov = {0};
  int compare = 0, mpi = 0;
  const char *plot_path = NULL, *tsv_path = NULL;

  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    }
    /* Flags without a value. */
    if (!strcmp(a, "--untied")) { c.model.tied = 0; continue; }
    if (!strcmp(a, "--mpi")) { mpi = 1; continue; }
    if (!strcmp(a, "--compare")) { compare = 1; continue; }
    if (!strcmp(a, "--compare-all")) { compare = 2; continue; }
    if (!strcmp(a, "--checksum")) { c.print_checksum = 1; continue; }
    if (!strcmp(a, "--quiet")) { c.quiet = 1; continue; }
    if (!strcmp(a, "--progress-thread")) { c.diloco.progress_thread = 1; diloco_flags = 1; continue; }
    if (!strcmp(a, "--overlap-step")) { c.overlap_step = 1; continue; }
    if (!strcmp(a, "--overlap-stale")) { c.overlap_step = 2; continue; }
    if (!strcmp(a, "--overlap-backward")) { c.overlap_step = 3; c.clip_each = 1; continue; }
    if (!strcmp(a, "--clip-per-tensor")) { c.clip_each = 1; continue; }
    if (!strcmp(a, "--insecure")) { c.insecure = 1; decoupled_flags = 1; continue; }
    static const char *const valued[] = {
        "--data",   "--layers",     "--dim",        "--heads",       "--context", "--optim",      "--lr",
        "--lr-final", "--warmup",   "--clip",       "--wd",          "--beta1",   "--beta2",      "--topk",
        "--chunk",  "--decay",      "--values",     "--steps",       "--batch",   "--seed",       "--ranks",
        "--threads", "--comm-timeout", "--eval-every", "--eval-batches", "--print-every", "--log", "--save", "--save-every",
        "--tensor-log", "--tensor-every",
        "--resume", "--stop-after", "--plot", "--tsv", "--inner",    "--learners", "--ranks-per-learner",
        "--H",      "--fragments",  "--overlap",    "--alpha",       "--outer-lr", "--outer-momentum",
        "--outer-codec", "--outer-block", "--merge", "--syncer", "--learner-id", "--step-delay-ms", "--time-limit",
        "--start-step", "--sampling", "--density", "--sparse-chunk", "--dct", "--ef-beta", "--sparse-values",
        "--serve-endpoint", "--curve-server-key", "--curve-keypair", "--sync-timeout"};
    int known = 0;
    for (size_t k = 0; k < sizeof valued / sizeof *valued; k++) known |= !strcmp(a, valued[k]);
    if (!known) return bad("unknown option '%s'%s", a, "");
    if (i + 1 >= argc) return bad("%s needs a value%s", a, "");
    const char *v = argv[++i];
    int rc = 0, tmp = 0;
    if (!strcmp(a, "--data")) c.data = v;
    else if (!strcmp(a, "--layers")) rc = parse_int(a, v, 1, &c.model.layers);
    else if (!strcmp(a, "--dim")) rc = parse_int(a, v, 1, &c.model.dim);
    else if (!strcmp(a, "--heads")) rc = parse_int(a, v, 1, &c.model.heads);
    else if (!strcmp(a, "--context")) rc = parse_int(a, v, 1, &c.model.context);
    else if (!strcmp(a, "--optim")) {
      if (!strcmp(v, "adamw")) c.optim = GPT_OPT_ADAMW;
      else if (!strcmp(v, "distro")) c.optim = GPT_OPT_DISTRO;
      else if (!strcmp(v, "distro-adamw")) c.optim = GPT_OPT_DISTRO_ADAMW;
      else if (!strcmp(v, "diloco")) c.optim = GPT_OPT_DILOCO;
      else if (!strcmp(v, "decoupled")) c.optim = GPT_OPT_DECOUPLED;
      else if (!strcmp(v, "sparseloco")) c.optim = GPT_OPT_DILOCO;
      else return bad("--optim: '%s' is not one of adamw, distro, distro-adamw, diloco, sparseloco, decoupled%s", v, "");
      sparseloco = !strcmp(v, "sparseloco");
    } else if (!strcmp(a, "--inner")) {
      if (!strcmp(v, "adamw")) c.inner = GPT_OPT_ADAMW;
      else if (!strcmp(v, "distro")) c.inner = GPT_OPT_DISTRO;
      else if (!strcmp(v, "distro-adamw")) c.inner = GPT_OPT_DISTRO_ADAMW;
      else return bad("--inner: '%s' is not one of adamw, distro, distro-adamw%s", v, "");
      ov.inner = inner_given = 1;
    } else if (!strcmp(a, "--learners")) { rc = parse_int(a, v, 1, &c.learners); ov.learners = diloco_flags = 1; }
    else if (!strcmp(a, "--ranks-per-learner")) {
      rc = parse_int(a, v, 1, &c.ranks_per_learner);
      ov.ranks_per_learner = diloco_flags = 1;
    } else if (!strcmp(a, "--H")) { rc = parse_int(a, v, 1, &c.diloco.H); ov.H = diloco_flags = 1; }
    else if (!strcmp(a, "--fragments")) { rc = parse_int(a, v, 1, &c.diloco.fragments); ov.fragments = diloco_flags = 1; }
    else if (!strcmp(a, "--overlap")) { rc = parse_int(a, v, 0, &c.diloco.overlap); diloco_flags = 1; }
    else if (!strcmp(a, "--alpha")) { rc = parse_float(a, v, 0, &c.diloco.alpha); diloco_flags = 1; }
    else if (!strcmp(a, "--outer-lr")) { rc = parse_float(a, v, 0, &c.diloco.outer_lr); ov.outer_lr = diloco_flags = 1; }
    else if (!strcmp(a, "--outer-momentum")) {
      rc = parse_float(a, v, 0, &c.diloco.outer_momentum);
      ov.outer_momentum = diloco_flags = 1;
    } else if (!strcmp(a, "--outer-codec")) {
      if (!strcmp(v, "f32")) c.diloco.codec = DISTRO_OUTER_F32;
      else if (!strcmp(v, "bf16")) c.diloco.codec = DISTRO_OUTER_BF16;
      else if (!strcmp(v, "int8")) c.diloco.codec = DISTRO_OUTER_INT8;
      else if (!strcmp(v, "int4")) c.diloco.codec = DISTRO_OUTER_INT4;
      else if (!strcmp(v, "fp4")) c.diloco.codec = DISTRO_OUTER_FP4;
      else return bad("--outer-codec: '%s' is not one of f32, bf16, int8, int4, fp4%s", v, "");
      ov.codec = diloco_flags = 1;
    } else if (!strcmp(a, "--outer-block")) {
      rc = parse_int(a, v, 1, &c.diloco.codec_block);
      diloco_flags = 1;
    } else if (!strcmp(a, "--merge")) {
      if (!strcmp(v, "mean")) c.diloco.merge = DISTRO_MERGE_MEAN;
      else if (!strcmp(v, "tokens")) c.diloco.merge = DISTRO_MERGE_TOKENS;
      else if (!strcmp(v, "radial")) c.diloco.merge = DISTRO_MERGE_RADIAL;
      else if (!strcmp(v, "radial-tokens")) c.diloco.merge = DISTRO_MERGE_RADIAL_TOKENS;
      else return bad("--merge: '%s' is not one of mean, tokens, radial, radial-tokens%s", v, "");
      diloco_flags = 1;
    } else if (!strcmp(a, "--density")) {
      rc = parse_float(a, v, 0, &c.diloco.density);
      if (!rc && !(c.diloco.density > 0 && c.diloco.density <= 1)) return bad("--density must be in (0, 1]%s%s", "", "");
      ov.density = sparse_flags = 1;
    } else if (!strcmp(a, "--sparse-chunk")) {
      rc = parse_int(a, v, 1, &c.diloco.sparse_chunk);
      if (!rc && c.diloco.sparse_chunk > 256) return bad("--sparse-chunk must be <= 256%s%s", "", "");
      sparse_flags = 1;
    } else if (!strcmp(a, "--dct")) {
      if (!strcmp(v, "on")) c.diloco.sparse_dct = 1;
      else if (!strcmp(v, "off")) c.diloco.sparse_dct = 0;
      else return bad("--dct: '%s' is not on or off%s", v, "");
      sparse_flags = 1;
    } else if (!strcmp(a, "--ef-beta")) {
      rc = parse_float(a, v, 0, &c.diloco.ef_beta);
      if (!rc && c.diloco.ef_beta >= 1) return bad("--ef-beta must be < 1%s%s", "", "");
      ov.ef_beta = sparse_flags = 1;
    } else if (!strcmp(a, "--sparse-values")) {
      if (!strcmp(v, "int2")) c.diloco.sparse_values = DISTRO_VALUES_INT2;
      else if (!strcmp(v, "int4")) c.diloco.sparse_values = DISTRO_VALUES_INT4;
      else if (!strcmp(v, "int8")) c.diloco.sparse_values = DISTRO_VALUES_INT8;
      else if (!strcmp(v, "bf16")) c.diloco.sparse_values = DISTRO_VALUES_BF16;
      else if (!strcmp(v, "f32")) c.diloco.sparse_values = DISTRO_VALUES_F32;
      else return bad("--sparse-values: '%s' is not one of int2, int4, int8, bf16, f32%s", v, "");
      ov.sparse_values = sparse_flags = 1;
    } else if (!strcmp(a, "--lr")) { rc = parse_float(a, v, 0, &c.lr); ov.lr = 1; }
    else if (!strcmp(a, "--lr-final")) rc = parse_float(a, v, 0, &c.lr_final);
    else if (!strcmp(a, "--warmup")) { rc = parse_int(a, v, 0, &c.warmup); ov.warmup = 1; }
    else if (!strcmp(a, "--clip")) rc = parse_float(a, v, 0, &c.clip);
    else if (!strcmp(a, "--wd")) { rc = parse_float(a, v, 0, &c.wd); ov.wd = 1; }
    else if (!strcmp(a, "--beta1")) rc = parse_float(a, v, 0, &c.beta1);
    else if (!strcmp(a, "--beta2")) rc = parse_float(a, v, 0, &c.beta2);
    else if (!strcmp(a, "--topk")) { rc = parse_int(a, v, 1, &c.topk); ov.topk = 1; }
    else if (!strcmp(a, "--chunk")) { rc = parse_int(a, v, 1, &c.chunk); ov.chunk = 1; }
    else if (!strcmp(a, "--decay")) { rc = parse_float(a, v, 0, &c.decay); ov.decay = 1; }
    else if (!strcmp(a, "--values")) {
      if (!strcmp(v, "f32")) c.values = DISTRO_VALUES_F32;
      else if (!strcmp(v, "bf16")) c.values = DISTRO_VALUES_BF16;
      else if (!strcmp(v, "sign1")) c.values = DISTRO_VALUES_SIGN1;
      else if (!strcmp(v, "int8")) c.values = DISTRO_VALUES_INT8;
      else if (!strcmp(v, "int4")) c.values = DISTRO_VALUES_INT4;
      else return bad("--values: '%s' is not one of f32, bf16, sign1, int8, int4%s", v, "");
      ov.values = 1;
    } else if (!strcmp(a, "--steps")) rc = parse_int(a, v, 1, &c.steps);
    else if (!strcmp(a, "--batch")) rc = parse_int(a, v, 1, &c.batch);
    else if (!strcmp(a, "--sampling")) {
      if (!strcmp(v, "global")) c.sampling = GPT_SAMPLE_GLOBAL;
      else if (!strcmp(v, "shard")) c.sampling = GPT_SAMPLE_SHARD;
      else return bad("--sampling: '%s' is not one of global, shard%s", v, "");
    }
    else if (!strcmp(a, "--seed")) {
      char *end;
      errno = 0;
      unsigned long long s = strtoull(v, &end, 10);
      if (errno || end == v || *end || *v == '-') return bad("--seed: '%s' is not a non-negative integer%s", v, "");
      c.seed = s;
    } else if (!strcmp(a, "--ranks")) { rc = parse_int(a, v, 1, &c.ranks); ranks_given = 1; }
    else if (!strcmp(a, "--threads")) rc = parse_int(a, v, 1, &c.threads);
    else if (!strcmp(a, "--comm-timeout")) {
      float f = 0;
      rc = parse_float(a, v, 0, &f);
      if (!rc && f > 1e6f) return bad("--comm-timeout must be at most 1e6 seconds (got '%s')%s", v, "");
      c.comm_timeout = f;
    }
    else if (!strcmp(a, "--eval-every")) rc = parse_int(a, v, 0, &c.eval_every);
    else if (!strcmp(a, "--eval-batches")) rc = parse_int(a, v, 1, &c.eval_batches);
    else if (!strcmp(a, "--print-every")) rc = parse_int(a, v, 1, &c.print_every);
    else if (!strcmp(a, "--log")) c.log_path = v;
    else if (!strcmp(a, "--tensor-log")) c.tensor_log_path = v;
    else if (!strcmp(a, "--tensor-every")) rc = parse_int(a, v, 1, &c.tensor_every);
    else if (!strcmp(a, "--save")) c.save_path = v;
    else if (!strcmp(a, "--save-every")) rc = parse_int(a, v, 1, &c.save_every);
    else if (!strcmp(a, "--resume")) c.resume_path = v;
    else if (!strcmp(a, "--stop-after")) rc = parse_int(a, v, 1, &c.stop_after);
    else if (!strcmp(a, "--plot")) plot_path = v;
    else if (!strcmp(a, "--tsv")) tsv_path = v;
    else if (!strcmp(a, "--syncer")) { c.syncer = v; decoupled_flags = 1; }
    else if (!strcmp(a, "--serve-endpoint")) { c.serve_endpoint = v; decoupled_flags = 1; }
    else if (!strcmp(a, "--curve-server-key")) { c.curve_server_key = v; decoupled_flags = 1; }
    else if (!strcmp(a, "--curve-keypair")) { c.curve_keypair = v; decoupled_flags = 1; }
    else if (!strcmp(a, "--sync-timeout")) {
      float f = 0;
      rc = parse_float(a, v, 0, &f);
      if (!rc && !(f > 0.2f && f <= 3600))
        return bad("--sync-timeout must be a number of seconds in (0.2, 3600] (got '%s')%s", v, "");
      c.sync_timeout = f;
      decoupled_flags = 1;
    }
    else if (!strcmp(a, "--learner-id")) {
      rc = parse_int(a, v, 0, &c.learner_id);
      if (!rc && c.learner_id > 255) return bad("--learner-id must be <= 255%s%s", "", "");
      decoupled_flags = id_given = 1;
    } else if (!strcmp(a, "--step-delay-ms")) {
      float f = 0;
      rc = parse_float(a, v, 0, &f);
      c.step_delay_ms = f;
      decoupled_flags = 1;
    } else if (!strcmp(a, "--time-limit")) {
      float f = 0;
      rc = parse_float(a, v, 0, &f);
      c.time_limit = f;
      decoupled_flags = 1;
    } else if (!strcmp(a, "--start-step")) { rc = parse_int(a, v, 0, &c.start_step); decoupled_flags = 1; }
    (void)tmp;
    if (rc) return rc;
  }

  /* Combinations. */
  const char *why = gpt_config_problem(&c.model);
  if (*why) return bad("model: %s%s", why, "");
  if (c.decay >= 1) return bad("--decay must be < 1%s%s", "", "");
  if (c.beta1 >= 1 || c.beta2 >= 1) return bad("--beta1 and --beta2 must be < 1%s%s", "", "");
  if (c.ranks > 256) return bad("--ranks must be <= 256%s%s", "", "");
  if (plot_path && !compare) return bad("--plot needs --compare%s%s", "", "");
  if (tsv_path && !compare) return bad("--tsv needs --compare%s%s", "", "");
  if (compare && (c.save_path || c.resume_path || c.stop_after || c.tensor_log_path))
    return bad("--compare does not take --save, --resume, --stop-after or --tensor-log%s%s", "", "");
  if (c.stop_after && !c.save_path)
    return bad("--stop-after needs --save (where to continue from)%s%s", "", "");
  if (decoupled_flags && (compare || c.optim != GPT_OPT_DECOUPLED))
    return bad("--syncer, --learner-id, --serve-endpoint, --curve-*, --insecure, --sync-timeout, --step-delay-ms, --time-limit and "
               "--start-step are "
               "Decoupled DiLoCo settings: add --optim decoupled%s%s", "", "");
  if (inner_given && !compare && c.optim != GPT_OPT_DILOCO && c.optim != GPT_OPT_DECOUPLED)
    return bad("--inner is a DiLoCo setting: add --optim diloco or --optim decoupled%s%s", "", "");
  if (c.optim == GPT_OPT_DECOUPLED) {
    if (compare) return bad("--compare does not take --optim decoupled (run the launcher in "
                            "python-free-examples/decoupled/)%s%s", "", "");
    if (!c.syncer || !id_given)
      return bad("--optim decoupled needs --syncer ENDPOINT and --learner-id N%s%s", "", "");
    if (diloco_flags)
      return bad("--learners, --ranks-per-learner, --H, --fragments, --overlap, --alpha, --outer-*, --merge and "
                 "--progress-thread are not gpt-train settings with --optim decoupled: the syncer holds them "
                 "(distro-syncer --fragments, --H, --overlap, --codec, --merge, --outer-lr, ...)%s%s", "", "");
    if (c.save_path || c.resume_path)
      return bad("--save and --resume do not support --optim decoupled: the global copy and outer state live in "
                 "the syncer (distro-syncer --checkpoint); a restarted learner rejoins from a peer (use "
                 "--start-step)%s%s", "", "");
    if (c.start_step >= c.steps) return bad("--start-step must be < --steps%s%s", "", "");
#ifndef DISTRO_WITH_SYNC
    return bad("--optim decoupled: this build has no syncer (libzmq was not found when the library was "
               "built)%s%s", "", "");
#endif
  }
  if (!compare) {
    if (c.optim == GPT_OPT_DECOUPLED) {
      /* The inner optimizer's tuned settings. */
      apply_variant(&c, tuned_variant(c.inner), &ov);
      c.optim = GPT_OPT_DECOUPLED;
    } else {
      apply_variant(&c, sparseloco ? named_variant("sparseloco") : tuned_variant(c.optim), &ov);
    }
  }
  if (sparse_flags && !compare && !sparseloco)
    return bad("--density, --sparse-chunk, --dct, --ef-beta and --sparse-values are SparseLoCo settings: add --optim "
               "sparseloco%s%s", "", "");
  if (c.warmup > c.steps) return bad("--warmup must be <= --steps%s%s", "", "");
  if (c.overlap_step && (compare || (c.optim != GPT_OPT_DISTRO && c.optim != GPT_OPT_DISTRO_ADAMW)))
    return bad("--overlap-step, --overlap-stale and --overlap-backward are for --optim distro or distro-adamw (not "
               "adamw, DiLoCo, decoupled or --compare)%s%s", "", "");
  if (c.clip_each && (compare || c.optim == GPT_OPT_DILOCO || c.optim == GPT_OPT_DECOUPLED))
    return bad("--clip-per-tensor is for --optim adamw, distro or distro-adamw%s%s", "", "");
  if (c.optim == GPT_OPT_ADAMW && !compare && (ov.topk || ov.chunk || ov.decay || ov.values))
    return bad("--topk, --chunk, --decay and --values are DisTrO settings; --optim adamw takes none%s%s", "", "");
  if (diloco_flags && !compare && c.optim != GPT_OPT_DILOCO && c.optim != GPT_OPT_DECOUPLED)
    return bad("--inner, --learners, --ranks-per-learner, --H, --fragments, --overlap, --alpha, --outer-*, "
               "--merge and --progress-thread are DiLoCo settings: add --optim diloco%s%s", "", "");
  if (c.optim == GPT_OPT_DILOCO && !compare) {
    if ((long)c.learners * c.ranks_per_learner > 256)
      return bad("--learners x --ranks-per-learner must be <= 256%s%s", "", "");
    if (ranks_given && c.ranks != c.learners * c.ranks_per_learner)
      return bad("--ranks: with --optim diloco the run has --learners x --ranks-per-learner ranks; "
                 "leave --ranks out%s%s", "", "");
    c.ranks = c.learners * c.ranks_per_learner;
    if (c.save_path || c.resume_path)
      return bad("--save and --resume do not support --optim diloco: the learners' parameters differ between "
                 "syncs and the outer state is not in the checkpoint format%s%s", "", "");
  }

  distro_comm *comm = NULL;
  if (mpi) {
#ifdef DISTRO_WITH_MPI
    /* --overlap-step: the optimizer's helper thread calls MPI while this
     * thread does (the loss all-reduce, validation), which needs
     * MPI_THREAD_MULTIPLE; otherwise one thread calls MPI. */
    const int want = c.overlap_step ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED;
    int provided = MPI_THREAD_SINGLE;
    MPI_Init_thread(&argc, &argv, want, &provided);
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    if (c.overlap_step && provided < want) {
      if (world_rank == 0)
        fprintf(stderr, "gpt: --overlap-step needs MPI_THREAD_MULTIPLE; this MPI provides thread level %d\n",
                provided);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    /* The ranks sharing this node split its cores (--threads default). */
    MPI_Comm node;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
      MPI_Comm_size(node, &c.node_ranks);
      MPI_Comm_free(&node);
    }
    distro_status s = distro_comm_mpi(MPI_COMM_WORLD, &comm);
    if (s != DISTRO_OK) {
      fprintf(stderr, "gpt: distro_comm_mpi: %s: %s\n", distro_status_string(s), distro_last_error());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
#else
    fprintf(stderr, "gpt: --mpi: this build has no MPI (the distro library was built without it)\n");
    return 2;
#endif
  }
  const int lead = !comm || distro_comm_rank(comm) == 0;

  gpt_corpus data;
  char err[1024];
  int rc = 0;
  if (corpus_load(&data, c.data, err, sizeof err) != 0) {
    if (lead) fprintf(stderr, "gpt: %s\n", err);
    rc = 1;
  } else {
    if (lead && !c.quiet) {
      const int world = comm ? distro_comm_size(comm) : c.ranks;
      printf("data: %s, %zu bytes (%zu train, %zu validation)\n", data.source, data.n, data.ntrain,
             data.n - data.ntrain);
      printf("model: %d layers, dim %d, %d heads, context %d, %s head; %d %s rank(s), batch %d per rank, "
             "%s sampling\n",
             c.model.layers, c.model.dim, c.model.heads, c.model.context, c.model.tied ? "tied" : "untied", world,
             comm ? "MPI" : "in-process", c.batch, c.sampling == GPT_SAMPLE_SHARD ? "shard" : "global");
      printf("matrix products: OpenBLAS, %s kernels\n", gpt_blas_core());
      fflush(stdout);
    }
    if (compare) {
      rc = compare_run(&c, &ov, &data, comm, plot_path, tsv_path, compare == 2);
    } else {
      train_result res;
      if (lead && !c.quiet) {
        printf("optimizer: %s, lr %g", sparseloco ? "sparseloco" : optim_name(c.optim), (double)c.lr);
        if (c.optim == GPT_OPT_DECOUPLED)
          printf(", learner %d of the syncer at %s, %d rank(s), inner %s%s", c.learner_id, c.syncer, c.ranks,
                 optim_name(c.inner), c.step_delay_ms > 0 ? ", slowed down" : "");
        char og[160];
        if (c.optim == GPT_OPT_DILOCO)
          printf(", %d learners x %d rank(s), inner %s, H %d, %d fragment(s), overlap %d, %s, "
                 "%s merge, outer lr %g, momentum %g",
                 c.learners, c.ranks_per_learner, optim_name(c.inner), c.diloco.H, c.diloco.fragments,
                 c.diloco.overlap, outer_gradients_desc(&c.diloco, og, sizeof og), merge_name(c.diloco.merge),
                 (double)c.diloco.outer_lr, (double)c.diloco.outer_momentum);
        if (step_optim_kind(&c) != GPT_OPT_ADAMW)
          printf(", topk %d, chunk %d, decay %g, %s values", c.topk, c.chunk, (double)c.decay, values_name(c.values));
        if (c.overlap_step)
          printf(", %s (exchange in the background)",
                 c.overlap_step == 3 ? "gradient-ready" : c.overlap_step == 2 ? "one-step-stale" : "look-ahead overlap");
        if (c.clip_each) printf(", each tensor clipped by its own norm");
        printf("\n");
        fflush(stdout);
      }
      rc = train_run(&c, &data, comm, stdout, &res) == 0 ? 0 : 1;
    }
    corpus_free(&data);
  }
  if (comm) {
#ifdef DISTRO_WITH_MPI
    /* A failed run may leave a peer stopped or a collective in flight (after
     * --comm-timeout): MPI_Finalize would wait for them, so end the job. */
    if (rc != 0) MPI_Abort(MPI_COMM_WORLD, rc);
#endif
    distro_comm_free(comm);
#ifdef DISTRO_WITH_MPI
    MPI_Finalize();
#endif
  }
  return rc;
}
