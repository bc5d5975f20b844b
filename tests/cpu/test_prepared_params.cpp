// The launch-parameter cache of the kernel libraries (kernels/comfuse/prepared.cuh): host C++ only, so it is
// tested here. A call with an argument set seen before must reuse its parameters (no TMA re-encoding), any byte of
// difference must make new ones, a refused set must store nothing, and slots are replaced round robin.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "../../kernels/comfuse/prepared.cuh"

namespace {

struct Args {   // as ComfuseKernelArgs: pointers and sizes, zero-initialised padding included
  const void* a;
  const void* b;
  int64_t m;
  int32_t transport;
  int32_t pad;
};

struct Params {
  int64_t m = -1;
  uintptr_t a = 0;
};

Args args(uintptr_t a, int64_t m) {
  Args x;
  std::memset(&x, 0, sizeof x);
  x.a = reinterpret_cast<const void*>(a);
  x.b = reinterpret_cast<const void*>(0x2000);
  x.m = m;
  return x;
}

// with(): the parameters used, how often make() ran, and the returned code.
template <class Cache>
int64_t use(Cache& cache, Args const& x, int* made, int check_code = 0) {
  int64_t used = -2;
  int rc = cache.with(
      x, [&](Args const&) { return check_code; },
      [&](Args const& y) {
        ++*made;
        return Params{y.m, reinterpret_cast<uintptr_t>(y.a)};
      },
      [&](Params const& p) {
        used = p.m;
        EXPECT_EQ(p.a, reinterpret_cast<uintptr_t>(x.a));
        return 0;
      });
  return rc != 0 ? -100 - rc : used;
}

}  // namespace

TEST(PreparedParams, ReusesASetAndMakesANewOneForAnyDifference) {
  comfuse::abi::PreparedParams<Args, Params, 4> cache;
  int made = 0;
  EXPECT_EQ(use(cache, args(0x1000, 8), &made), 8);
  EXPECT_EQ(use(cache, args(0x1000, 8), &made), 8);
  EXPECT_EQ(made, 1);   // the second call found the first one's parameters
  EXPECT_EQ(use(cache, args(0x1000, 9), &made), 9);
  EXPECT_EQ(use(cache, args(0x1010, 8), &made), 8);
  EXPECT_EQ(made, 3);
  // back to the first set: still cached (not the last one used)
  EXPECT_EQ(use(cache, args(0x1000, 8), &made), 8);
  EXPECT_EQ(made, 3);
  // a difference in the last word (hashed 8 bytes at a time) counts too
  Args x = args(0x1000, 8);
  x.transport = 1;
  EXPECT_EQ(use(cache, x, &made), 8);
  EXPECT_EQ(made, 4);
}

TEST(PreparedParams, ARefusedSetIsNotStored) {
  comfuse::abi::PreparedParams<Args, Params, 4> cache;
  int made = 0;
  EXPECT_EQ(use(cache, args(0x1000, 8), &made, /*check_code=*/1), -101);
  EXPECT_EQ(made, 0);
  EXPECT_EQ(use(cache, args(0x1000, 8), &made), 8);   // checked again, then made
  EXPECT_EQ(made, 1);
}

TEST(PreparedParams, SlotsAreReplacedRoundRobin) {
  comfuse::abi::PreparedParams<Args, Params, 4> cache;
  int made = 0;
  for (int i = 0; i < 4; ++i) use(cache, args(0x1000 + 16 * i, i), &made);
  EXPECT_EQ(made, 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(use(cache, args(0x1000 + 16 * i, i), &made), i);
  EXPECT_EQ(made, 4);   // all four held
  use(cache, args(0x9000, 99), &made);   // a fifth set takes the oldest slot (set 0)
  EXPECT_EQ(made, 5);
  EXPECT_EQ(use(cache, args(0x1000 + 16, 1), &made), 1);
  EXPECT_EQ(made, 5);
  EXPECT_EQ(use(cache, args(0x1000, 0), &made), 0);   // set 0 is made again
  EXPECT_EQ(made, 6);
}

TEST(PreparedParams, ThreadsGetTheirOwnSetsParameters) {
  comfuse::abi::PreparedParams<Args, Params, 4> cache;   // fewer slots than sets: constant replacement
  std::vector<std::thread> threads;
  std::vector<int> wrong(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      int made = 0;
      for (int i = 0; i < 2000; ++i) {
        const int64_t m = t * 10 + i % 3;
        if (use(cache, args(0x1000 + 16 * uintptr_t(m), m), &made) != m) ++wrong[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(wrong[t], 0) << "thread " << t;
}
