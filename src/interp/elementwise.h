// Elementwise math shared by the Graph and Spec interpreters, so both evaluate an op identically and their
// differences come only from where values are reduced.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <vector>

#include "comfuse/graph.h"

namespace comfuse::detail {

template <typename T>
T apply_unary(OpKind op, T x, double exponent, DType cast_to) {
  const T half = T(0.5), one = T(1);
  switch (op) {
    case OpKind::Neg: return -x;
    case OpKind::Abs: return std::abs(x);
    case OpKind::Exp: return std::exp(x);
    case OpKind::Log: return std::log(x);
    case OpKind::Sqrt: return std::sqrt(x);
    case OpKind::Rsqrt: return one / std::sqrt(x);
    case OpKind::Tanh: return std::tanh(x);
    case OpKind::Sigmoid: return one / (one + std::exp(-x));
    case OpKind::Relu: return x < T(0) ? T(0) : x;   // NaN propagates, as torch.relu and the kernels
    case OpKind::Gelu: return half * x * (one + std::erf(x * T(0.70710678118654752440)));
    case OpKind::GeluTanh: {
      const T k = T(0.79788456080286535588);  // sqrt(2/pi)
      return half * x * (one + std::tanh(k * (x + T(0.044715) * x * x * x)));
    }
    case OpKind::Silu: return x / (one + std::exp(-x));
    case OpKind::Square: return x * x;
    case OpKind::Reciprocal: return one / x;
    case OpKind::Cast: return static_cast<T>(round_to_dtype(static_cast<float>(x), cast_to));
    case OpKind::Pow: return std::pow(x, static_cast<T>(exponent));
    default: throw std::logic_error(std::string("apply_unary: not unary: ") + op_name(op));
  }
}

template <typename T>
T apply_binary(OpKind op, T a, T b) {
  switch (op) {
    case OpKind::Add: return a + b;
    case OpKind::Sub: return a - b;
    case OpKind::Mul: return a * b;
    case OpKind::Div: return a / b;
    case OpKind::Max: return std::isnan(a) || std::isnan(b) ? a + b : (a > b ? a : b);  // NaN propagates
    case OpKind::Min: return std::isnan(a) || std::isnan(b) ? a + b : (a < b ? a : b);
    default: throw std::logic_error(std::string("apply_binary: not binary: ") + op_name(op));
  }
}

// [rows, K] x B -> [rows, N]; B is [K, N], or [N, K] when transpose_b. Accumulates in T, k ascending.
template <typename T>
void gemm_rows(const T* a, const T* b, T* c, int64_t rows, int64_t k, int64_t n, bool transpose_b) {
  auto rows_of = [=](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      T* cr = c + r * n;
      for (int64_t j = 0; j < n; ++j) cr[j] = T(0);
      if (transpose_b) {
        for (int64_t j = 0; j < n; ++j) {
          T acc = T(0);
          for (int64_t q = 0; q < k; ++q) acc += a[r * k + q] * b[j * k + q];
          cr[j] = acc;
        }
      } else {
        for (int64_t q = 0; q < k; ++q) {
          T av = a[r * k + q];
          for (int64_t j = 0; j < n; ++j) cr[j] += av * b[q * n + j];
        }
      }
    }
  };
  // The rows are shared out over the machine's cores where the product is large (`run --check` of a real model's
  // sizes spent tens of seconds in this loop on one core). Each row is still summed by one thread in the same
  // order, so the result does not depend on the split.
  const double work = static_cast<double>(rows) * static_cast<double>(k) * static_cast<double>(n);
  const int64_t cores = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, 64);
  const int64_t threads = work < double(int64_t{1} << 24) ? 1 : std::min<int64_t>(rows, cores);
  if (threads <= 1) return rows_of(0, rows);
  std::vector<std::thread> pool;
  const int64_t per = (rows + threads - 1) / threads;
  int64_t first = 0;
  try {
    for (; first < rows; first += per) pool.emplace_back(rows_of, first, std::min(rows, first + per));
  } catch (const std::system_error&) {   // no thread to be had: the rest on this one
    rows_of(first, rows);
  }
  for (std::thread& t : pool) t.join();
}

}  // namespace comfuse::detail
