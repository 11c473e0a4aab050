/* Internal: the fixed order of DisTrO-AdamW's float64 sums (the RMS of the
 * AdamW step), shared by the CPU (optim/demo.c) and the GPU
 * (cuda/update.cu) so both give the same bits for any thread count:
 * blocks of DISTRO__SUM_BLOCK elements, each summed as 256 lanes (lane l
 * takes elements l, l + 256, ... in turn) folded pairwise (lane l += lane
 * l + w for w = 128, 64, ..., 1), then the blocks in order. */
#ifndef DISTRO_COMMON_BLOCKSUM_H
#define DISTRO_COMMON_BLOCKSUM_H

#define DISTRO__SUM_BLOCK 4096
#define DISTRO__SUM_LANES 256

#endif
