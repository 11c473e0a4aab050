/* The GPT trainer's refusals, end to end: bad flags, bad data and bad or
 * forged checkpoints each end the run with the exit status and message
 * that name the problem. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpt_cli.h"

TestSuite(gpt_errors, .init = setup, .fini = teardown);

Test(gpt_errors, bad_flags) {
  expect_error("--bogus", 2, "unknown option '--bogus'");
  expect_error("--steps", 2, "--steps needs a value");
  expect_error("--steps abc", 2, "--steps: 'abc' is not an integer");
  expect_error("--steps 0", 2, "--steps must be >= 1");
  expect_error("--lr fast", 2, "--lr: 'fast' is not a number");
  expect_error("--optim sgd", 2, "--optim: 'sgd' is not one of adamw, distro, distro-adamw");
  expect_error("--values f8", 2, "--values: 'f8' is not one of f32, bf16, sign1, int8, int4");
  expect_error("--sampling random", 2, "--sampling: 'random' is not one of global, shard");
  expect_error("--dim 30 --heads 4", 2, "dim must be a multiple of heads");
  expect_error("--decay 1", 2, "--decay must be < 1");
  expect_error("--plot x.png", 2, "--plot needs --compare");
  expect_error("--stop-after 5", 2, "--stop-after needs --save");
  expect_error("--optim adamw --topk 4", 2, "DisTrO settings");
  expect_error("--seed -1", 2, "--seed: '-1' is not a non-negative integer");
  expect_error("--comm-timeout -1", 2, "--comm-timeout must be >= 0");
  expect_error("--comm-timeout 2e6", 2, "--comm-timeout must be at most 1e6 seconds");
  expect_error("--H 10", 2, "are DiLoCo settings: add --optim diloco");
  expect_error("--optim diloco --ranks 3", 2, "--learners x --ranks-per-learner ranks");
  expect_error("--optim diloco --outer-codec int3", 2, "--outer-codec: 'int3' is not one of f32, bf16, int8, int4, fp4");
  expect_error("--optim diloco --merge median", 2, "--merge: 'median' is not one of mean, tokens, radial");
  expect_error("--optim diloco --inner sgd", 2, "--inner: 'sgd' is not one of adamw, distro, distro-adamw");
  expect_error("--optim diloco --save x.bin", 2, "--save and --resume do not support --optim diloco");
  /* SparseLoCo */
  expect_error("--density 0.02", 2, "are SparseLoCo settings: add --optim sparseloco");
  expect_error("--optim diloco --ef-beta 0.9", 2, "are SparseLoCo settings: add --optim sparseloco");
  expect_error("--optim sparseloco --density 0", 2, "--density must be in (0, 1]");
  expect_error("--optim sparseloco --density 1.5", 2, "--density must be in (0, 1]");
  expect_error("--optim sparseloco --ef-beta 1", 2, "--ef-beta must be < 1");
  expect_error("--optim sparseloco --sparse-values sign1", 2, "--sparse-values: 'sign1' is not one of int2, int4");
  expect_error("--optim sparseloco --dct maybe", 2, "--dct: 'maybe' is not on or off");
  expect_error("--optim sparseloco --sparse-chunk 300", 2, "--sparse-chunk must be <= 256");
  expect_error("--optim sparseloco --save x.bin", 2, "--save and --resume do not support --optim diloco");
  /* Decoupled DiLoCo */
  expect_error("--syncer ipc:///tmp/x.ipc", 2, "are Decoupled DiLoCo settings: add --optim decoupled");
  expect_error("--optim adamw --step-delay-ms 5", 2, "are Decoupled DiLoCo settings: add --optim decoupled");
  expect_error("--optim distro --serve-endpoint tcp://10.0.0.1:*", 2, "are Decoupled DiLoCo settings: add --optim decoupled");
  expect_error("--optim adamw --insecure", 2, "are Decoupled DiLoCo settings: add --optim decoupled");
  expect_error("--optim decoupled --syncer ipc:///tmp/x.ipc --learner-id 0 --sync-timeout 0.1", 2,
               "--sync-timeout must be a number of seconds in (0.2, 3600]");
#ifdef SYNC_SYNCER_BIN
  /* A routable serve endpoint without CURVE or --insecure is refused by the library, naming the choice. */
  expect_error("--optim decoupled --syncer ipc:///nonexistent/x.ipc --learner-id 0 --serve-endpoint tcp://10.0.0.1:* "
               "--layers 1 --dim 32 --heads 2 --context 32 --ranks 1 --steps 2",
               1, "or set insecure");
  /* The serve endpoint reaches the library (checked when the learner is created; no syncer needed). */
  expect_error("--optim decoupled --syncer ipc:///nonexistent/x.ipc --learner-id 0 --serve-endpoint bogus://x "
               "--layers 1 --dim 32 --heads 2 --context 32 --ranks 1 --steps 2",
               1, "serve endpoint: endpoint 'bogus://x'");
#endif
  expect_error("--optim decoupled --syncer ipc:///tmp/x.ipc", 2, "--optim decoupled needs --syncer ENDPOINT and --learner-id N");
  expect_error("--optim decoupled --learner-id 1", 2, "--optim decoupled needs --syncer ENDPOINT and --learner-id N");
  expect_error("--optim decoupled --syncer ipc:///tmp/x.ipc --learner-id 256", 2, "--learner-id must be <= 255");
  expect_error("--optim decoupled --syncer ipc:///tmp/x.ipc --learner-id -1", 2, "--learner-id must be >= 0");
  expect_error("--optim decoupled --syncer ipc:///tmp/x.ipc --learner-id 1 --H 5", 2, "the syncer holds them");
  expect_error("--optim decoupled --syncer ipc:///tmp/x.ipc --learner-id 1 --save x.bin", 2,
               "--save and --resume do not support --optim decoupled");
  expect_error("--optim decoupled --syncer ipc:///tmp/x.ipc --learner-id 1 --steps 10 --start-step 10", 2,
               "--start-step must be < --steps");
  expect_error("--compare --optim decoupled", 2, "--compare does not take --optim decoupled");
  expect_error("--optim adamw --inner distro", 2, "--inner is a DiLoCo setting");
  expect_error("--optim decoupled --inner sgd", 2, "--inner: 'sgd' is not one of adamw, distro, distro-adamw");
  expect_error("--optim adamw --overlap-step", 2, "--overlap-backward are for --optim distro or distro-adamw");
  expect_error("--optim diloco --overlap-step", 2, "--overlap-backward are for --optim distro or distro-adamw");
  expect_error("--compare --overlap-step", 2, "--overlap-backward are for --optim distro or distro-adamw");
  char *out;
  char cmd[600];
  snprintf(cmd, sizeof cmd, "'%s' --help", GPT_TRAIN);
  cr_assert_eq(run(cmd, &out), 0);
  cr_assert(strstr(out, "usage: gpt-train") && strstr(out, "--compare"));
  free(out);
}

Test(gpt_errors, bad_data) {
  char args[2048], path[400];
  snprintf(args, sizeof args, "--data '%s/missing.txt'", dir);
  expect_error(args, 1, "cannot open data file");
  snprintf(path, sizeof path, "%s/empty.txt", dir);
  fclose(fopen(path, "w"));
  snprintf(args, sizeof args, "--data '%s'", path);
  expect_error(args, 1, "is empty");
  snprintf(path, sizeof path, "%s/short.txt", dir);
  write_corpus(path, 500);
  snprintf(args, sizeof args, "--data '%s' --context 32", path);
  expect_error(args, 1, "is too short: ");
  snprintf(args, sizeof args, "--data '%s'", dir);
  expect_error(args, 1, "is not a regular file");
  /* 2800 bytes, context 128: the training split holds a window, 21 shards of it do not. */
  snprintf(path, sizeof path, "%s/small.txt", dir);
  write_corpus(path, 2800);
  snprintf(args, sizeof args, "--data '%s' --layers 1 --dim 32 --heads 2 --context 128 --batch 1 --threads 1 "
           "--ranks 21 --optim adamw --steps 1 --eval-every 0 --sampling shard", path);
  expect_error(args, 1, "each rank's training shard needs a window");
  char cmd[4096], *out;
  snprintf(cmd, sizeof cmd, "'%s' %s", GPT_TRAIN, args);
  *strstr(cmd, "--sampling shard") = 0;
  strcat(cmd, "--sampling global");
  int rc = run(cmd, &out);
  cr_expect_eq(rc, 0, "global sampling on a text that holds one window refused (exit %d):\n%s", rc, out);
  free(out);
}

Test(gpt_errors, bad_checkpoints) {
  char args[2048], ck[400];
  snprintf(ck, sizeof ck, "%s/ck.bin", dir);
  snprintf(args, sizeof args, "--optim distro --steps 4 --save '%s'", ck);
  free(train(args));
  /* Another model, another optimizer, another rank count, a damaged file, none. */
  snprintf(args, sizeof args, "--data '%s' " TINY " --optim distro --steps 8 --dim 64 --resume '%s'", corpus, ck);
  expect_error(args, 1, "was written with dim 32; this run has 64");
  snprintf(args, sizeof args, "--data '%s' " TINY " --optim adamw --steps 8 --resume '%s'", corpus, ck);
  expect_error(args, 1, "was written with optimizer distro; this run has adamw");
  snprintf(args, sizeof args, "--data '%s' " TINY " --optim distro --steps 8 --ranks 3 --resume '%s'", corpus, ck);
  expect_error(args, 1, "was written with ranks 2; this run has 3");
  snprintf(args, sizeof args, "--data '%s' " TINY " --optim distro --steps 2 --resume '%s'", corpus, ck);
  expect_error(args, 1, "beyond --steps 2");
  FILE *f = fopen(ck, "r+b");
  cr_assert(f);
  fseek(f, 100, SEEK_SET);
  fputc(0x5a, f);
  fclose(f);
  snprintf(args, sizeof args, "--data '%s' " TINY " --optim distro --steps 8 --resume '%s'", corpus, ck);
  expect_error(args, 1, "is corrupt (checksum mismatch)");
  snprintf(args, sizeof args, "--data '%s' " TINY " --optim distro --steps 8 --resume '%s/none.bin'", corpus, dir);
  expect_error(args, 1, "cannot read checkpoint");
  /* Version 2 files put the trainer's own clip shares before each rank's
   * optimizer state: with none (k = 0) the file resumes; with shares it is
   * refused, as this trainer keeps them in the optimizer's state. */
  snprintf(args, sizeof args, "--optim distro --clip-per-tensor --steps 4 --save '%s'", ck);
  free(train(args));
  for (uint32_t k = 0; k < 2; k++) {
    f = fopen(ck, "rb");
    cr_assert(f);
    fseek(f, 0, SEEK_END);
    const long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *in = malloc((size_t)size), *buf = malloc((size_t)size + 8 * (4 + 8));
    cr_assert(in && buf && fread(in, 1, (size_t)size, f) == (size_t)size);
    fclose(f);
    uint64_t np, h = 0xcbf29ce484222325ULL;
    memcpy(&np, in + 60, 8);
    const uint32_t v2 = 2;
    const double share = 1.0;
    long at = 68 + 4 * (long)np, out = at; /* then per rank: rng, length, its optimizer state */
    memcpy(buf, in, (size_t)at);
    memcpy(buf + 8, &v2, 4);
    while (at < size - 8) {
      uint64_t len;
      memcpy(&len, in + at + 8, 8);
      const uint64_t len2 = len + 4 + 8 * k;
      memcpy(buf + out, in + at, 8);
      memcpy(buf + out + 8, &len2, 8);
      memcpy(buf + out + 16, &k, 4);
      if (k) memcpy(buf + out + 20, &share, 8);
      memcpy(buf + out + 20 + 8 * k, in + at + 16, (size_t)len);
      at += 16 + (long)len;
      out += 16 + (long)len2;
    }
    for (long i = 0; i < out; i++) h = (h ^ buf[i]) * 0x100000001b3ULL;
    memcpy(buf + out, &h, 8);
    const long size2 = out + 8;
    free(in);
    char old[400];
    snprintf(old, sizeof old, "%s/v2-k%u.bin", dir, k);
    f = fopen(old, "wb");
    cr_assert(f && fwrite(buf, 1, (size_t)size2, f) == (size_t)size2);
    fclose(f);
    free(buf);
    if (k) {
      snprintf(args, sizeof args, "--data '%s' " TINY " --optim distro --clip-per-tensor --steps 6 --resume '%s'",
               corpus, old);
      expect_error(args, 1, "keeps --clip-per-tensor's shares outside the optimizer's state");
    } else {
      snprintf(args, sizeof args, "--optim distro --clip-per-tensor --steps 6 --resume '%s'", old);
      free(train(args));
    }
  }
}
