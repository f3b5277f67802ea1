// Fused CPU kernels for training the Transformer with TensorFlow (float32).
//
// Dropout (Srivastava et al., 2014) and the post-LN residual connection
// `LayerNorm(x + Dropout(y))` of every sub-layer (Vaswani et al., 2017,
// sections 3.1 and 5.4), each forward and backward in one pass over memory
// instead of a chain of TensorFlow element-wise ops. Built and loaded by
// `keras_transformer/kernels/__init__.py`; used in training only, so no
// SavedModel for serving refers to these ops.
//
// Random numbers: element i of a tensor (row-major) is kept when the 16-bit
// field i % 4 of mix64(key + i / 4) is at least `threshold`, with key drawn
// from the (2,) int64 seed. The same seed gives the same mask in KtDropout
// and KtResidualLayerNorm, and the backward kernels recompute it instead of
// storing it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace keras_transformer {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::errors::InvalidArgument;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

// SplitMix64's output function (Steele, Lea and Flood, 2014): a bijective
// mixer; over consecutive counters it is the SplitMix64 generator, which
// passes BigCrush.
inline uint64_t Mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

inline uint64_t SeedKey(const Tensor& seed) {
  const auto s = seed.flat<int64_t>();
  return Mix64(Mix64(static_cast<uint64_t>(s(0))) ^ static_cast<uint64_t>(s(1)));
}

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the 16-bit fields of a hash are read in little-endian order");

// keep[k] = `scale` or 0 for the elements i = begin + k, k < count.
// `hashes` is scratch space for at least count / 4 + 2 values.
inline void KeepFactors(uint64_t key, int64_t begin, int64_t count,
                        uint32_t threshold, float scale, float* keep,
                        uint64_t* hashes) {
  if (count <= 0) return;
  if (threshold == 0) {  // rate 0: every element kept
    std::fill(keep, keep + count, scale);
    return;
  }
  // The groups of 4 that [begin, begin + count) touches, hashed in one
  // loop, then read as 16-bit fields (field i % 4 of group i / 4 is
  // element i, the bits (i % 4) * 16 to (i % 4) * 16 + 15 of the hash);
  // both loops vectorize.
  const int64_t first = begin / 4, last = (begin + count - 1) / 4;
  for (int64_t g = 0; g <= last - first; ++g) {
    hashes[g] = Mix64(key + static_cast<uint64_t>(first + g));
  }
  uint16_t field[4 * 64];
  const int64_t skip = begin - 4 * first;
  for (int64_t k0 = 0; k0 < count; k0 += 4 * 64 - 4) {
    // Up to 252 elements at a time, through a small aligned buffer (no
    // pointer cast between integer types).
    const int64_t n = std::min<int64_t>(4 * 64 - 4, count - k0);
    const int64_t g0 = (skip + k0) / 4, offset = (skip + k0) % 4;
    std::memcpy(field, hashes + g0, sizeof(uint64_t) * ((offset + n + 3) / 4));
    for (int64_t k = 0; k < n; ++k) {
      keep[k0 + k] = scale * static_cast<float>(field[offset + k] >= threshold);
    }
  }
}

void ParallelRows(OpKernelContext* ctx, int64_t rows, int64_t cost_per_row,
                  const std::function<void(int64_t, int64_t)>& work) {
  ctx->device()->tensorflow_cpu_worker_threads()->workers->ParallelFor(
      rows, cost_per_row, work);
}

// Reads the attributes shared by every kernel here.
struct DropoutAttrs {
  explicit DropoutAttrs(OpKernelConstruction* ctx) {
    int t;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("threshold", &t));
    OP_REQUIRES(ctx, t >= 0 && t < 65536,
                InvalidArgument("threshold must be in [0, 65536), got ", t));
    threshold = static_cast<uint32_t>(t);
    OP_REQUIRES_OK(ctx, ctx->GetAttr("scale", &scale));
  }
  uint32_t threshold = 0;
  float scale = 1.f;
};

bool CheckSeed(OpKernelContext* ctx, const Tensor& seed) {
  if (seed.NumElements() == 2) return true;
  ctx->CtxFailure(InvalidArgument("seed must hold 2 int64 values, got shape ",
                                  seed.shape().DebugString()));
  return false;
}

REGISTER_OP("KtDropout")
    .Input("x: float")
    .Input("seed: int64")
    .Attr("threshold: int")
    .Attr("scale: float")
    .Output("y: float")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    })
    .Doc("y = x * keep, keep = scale or 0 per element (see the file header). "
         "Its own gradient: KtDropout of the upstream gradient, same seed.");

class DropoutOp : public OpKernel {
 public:
  explicit DropoutOp(OpKernelConstruction* ctx) : OpKernel(ctx), attrs_(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& seed = ctx->input(1);
    if (!CheckSeed(ctx, seed)) return;
    Tensor* y = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &y));
    const int64_t n = x.NumElements();
    const uint64_t key = SeedKey(seed);
    const float* px = x.flat<float>().data();
    float* py = y->flat<float>().data();
    const int64_t block = 4096;
    const uint32_t threshold = attrs_.threshold;
    const float scale = attrs_.scale;
    ParallelRows(ctx, (n + block - 1) / block, 8 * block, [&](int64_t b, int64_t e) {
      std::vector<float> keep(block);
      std::vector<uint64_t> hashes(block / 4 + 2);
      for (int64_t blk = b; blk < e; ++blk) {
        const int64_t begin = blk * block, count = std::min(block, n - begin);
        KeepFactors(key, begin, count, threshold, scale, keep.data(), hashes.data());
        for (int64_t k = 0; k < count; ++k) py[begin + k] = px[begin + k] * keep[k];
      }
    });
  }

 private:
  DropoutAttrs attrs_;
};

REGISTER_OP("KtResidualLayerNorm")
    .Input("x: float")
    .Input("y: float")
    .Input("seed: int64")
    .Input("gamma: float")
    .Input("beta: float")
    .Attr("threshold: int")
    .Attr("scale: float")
    .Attr("epsilon: float")
    .Output("out: float")
    .Output("x_hat: float")
    .Output("inv_std: float")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      c->set_output(1, c->input(0));
      ShapeHandle rows;
      TF_RETURN_IF_ERROR(c->Subshape(c->input(0), 0, -1, &rows));
      c->set_output(2, rows);
      return absl::OkStatus();
    })
    .Doc("out = LayerNorm(x + y * keep) over the last axis, with x_hat and "
         "1/sqrt(var + epsilon) per row for the gradient.");

class ResidualLayerNormOp : public OpKernel {
 public:
  explicit ResidualLayerNormOp(OpKernelConstruction* ctx)
      : OpKernel(ctx), attrs_(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &epsilon_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& y = ctx->input(1);
    const Tensor& seed = ctx->input(2);
    const Tensor& gamma = ctx->input(3);
    const Tensor& beta = ctx->input(4);
    if (!CheckSeed(ctx, seed)) return;
    OP_REQUIRES(ctx, x.dims() >= 1, InvalidArgument("x must have rank >= 1"));
    OP_REQUIRES(ctx, x.shape() == y.shape(),
                InvalidArgument("x and y differ in shape: ", x.shape().DebugString(),
                                " against ", y.shape().DebugString()));
    const int64_t d = x.dim_size(x.dims() - 1);
    OP_REQUIRES(ctx, d > 0, InvalidArgument("the normalized (last) axis is empty"));
    OP_REQUIRES(ctx, gamma.NumElements() == d && beta.NumElements() == d,
                InvalidArgument("gamma and beta must have ", d, " elements"));
    const int64_t n = d ? x.NumElements() / d : 0;
    Tensor *out = nullptr, *x_hat = nullptr, *inv_std = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, x.shape(), &x_hat));
    TensorShape rows = x.shape();
    rows.RemoveLastDims(1);
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, rows, &inv_std));
    if (n == 0 || d == 0) return;
    const uint64_t key = SeedKey(seed);
    const float* px = x.flat<float>().data();
    const float* py = y.flat<float>().data();
    const float* pg = gamma.flat<float>().data();
    const float* pb = beta.flat<float>().data();
    float* po = out->flat<float>().data();
    float* ph = x_hat->flat<float>().data();
    float* pi = inv_std->flat<float>().data();
    const uint32_t threshold = attrs_.threshold;
    const float scale = attrs_.scale, epsilon = epsilon_;
    ParallelRows(ctx, n, 16 * d, [&](int64_t b, int64_t e) {
      std::vector<float> keep(d);
      std::vector<uint64_t> hashes(d / 4 + 2);
      for (int64_t r = b; r < e; ++r) {
        const int64_t o = r * d;
        KeepFactors(key, o, d, threshold, scale, keep.data(), hashes.data());
        float* z = ph + o;
        float sum = 0.f;
        for (int64_t j = 0; j < d; ++j) {
          z[j] = px[o + j] + py[o + j] * keep[j];
          sum += z[j];
        }
        const float mean = sum / d;
        float var = 0.f;
        for (int64_t j = 0; j < d; ++j) {
          const float c = z[j] - mean;
          var += c * c;
        }
        const float inv = 1.f / std::sqrt(var / d + epsilon);
        pi[r] = inv;
        for (int64_t j = 0; j < d; ++j) {
          const float h = (z[j] - mean) * inv;
          z[j] = h;
          po[o + j] = h * pg[j] + pb[j];
        }
      }
    });
  }

 private:
  DropoutAttrs attrs_;
  float epsilon_ = 0.f;
};

REGISTER_OP("KtResidualLayerNormGrad")
    .Input("dout: float")
    .Input("x_hat: float")
    .Input("inv_std: float")
    .Input("gamma: float")
    .Input("seed: int64")
    .Attr("threshold: int")
    .Attr("scale: float")
    .Output("dx: float")
    .Output("dy: float")
    .Output("dgamma: float")
    .Output("dbeta: float")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      c->set_output(1, c->input(0));
      c->set_output(2, c->input(3));
      c->set_output(3, c->input(3));
      return absl::OkStatus();
    })
    .Doc("Gradient of KtResidualLayerNorm: with g = dout * gamma, dx = "
         "inv_std * (g - mean(g) - x_hat * mean(g * x_hat)), dy = dx * keep, "
         "dgamma = sum(dout * x_hat), dbeta = sum(dout) over the rows.");

class ResidualLayerNormGradOp : public OpKernel {
 public:
  explicit ResidualLayerNormGradOp(OpKernelConstruction* ctx)
      : OpKernel(ctx), attrs_(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& dout = ctx->input(0);
    const Tensor& x_hat = ctx->input(1);
    const Tensor& inv_std = ctx->input(2);
    const Tensor& gamma = ctx->input(3);
    const Tensor& seed = ctx->input(4);
    if (!CheckSeed(ctx, seed)) return;
    OP_REQUIRES(ctx, dout.shape() == x_hat.shape() && dout.dims() >= 1,
                InvalidArgument("dout and x_hat differ in shape"));
    const int64_t d = dout.dim_size(dout.dims() - 1);
    OP_REQUIRES(ctx, d > 0, InvalidArgument("the normalized (last) axis is empty"));
    const int64_t n = dout.NumElements() / d;
    OP_REQUIRES(ctx, gamma.NumElements() == d && inv_std.NumElements() == n,
                InvalidArgument("gamma or inv_std has the wrong size"));
    Tensor *dx = nullptr, *dy = nullptr, *dgamma = nullptr, *dbeta = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, dout.shape(), &dx));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, dout.shape(), &dy));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, gamma.shape(), &dgamma));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, gamma.shape(), &dbeta));
    float* pdg = dgamma->flat<float>().data();
    float* pdb = dbeta->flat<float>().data();
    std::fill(pdg, pdg + d, 0.f);
    std::fill(pdb, pdb + d, 0.f);
    if (n == 0 || d == 0) return;
    const uint64_t key = SeedKey(seed);
    const float* pd = dout.flat<float>().data();
    const float* ph = x_hat.flat<float>().data();
    const float* pi = inv_std.flat<float>().data();
    const float* pg = gamma.flat<float>().data();
    float* pdx = dx->flat<float>().data();
    float* pdy = dy->flat<float>().data();
    const uint32_t threshold = attrs_.threshold;
    const float scale = attrs_.scale;
    // Row blocks, each with its own partial sums of dgamma and dbeta
    // (a fixed split, so the sums do not depend on the thread count).
    const int64_t blocks = std::min<int64_t>(n, 32);
    const int64_t per_block = (n + blocks - 1) / blocks;
    std::vector<float> partial(2 * blocks * d, 0.f);
    ParallelRows(ctx, blocks, 20 * d * per_block, [&](int64_t b, int64_t e) {
      std::vector<float> keep(d);
      std::vector<uint64_t> hashes(d / 4 + 2);
      for (int64_t blk = b; blk < e; ++blk) {
        float* sum_gamma = partial.data() + 2 * blk * d;
        float* sum_beta = sum_gamma + d;
        const int64_t last = std::min(n, (blk + 1) * per_block);
        for (int64_t r = blk * per_block; r < last; ++r) {
          const int64_t o = r * d;
          KeepFactors(key, o, d, threshold, scale, keep.data(), hashes.data());
          float mean_g = 0.f, mean_gh = 0.f;
          for (int64_t j = 0; j < d; ++j) {
            const float g = pd[o + j] * pg[j];
            mean_g += g;
            mean_gh += g * ph[o + j];
          }
          mean_g /= d;
          mean_gh /= d;
          const float inv = pi[r];
          for (int64_t j = 0; j < d; ++j) {
            const float g = inv * (pd[o + j] * pg[j] - mean_g - ph[o + j] * mean_gh);
            pdx[o + j] = g;
            pdy[o + j] = g * keep[j];
            sum_gamma[j] += pd[o + j] * ph[o + j];
            sum_beta[j] += pd[o + j];
          }
        }
      }
    });
    for (int64_t blk = 0; blk < blocks; ++blk) {
      for (int64_t j = 0; j < d; ++j) {
        pdg[j] += partial[2 * blk * d + j];
        pdb[j] += partial[2 * blk * d + d + j];
      }
    }
  }

 private:
  DropoutAttrs attrs_;
};

// exp(x) for float32 without a libm call, so that loops over it vectorize:
// Cephes' expf (range reduction by ln 2, degree-5 polynomial), within 2 ulp
// on [-87.3, 88.3]; inputs are clamped to that range, so exp of anything
// below -87.3 is 1.2e-38 rather than 0. Here x = score - row max <= 0.
inline float FastExp(float x) {
  const bool nan = !(x == x);
  float c = nan ? 0.f : x;
  c = c < -87.3f ? -87.3f : (c > 88.3f ? 88.3f : c);
  const float n = std::floor(c * 1.44269504088896341f + 0.5f);
  // r = c - n ln 2 with ln 2 split in two (Cody-Waite); fma keeps the
  // compiler from merging the two constants.
  const float r = std::fma(n, 2.12194440e-4f, std::fma(n, -0.693359375f, c));
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return nan ? x : y * scale;  // NaN in, NaN out
}

REGISTER_OP("KtMaskedSoftmaxDropout")
    .Input("scores: float")
    .Input("mask: bool")
    .Input("seed: int64")
    .Attr("threshold: int")
    .Attr("scale: float")
    .Output("weights: float")
    .Output("dropped: float")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      c->set_output(1, c->input(0));
      return absl::OkStatus();
    })
    .Doc("weights = softmax over the last axis of the allowed scores (mask "
         "True), 0 at blocked ones and in rows with none allowed; dropped = "
         "weights * keep. mask has the shape of scores.");

class MaskedSoftmaxDropoutOp : public OpKernel {
 public:
  explicit MaskedSoftmaxDropoutOp(OpKernelConstruction* ctx)
      : OpKernel(ctx), attrs_(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& scores = ctx->input(0);
    const Tensor& mask = ctx->input(1);
    const Tensor& seed = ctx->input(2);
    if (!CheckSeed(ctx, seed)) return;
    OP_REQUIRES(ctx, scores.dims() >= 1 && mask.shape() == scores.shape(),
                InvalidArgument("mask must have the shape of scores: ",
                                mask.shape().DebugString(), " against ",
                                scores.shape().DebugString()));
    Tensor *weights = nullptr, *dropped = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, scores.shape(), &weights));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, scores.shape(), &dropped));
    const int64_t k = scores.dim_size(scores.dims() - 1);
    const int64_t n = k ? scores.NumElements() / k : 0;
    if (n == 0) return;
    const uint64_t key = SeedKey(seed);
    const float* ps = scores.flat<float>().data();
    const bool* pm = mask.flat<bool>().data();
    float* pw = weights->flat<float>().data();
    float* pd = dropped->flat<float>().data();
    const uint32_t threshold = attrs_.threshold;
    const float scale = attrs_.scale;
    ParallelRows(ctx, n, 24 * k, [&](int64_t b, int64_t e) {
      std::vector<float> keep(k);
      std::vector<uint64_t> hashes(k / 4 + 2);
      for (int64_t r = b; r < e; ++r) {
        const int64_t o = r * k;
        float top = -INFINITY;
        for (int64_t j = 0; j < k; ++j)
          if (pm[o + j]) top = std::max(top, ps[o + j]);
        float total = 0.f;
        for (int64_t j = 0; j < k; ++j) {
          const float v = pm[o + j] ? FastExp(ps[o + j] - top) : 0.f;
          pw[o + j] = v;
          total += v;
        }
        const float inv = total > 0.f ? 1.f / total : 0.f;
        KeepFactors(key, o, k, threshold, scale, keep.data(), hashes.data());
        for (int64_t j = 0; j < k; ++j) {
          pw[o + j] *= inv;
          pd[o + j] = pw[o + j] * keep[j];
        }
      }
    });
  }

 private:
  DropoutAttrs attrs_;
};

REGISTER_OP("KtMaskedSoftmaxDropoutGrad")
    .Input("weights: float")
    .Input("dweights: float")
    .Input("ddropped: float")
    .Input("seed: int64")
    .Attr("threshold: int")
    .Attr("scale: float")
    .Output("dscores: float")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    })
    .Doc("Gradient of KtMaskedSoftmaxDropout: with g = dweights + ddropped * "
         "keep, dscores = weights * (g - sum(g * weights)) per row.");

class MaskedSoftmaxDropoutGradOp : public OpKernel {
 public:
  explicit MaskedSoftmaxDropoutGradOp(OpKernelConstruction* ctx)
      : OpKernel(ctx), attrs_(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& weights = ctx->input(0);
    const Tensor& dweights = ctx->input(1);
    const Tensor& ddropped = ctx->input(2);
    const Tensor& seed = ctx->input(3);
    if (!CheckSeed(ctx, seed)) return;
    OP_REQUIRES(ctx, weights.dims() >= 1 && dweights.shape() == weights.shape() &&
                         ddropped.shape() == weights.shape(),
                InvalidArgument("the gradients must have the shape of weights"));
    Tensor* dscores = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, weights.shape(), &dscores));
    const int64_t k = weights.dim_size(weights.dims() - 1);
    const int64_t n = k ? weights.NumElements() / k : 0;
    if (n == 0) return;
    const uint64_t key = SeedKey(seed);
    const float* pw = weights.flat<float>().data();
    const float* pgw = dweights.flat<float>().data();
    const float* pgd = ddropped.flat<float>().data();
    float* out = dscores->flat<float>().data();
    const uint32_t threshold = attrs_.threshold;
    const float scale = attrs_.scale;
    ParallelRows(ctx, n, 16 * k, [&](int64_t b, int64_t e) {
      std::vector<float> keep(k);
      std::vector<uint64_t> hashes(k / 4 + 2);
      for (int64_t r = b; r < e; ++r) {
        const int64_t o = r * k;
        KeepFactors(key, o, k, threshold, scale, keep.data(), hashes.data());
        float dot = 0.f;
        for (int64_t j = 0; j < k; ++j) {
          const float g = pgw[o + j] + pgd[o + j] * keep[j];
          out[o + j] = g;
          dot += g * pw[o + j];
        }
        for (int64_t j = 0; j < k; ++j) out[o + j] = pw[o + j] * (out[o + j] - dot);
      }
    });
  }

 private:
  DropoutAttrs attrs_;
};

REGISTER_KERNEL_BUILDER(Name("KtMaskedSoftmaxDropout").Device(DEVICE_CPU),
                        MaskedSoftmaxDropoutOp);
REGISTER_KERNEL_BUILDER(Name("KtMaskedSoftmaxDropoutGrad").Device(DEVICE_CPU),
                        MaskedSoftmaxDropoutGradOp);
REGISTER_OP("KtGatherRows")
    .Input("params: T")
    .Input("indices: int32")
    .Output("out: T")
    .Attr("T: {float, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle features, out;
      TF_RETURN_IF_ERROR(c->Subshape(c->input(0), 1, &features));
      TF_RETURN_IF_ERROR(c->Concatenate(c->input(1), features, &out));
      c->set_output(0, out);
      return absl::OkStatus();
    })
    .Doc("out[s] = params[indices[s]], and a row of zeros where indices[s] "
         "== params.shape[0] (the padding rows of layers/unpadding.py).");

// The gathers only move rows: one template for float32 and bfloat16
// (mixed_bfloat16 training), instantiated for both.
template <typename T>
class GatherRowsOp : public OpKernel {
 public:
  explicit GatherRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& params = ctx->input(0);
    const Tensor& indices = ctx->input(1);
    OP_REQUIRES(ctx, params.dims() >= 1 && indices.dims() == 1,
                InvalidArgument("params must have rank >= 1 and indices rank 1"));
    const int64_t rows = params.dim_size(0);
    int64_t features = 1;  // from the shape: rows may be 0
    for (int a = 1; a < params.dims(); ++a) features *= params.dim_size(a);
    const int64_t n = indices.dim_size(0);
    TensorShape shape = params.shape();
    shape.set_dim(0, n);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &out));
    const int32_t* pi = indices.flat<int32_t>().data();
    for (int64_t s = 0; s < n; ++s) {
      OP_REQUIRES(ctx, pi[s] >= 0 && pi[s] <= rows,
                  InvalidArgument("index ", pi[s], " at ", s, " is outside [0, ", rows, "]"));
    }
    if (n == 0 || features == 0) return;
    const T* pp = params.flat<T>().data();
    T* po = out->flat<T>().data();
    const size_t bytes = features * sizeof(T);
    ParallelRows(ctx, n, 2 * features, [&](int64_t b, int64_t e) {
      for (int64_t s = b; s < e; ++s) {
        if (pi[s] < rows) {
          std::memcpy(po + s * features, pp + pi[s] * features, bytes);
        } else {
          std::memset(po + s * features, 0, bytes);
        }
      }
    });
  }
};

REGISTER_KERNEL_BUILDER(
    Name("KtGatherRows").Device(DEVICE_CPU).TypeConstraint<float>("T"),
    GatherRowsOp<float>);
REGISTER_KERNEL_BUILDER(
    Name("KtGatherRows").Device(DEVICE_CPU).TypeConstraint<::tensorflow::bfloat16>("T"),
    GatherRowsOp<::tensorflow::bfloat16>);

REGISTER_OP("KtGatherRowsFromParts")
    .Input("parts: N * T")
    .Input("indices: int32")
    .Attr("N: int >= 1")
    .Attr("T: {float, bfloat16}")
    .Output("out: T")
    .SetShapeFn([](InferenceContext* c) {
      const int n = c->num_inputs() - 1;
      ShapeHandle features, out;
      TF_RETURN_IF_ERROR(c->Subshape(c->input(0), 1, &features));
      TF_RETURN_IF_ERROR(c->Concatenate(c->input(n), features, &out));
      c->set_output(0, out);
      return absl::OkStatus();
    })
    .Doc("KtGatherRows from the parts stacked along their first axis, without "
         "stacking them: row r of that stack is row r - offset of its part; "
         "the index equal to the total row count gives zeros. Every part has "
         "the same feature size.");

template <typename T>
class GatherRowsFromPartsOp : public OpKernel {
 public:
  explicit GatherRowsFromPartsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const int n_parts = ctx->num_inputs() - 1;
    const Tensor& indices = ctx->input(n_parts);
    OP_REQUIRES(ctx, indices.dims() == 1, InvalidArgument("indices must have rank 1"));
    const Tensor& head = ctx->input(0);
    OP_REQUIRES(ctx, head.dims() >= 1, InvalidArgument("parts must have rank >= 1"));
    int64_t features = 1;  // from the shape: a part may have 0 rows
    for (int a = 1; a < head.dims(); ++a) features *= head.dim_size(a);
    std::vector<const T*> base(n_parts);
    std::vector<int64_t> start(n_parts + 1, 0);
    for (int p = 0; p < n_parts; ++p) {
      const Tensor& part = ctx->input(p);
      OP_REQUIRES(ctx, part.dims() == head.dims(),
                  InvalidArgument("parts differ in rank"));
      for (int a = 1; a < head.dims(); ++a) {
        OP_REQUIRES(ctx, part.dim_size(a) == head.dim_size(a),
                    InvalidArgument("parts differ in their feature shape"));
      }
      base[p] = part.flat<T>().data();
      start[p + 1] = start[p] + part.dim_size(0);
    }
    const int64_t rows = start[n_parts];
    const int64_t n = indices.dim_size(0);
    TensorShape shape = head.shape();
    shape.set_dim(0, n);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &out));
    const int32_t* pi = indices.flat<int32_t>().data();
    for (int64_t s = 0; s < n; ++s) {
      OP_REQUIRES(ctx, pi[s] >= 0 && pi[s] <= rows,
                  InvalidArgument("index ", pi[s], " at ", s, " is outside [0, ", rows, "]"));
    }
    if (n == 0 || features == 0) return;
    T* po = out->flat<T>().data();
    const size_t bytes = features * sizeof(T);
    ParallelRows(ctx, n, 2 * features, [&](int64_t b, int64_t e) {
      for (int64_t s = b; s < e; ++s) {
        const int64_t r = pi[s];
        if (r == rows) {
          std::memset(po + s * features, 0, bytes);
          continue;
        }
        int p = 0;
        while (r >= start[p + 1]) ++p;
        std::memcpy(po + s * features, base[p] + (r - start[p]) * features, bytes);
      }
    });
  }
};

REGISTER_KERNEL_BUILDER(
    Name("KtGatherRowsFromParts").Device(DEVICE_CPU).TypeConstraint<float>("T"),
    GatherRowsFromPartsOp<float>);
REGISTER_KERNEL_BUILDER(
    Name("KtGatherRowsFromParts").Device(DEVICE_CPU).TypeConstraint<::tensorflow::bfloat16>("T"),
    GatherRowsFromPartsOp<::tensorflow::bfloat16>);

REGISTER_OP("KtSoftmaxCrossEntropy")
    .Input("logits: float")
    .Input("labels: int32")
    .Attr("label_smoothing: float")
    .Output("loss: float")
    .Output("log_sum_exp: float")
    .Output("argmax: int32")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle rows;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &rows));
      TF_RETURN_IF_ERROR(c->Subshape(c->input(0), 0, 1, &rows));
      c->set_output(0, rows);
      c->set_output(1, rows);
      c->set_output(2, rows);
      return absl::OkStatus();
    })
    .Doc("Per row of logits (N, V): loss = logsumexp(x) - (1 - eps) x[label] "
         "- eps mean(x), the cross-entropy against (1 - eps) onehot + eps / V "
         "(section 5.4); log_sum_exp for the gradient; argmax, the first "
         "index of the largest logit (for the accuracy).");

class SoftmaxCrossEntropyOp : public OpKernel {
 public:
  explicit SoftmaxCrossEntropyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("label_smoothing", &epsilon_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& logits = ctx->input(0);
    const Tensor& labels = ctx->input(1);
    OP_REQUIRES(ctx, logits.dims() == 2 && labels.dims() == 1 &&
                         labels.dim_size(0) == logits.dim_size(0),
                InvalidArgument("expected logits (N, V) and labels (N,), got ",
                                logits.shape().DebugString(), " and ",
                                labels.shape().DebugString()));
    const int64_t n = logits.dim_size(0), v = logits.dim_size(1);
    OP_REQUIRES(ctx, v > 0, InvalidArgument("empty vocabulary axis"));
    const int32_t* pl = labels.flat<int32_t>().data();
    for (int64_t r = 0; r < n; ++r) {
      OP_REQUIRES(ctx, pl[r] >= 0 && pl[r] < v,
                  InvalidArgument("label ", pl[r], " at row ", r, " is outside [0, ", v, ")"));
    }
    Tensor *loss = nullptr, *lse = nullptr, *argmax = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, labels.shape(), &loss));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, labels.shape(), &lse));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, labels.shape(), &argmax));
    const float* px = logits.flat<float>().data();
    float* ploss = loss->flat<float>().data();
    float* plse = lse->flat<float>().data();
    int32_t* parg = argmax->flat<int32_t>().data();
    const float eps = epsilon_;
    ParallelRows(ctx, n, 12 * v, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const float* row = px + r * v;
        float top = row[0], sum = 0.f;
        for (int64_t j = 0; j < v; ++j) {
          top = std::max(top, row[j]);
          sum += row[j];
        }
        int64_t first = 0;
        while (first < v - 1 && !(row[first] == top)) ++first;
        float total = 0.f;
        for (int64_t j = 0; j < v; ++j) total += FastExp(row[j] - top);
        const float z = top + std::log(total);
        plse[r] = z;
        parg[r] = static_cast<int32_t>(first);
        // A NaN logit anywhere makes the sum NaN: the loss says so.
        ploss[r] = std::isnan(sum) ? NAN : z - (1.f - eps) * row[pl[r]] - eps * sum / v;
      }
    });
  }

 private:
  float epsilon_ = 0.f;
};

REGISTER_OP("KtSoftmaxCrossEntropyGrad")
    .Input("logits: float")
    .Input("labels: int32")
    .Input("log_sum_exp: float")
    .Input("upstream: float")
    .Attr("label_smoothing: float")
    .Output("dlogits: float")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    })
    .Doc("Gradient of KtSoftmaxCrossEntropy: upstream * (softmax(x) - "
         "(1 - eps) onehot(label) - eps / V) per row.");

class SoftmaxCrossEntropyGradOp : public OpKernel {
 public:
  explicit SoftmaxCrossEntropyGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("label_smoothing", &epsilon_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& logits = ctx->input(0);
    const Tensor& labels = ctx->input(1);
    const Tensor& lse = ctx->input(2);
    const Tensor& upstream = ctx->input(3);
    OP_REQUIRES(ctx, logits.dims() == 2 && labels.NumElements() == logits.dim_size(0) &&
                         lse.NumElements() == logits.dim_size(0) &&
                         upstream.NumElements() == logits.dim_size(0),
                InvalidArgument("expected logits (N, V) and (N,) labels, log_sum_exp, upstream"));
    const int64_t n = logits.dim_size(0), v = logits.dim_size(1);
    Tensor* dlogits = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, logits.shape(), &dlogits));
    const float* px = logits.flat<float>().data();
    const int32_t* pl = labels.flat<int32_t>().data();
    const float* pz = lse.flat<float>().data();
    const float* pu = upstream.flat<float>().data();
    float* pd = dlogits->flat<float>().data();
    const float eps = epsilon_;
    ParallelRows(ctx, n, 8 * v, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const float* row = px + r * v;
        float* out = pd + r * v;
        const float u = pu[r], z = pz[r], flat = eps / v * u;
        for (int64_t j = 0; j < v; ++j) out[j] = FastExp(row[j] - z) * u - flat;
        if (pl[r] >= 0 && pl[r] < v) out[pl[r]] -= (1.f - eps) * u;
      }
    });
  }

 private:
  float epsilon_ = 0.f;
};

REGISTER_KERNEL_BUILDER(Name("KtSoftmaxCrossEntropy").Device(DEVICE_CPU),
                        SoftmaxCrossEntropyOp);
REGISTER_KERNEL_BUILDER(Name("KtSoftmaxCrossEntropyGrad").Device(DEVICE_CPU),
                        SoftmaxCrossEntropyGradOp);
REGISTER_KERNEL_BUILDER(Name("KtDropout").Device(DEVICE_CPU), DropoutOp);
REGISTER_KERNEL_BUILDER(Name("KtResidualLayerNorm").Device(DEVICE_CPU), ResidualLayerNormOp);
REGISTER_KERNEL_BUILDER(Name("KtResidualLayerNormGrad").Device(DEVICE_CPU),
                        ResidualLayerNormGradOp);

}  // namespace keras_transformer
