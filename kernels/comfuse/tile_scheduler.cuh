// Persistent tile scheduler: row-block-major order, optionally grouped.
//
// Tiles are numbered t = m * tiles_n + n (m: row block, n: column block), so the C = tiles_n tiles of
// one row block have consecutive numbers. CTA (cluster) i of a grid of G takes i, i + G, i + 2G, ...;
// in PingPong its two consumer warp groups take alternate ones (group 0: i, i + 2G, ...; group 1:
// i + G, i + 3G, ...), and their mainloops run in that same order (OrderedSequenceBarrier); their epilogues
// too, unless the kernel reduces rows (gemm.cuh: order_epilogues).
//
// With clusters of CM x CN CTAs the unit is a cluster tile (CM row blocks x CN column blocks); the
// same order applies to cluster tiles, and each CTA of the cluster takes its (rx, ry) tile in it.
// tiles_m / tiles_n are rounded up to cluster multiples: a CTA whose tile lies past M or N still
// runs the mainloop (TMA zero-fills, keeping the cluster's multicast pipeline in step) and stores
// nothing.
//
// Why this order (the next issue's cross-CTA row reductions rely on it): the CTAs that hold the
// tiles of one row block must all be running at the same time, or an exchange among them waits
// forever. With G resident CTAs taking tiles in increasing order, consider the lowest row block r
// that is not finished. Every tile numbered below r's first tile belongs to an earlier row block,
// which is finished. A CTA holding a tile of r has therefore finished every earlier tile it took
// (its tiles come in increasing order), so it is at r's tile, or will reach it without waiting on
// anything but r. If G >= C, the tiles of r are at most C consecutive numbers and land on distinct
// CTAs, all resident: r completes. By induction every row block completes. PingPong holds two tiles
// per CTA (one per consumer group), t and t + G. The group with r's tile t reaches t's epilogue once
// its mainloop has had its turn, which needs only the other group's mainloop of t - G (an earlier tile;
// that group finished its epilogues before t - G, all of earlier row blocks, complete by induction).
// It never waits for the other group's epilogue: ordered epilogues add that wait, for the epilogue of
// t - G (earlier, completes), and unordered ones drop it, so the argument holds either way; a wait of
// the group with t + G on a row block r' > r holds back neither t's epilogue nor its peers. The cooperative
// schedule holds one tile per CTA at a time, its two groups exchanging for the two 64-row halves of the
// row block with the same groups of the same C CTAs: a CTA at r's tile has both groups free for r's
// mainloop (they finished every earlier tile), so both halves complete and the argument holds as stated.
//
// Grouped order (group_m > 1; kernels without cross-CTA reductions only): the row blocks are taken in
// bands of group_m, and inside a band column by column, so a wave of G CTAs covers about
// G / group_m column blocks instead of all of them. At large N the B columns a wave reads then stay
// in L2 for the band's other row blocks (the A rows of a band are few and stay there anyway).
// group_m = 1 is exactly the row-block-major order above, which the reductions need.
#pragma once
#include "cute/config.hpp"

namespace comfuse {

template <int ClusterM, int ClusterN>
struct RowBlockScheduler {
  int cl_tiles_n;   // column blocks of cluster tiles
  int total;        // cluster tiles in the problem
  int first;        // this cluster's first cluster tile (its index in the grid)
  int stride;       // number of clusters in the grid
  int group_m = 1;  // row blocks (of cluster tiles) per band of the grouped order; 1: row-block-major

  // tiles_m, tiles_n: tile counts already rounded up to multiples of the cluster shape.
  CUTE_HOST_DEVICE static int num_cluster_tiles(int tiles_m, int tiles_n) {
    return (tiles_m / ClusterM) * (tiles_n / ClusterN);
  }

  struct Tile {
    int m, n;   // row block, column block
  };
  // Cluster tile u -> this CTA's tile; (rx, ry) is the CTA's position inside its cluster.
  CUTE_DEVICE Tile tile(int u, int rx, int ry) const {
    int cm, cn;
    if (group_m <= 1) {
      cm = u / cl_tiles_n;
      cn = u - cm * cl_tiles_n;
    } else {
      const int band_tiles = group_m * cl_tiles_n;
      const int band = u / band_tiles, in_band = u - band * band_tiles;
      const int first_m = band * group_m;
      const int cl_tiles_m = total / cl_tiles_n;
      const int rows = min(group_m, cl_tiles_m - first_m);   // the last band may be shorter
      cn = in_band / rows;
      cm = first_m + (in_band - cn * rows);
    }
    return {cm * ClusterM + rx, cn * ClusterN + ry};
  }
};

}  // namespace comfuse
