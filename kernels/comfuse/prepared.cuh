// What the C entry points of every kernel library share (abi_entry.cuh, b2b_unit.cuh): the reason of a refusal, and
// kernel parameters prepared once per argument set. Encoding TMA descriptors costs host time, and every layer of a model shares one library (one kernel
// per structure), so a single cached slot would be re-encoded on every call. kSlots sets (the layers' weights and
// buffers, which PyTorch's allocator hands out again call after call; BERT-base's QKV projections alone are 36 sets
// of one library), replaced round robin. A slot is found by its hash first (a scan of kSlots integers), then
// compared in full; the last hit is tried first. Args must be zero-initialised, padding included: it is hashed and
// compared as bytes.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace comfuse::abi {

// An entry point's failure: `msg` into the caller's buffer (NUL-terminated, truncated to len), `code` returned
// (abi.h: 1 arguments the kernel cannot run, 2 a CUDA error).
inline int fail(char* why, int len, char const* msg, int code) {
  if (why && len > 0) std::snprintf(why, size_t(len), "%s", msg);
  return code;
}

template <class Args, class Params, int kSlots = 256>
class PreparedParams {
 public:
  // The parameters for `a`: a cached slot, or make(a) stored in the next slot. `check(a)` runs first on a miss and,
  // when it returns nonzero, that code is returned and nothing is stored. `use(params)` runs under the lock (the
  // slot may be replaced as soon as it is released) and its result is returned.
  template <class Check, class Make, class Use>
  int with(Args const& a, Check&& check, Make&& make, Use&& use) {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t h = hash(a);
    auto hit = [&](int i) { return hash_[i] == h && std::memcmp(&slots_[i].args, &a, sizeof a) == 0; };
    int at = hit(last_) ? last_ : -1;
    for (int i = 0; at < 0 && i < kSlots; ++i)
      if (hit(i)) at = i;
    if (at < 0) {
      if (int c = check(a)) return c;
      at = next_;
      next_ = (next_ + 1) % kSlots;
      hash_[at] = 0;
      slots_[at].params = make(a);
      slots_[at].args = a;
      hash_[at] = h;
    }
    last_ = at;
    return use(slots_[at].params);
  }

 private:
  // FNV-1a over 8-byte words (a byte at a time, the multiply chain of a ~300-byte Args cost ~0.5 us a launch).
  static uint64_t hash(Args const& a) {
    static_assert(sizeof(Args) % 8 == 0, "Args is hashed as 8-byte words");
    uint64_t h = 1469598103934665603ull;
    auto const* p = reinterpret_cast<unsigned char const*>(&a);
    for (size_t i = 0; i < sizeof a; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      h = (h ^ w) * 1099511628211ull;
    }
    return (h ^ (h >> 29)) | 1;   // never 0 (the empty mark)
  }
  struct Slot {
    Args args{};
    Params params;
  };
  std::mutex mu_;
  uint64_t hash_[kSlots] = {};   // 0: empty
  Slot slots_[kSlots];
  int last_ = 0, next_ = 0;
};

}  // namespace comfuse::abi
