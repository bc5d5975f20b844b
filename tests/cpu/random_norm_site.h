// A random norm site read by GEMMs (the shape `--defer-norms on` rewrites), as .cf text: h = X W0 + R rounded to
// bf16, then a LayerNorm or RMSNorm of h (gamma and beta each present or not), read by one or two GEMMs (W1 in
// either layout, with a bias that is constant, not constant or absent; a second GEMM with a ReLU), and sometimes by an
// elementwise reader too (y + R, which keeps y). The CPU rewrite tests evaluate it in the interpreters; the generator
// comfuse_random_graphs --norm-sites writes it at GPU sizes for `comfuse run --check --defer-norms on`.
#pragma once

#include <cstdint>
#include <random>
#include <string>

namespace comfuse::test {

struct RandomNormSite {
  std::string text;
  int M = 0, K = 0, N = 0;
  bool ln = false, two = false, extra = false;
};

// M rows, K the normalized width, N the readers' width.
inline RandomNormSite random_norm_site(std::mt19937& rng, int M, int K, int N) {
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  RandomNormSite s;
  s.M = M, s.K = K, s.N = N;
  const bool ln = pick(2), has_g = pick(2), has_b = ln && pick(2), two = pick(2), nk = pick(2), extra = pick(2);
  const int bias = pick(3);   // none, constant, not constant
  const std::string m = std::to_string(M), k = std::to_string(K), n = std::to_string(N);
  std::string t = "input X : bf16[" + m + ", " + k + "]\n" + "input W0 : bf16[" + k + ", " + k + "]\n" +
                  "input R : bf16[" + m + ", " + k + "]\n" + "input gamma : bf16[" + k + "] const\ninput beta : bf16[" +
                  k + "] const\n" + "input W1 : bf16[" + (nk ? n + ", " + k : k + ", " + n) + "] const\n" +
                  "input W2 : bf16[" + n + ", " + k + "] const\n" +
                  (bias ? "input c1 : bf16[" + n + "]" + (bias == 1 ? " const\n" : "\n") : "") +
                  "h = cast(add(matmul(X, W0), R), dtype=bf16)\n";
  t += ln ? std::string("y = layer_norm(h") + (has_g ? ", gamma" : "") + (has_b ? ", beta" : "") + ", eps=1e-5)\n"
          : std::string("y = rms_norm(h") + (has_g ? ", gamma" : "") + ", eps=1e-6)\n";
  t += std::string("z1 = ") + (bias ? "add(" : "") + "matmul(y, W1" + (nk ? ", transpose_b=true" : "") + ")" +
       (bias ? ", c1)" : "") + "\n";
  std::string outs = "z1";
  if (two) {
    t += "z2 = relu(matmul(y, W2, transpose_b=true))\n";
    outs += ", z2";
  }
  if (extra) {
    t += "e = add(y, R)\n";
    outs += ", e";
  }
  s.text = t + "output " + outs + "\n";
  s.ln = ln, s.two = two, s.extra = extra;
  return s;
}

}  // namespace comfuse::test
