// Attention without the [B, H, T, S] probabilities unless a hook asks for them
// (models/src/attention.h, docs/design.md decision 14).
//  - attend() on every path against a float64 reference written here (masks
//    with padding, rows that see nothing, soft-capping, blocks of queries,
//    past keys);
//  - whole models (Llama, Mistral, Gemma 2, GPT-2, GPT-NeoX, attention
//    sharpened): the unhooked path against the hooked (eager) one, which the
//    golden tests pin to Transformers, and both against the hooked float64
//    model, on a prefill split into blocks, a left-padded batch and KV-cache
//    decoding; the unhooked path against the golden logits;
//  - a hook on hook_attn_probs still sees [B, H, T, S] and its edit flows on;
//  - a 4096-token context runs with a peak well under the 256 MiB one layer's
//    probabilities would take (and the hooked run, measured the same way, over).
#include "golden_util.h"

#include "../../models/src/attention.h"

#include <flex/hooks/errors.h>
#include <flex/kernels/decode_attention.h>
#include <flex/models/auto_model.h>


#include <cmath>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "test_util.h"

using namespace flex;
namespace fd = flex::detail;
using fd::AttendOptions;
using fd::AttendTrace;
using models_test::close;

namespace {


// Sets the chunked path's block budget for one scope.
struct BlockBudget {
  explicit BlockBudget(int64_t bytes) : saved(fd::attention_block_budget()) {
    fd::set_attention_block_budget(bytes);
  }
  ~BlockBudget() { fd::set_attention_block_budget(saved); }
  int64_t saved;
};

// ---------------------------------------------------------------------------
// attend() against a float64 reference.

// softmax(mask(softcap(scale * q k^T))) v in float64; a row that sees no key
// averages all values (what masked_fill(lowest) + softmax gives).
at::Tensor reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed,
                     double scale, double softcap) {
  at::Tensor s = at::matmul(q.to(at::kDouble), k.to(at::kDouble).transpose(-1, -2)) * scale;
  if (softcap > 0) s = at::tanh(s / softcap) * softcap;
  at::Tensor p;
  if (allowed.defined()) {
    at::Tensor vis = allowed.expand_as(s);
    p = at::softmax(s.masked_fill(vis.logical_not(), -INFINITY), -1);
    at::Tensor blind = vis.logical_not().all(-1, true).expand_as(s);
    p = at::where(blind, at::full_like(p, 1.0 / static_cast<double>(s.size(-1))), p);
  } else {
    p = at::softmax(s, -1);
  }
  return at::matmul(p, v.to(at::kDouble));
}

// Causal with `past` earlier keys, key padding from `keep` [B, S].
at::Tensor causal_allowed(int64_t t, int64_t past, const at::Tensor& keep) {
  const int64_t s = past + t;
  at::Tensor m = at::arange(s).unsqueeze(0).le(at::arange(past, s).unsqueeze(1)).view({1, 1, t, s});
  return keep.defined() ? m.logical_and(keep.view({keep.size(0), 1, 1, s})) : m;
}

struct AttendCase {
  std::string what;
  int64_t t, past;
  at::Tensor allowed;
  double softcap = 0;
};

TEST(Attend, EveryPathEqualsTheFloat64Reference) {
  at::manual_seed(0);
  const int64_t b = 2, h = 3, d = 8, t = 37;
  BlockBudget budget(b * h * 45 * 4 * 5);  // 5 or 6 query rows per block: 37 queries in 7 or 8 blocks
  at::Tensor keep = at::ones({b, 8 + t}, at::kBool);
  keep.select(0, 0).narrow(0, 0, 11).fill_(false);  // row 0: 11 padding keys on the left
  std::vector<AttendCase> cases = {
      {"no mask", t, 0, at::Tensor()},
      {"causal", t, 0, causal_allowed(t, 0, {})},
      {"causal, left padding (rows that see nothing)", t, 0, causal_allowed(t, 0, keep.narrow(1, 8, t))},
      {"past keys, padding", t, 8, causal_allowed(t, 8, keep)},
      {"padding only [B, 1, 1, S]", t, 0, keep.narrow(1, 8, t).view({b, 1, 1, t})},
      {"soft-capped, causal", t, 0, causal_allowed(t, 0, {}), 2.0},
      {"one query with past", 1, 44, causal_allowed(1, 44, keep)},
  };
  for (const auto& c : cases) {
    const int64_t s = c.past + c.t;
    at::Tensor q = at::randn({b, h, c.t, d}) * 3, k = at::randn({b, h, s, d}), v = at::randn({b, h, s, d});
    AttendOptions o;
    o.multiply = 0.5;
    o.divide = {std::sqrt(8.0)};
    o.softcap = c.softcap;
    o.upcast_softmax = true;
    const at::Tensor expected = reference(q, k, v, c.allowed, 0.5 / std::sqrt(8.0), c.softcap);
    Identity point("HookPoint");
    const at::Tensor fast = fd::attend(q, k, v, c.allowed, o, point);
    const AttendTrace fast_trace = fd::last_attend_trace();
    EXPECT_NE(fast_trace.path, AttendTrace::Path::Eager) << c.what;
    if (fast_trace.path == AttendTrace::Path::Chunked && c.t > 6) {
      EXPECT_GE(fast_trace.blocks, 7) << c.what;
    }
    EXPECT_TRUE(close(fast, expected, c.what + ": unhooked", 1e-5, 1e-5));

    at::Tensor seen;
    auto handle = point.register_forward_hook([&](Module&, const Inputs&, Value& out) { seen = out.toTensor(); });
    const at::Tensor eager = fd::attend(q, k, v, c.allowed, o, point);
    handle.remove();
    EXPECT_EQ(fd::last_attend_trace().path, AttendTrace::Path::Eager) << c.what;
    ASSERT_TRUE(seen.defined()) << c.what;
    EXPECT_EQ(seen.sizes(), (at::IntArrayRef{b, h, c.t, s})) << c.what;
    EXPECT_TRUE(close(eager, expected, c.what + ": hooked", 1e-5, 1e-5));
  }
}

// The decode kernel: one query per row against grouped key/value heads read
// in place (2 of 8 heads here), float32 and bfloat16, strided caches (a view
// into a longer buffer), a padded row and a row that sees no key, against the
// float64 reference on heads repeated by hand; the same bits on 1 and 2 threads.
TEST(Attend, DecodeKernelReadsGroupedHeadsAsTheirRepeats) {
  at::manual_seed(31);
  const int64_t b = 3, h = 8, kvh = 2, s = 37, d = 20;
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    const at::Tensor q = at::randn({b, h, 1, d}).to(dt);
    const at::Tensor k = at::randn({b, kvh, s + 5, d}).to(dt).narrow(2, 0, s);  // strided like a cache buffer
    const at::Tensor v = at::randn({b, kvh, s + 5, d + 3}).to(dt).narrow(2, 0, s);
    at::Tensor keep = at::ones({b, s}, at::kBool);
    keep[1].narrow(0, 0, 9).fill_(false);  // left padding
    keep[2].fill_(false);                  // sees no key
    const at::Tensor allowed = keep.view({b, 1, 1, s});
    AttendOptions o;
    o.divide = {std::sqrt(static_cast<double>(d))};
    ASSERT_TRUE(fd::decode_attention_applies(q, k, v, allowed, o));
    Identity probs_point("Identity");
    at::Tensor one, two;
    {
      flex_test::ThreadsGuard g(1);
      one = fd::attend(q, k, v, allowed, o, probs_point);
    }
    EXPECT_EQ(fd::last_attend_trace().path, AttendTrace::Path::Decode);
    {
      flex_test::ThreadsGuard g(2);
      two = fd::attend(q, k, v, allowed, o, probs_point);
    }
    EXPECT_TRUE(flex_test::equal(two, one)) << dt;
    const at::Tensor want = reference(q, fd::repeat_kv(k, h / kvh), fd::repeat_kv(v, h / kvh), allowed, o.scale(), 0);
    const double tol = dt == at::kFloat ? 1e-5 : 1e-2;
    EXPECT_TRUE(flex_test::close(one.to(at::kDouble), want, tol, tol)) << dt;
    // Hooked, the eager path repeats the heads and gives the same result.
    auto hook = probs_point.register_forward_hook([](Module&, const Inputs&, Value&) {});
    EXPECT_TRUE(flex_test::close(fd::attend(q, k, v, allowed, o, probs_point).to(at::kDouble), want, tol, tol)) << dt;
    EXPECT_EQ(fd::last_attend_trace().path, AttendTrace::Path::Eager);
    hook.remove();
  }
  Identity point("Identity");
  EXPECT_THROW(fd::attend(at::randn({1, 6, 1, 4}), at::randn({1, 4, 3, 4}), at::randn({1, 4, 3, 4}), at::Tensor(),
                          AttendOptions{}, point),
               flex::ShapeError);
}

// The kernel under the decode path (flex::grouped_decode_attention) on every
// ISA level this CPU has: groups of 1, 4, 8 and 12 query heads per key/value
// head (12: two blocks of heads in a unit), head sizes on and off the vector
// width, two sequences with different masks (left padding and holes, a
// sequence that sees no key, a mask shared by the batch, none), caches that
// are views into longer buffers (one with the positions outermost), against
// float64 softmax(q k^T * scale) v on heads repeated by hand; 1 and 2
// threads give the same bits.
struct DecodeCase {
  int64_t h, kvh, d, dv, s;
  int mask;  // 0: none; 1: [B, S] padding + holes; 2: second sequence sees no key; 3: [1, S] shared
  bool positions_outer;  // the buffer laid out [B, cap, Hkv, D]
};

TEST(Attend, DecodeKernelOnEveryIsaEqualsTheFloat64Reference) {
  const std::vector<DecodeCase> cases = {
      {3, 3, 64, 64, 37, 1, false},   {8, 2, 40, 72, 100, 2, true}, {32, 4, 64, 64, 130, 1, false},
      {12, 1, 24, 8, 17, 3, false},   {32, 4, 64, 64, 16, 0, true}, {16, 2, 128, 128, 45, 2, false},
  };
  for (const flex::Isa isa : flex_test::isa_levels()) {
    flex::ScopedIsa scoped(isa);
    for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
      double worst = 0;
      std::string worst_at;
      for (const auto& c : cases) {
        at::manual_seed(c.h * 1000 + c.s);
        const int64_t b = 2, cap = c.s + 9;
        const at::Tensor q = (at::randn({b, c.h, 1, c.d}) * 2).to(dt);
        auto cache = [&](int64_t width) {
          const at::Tensor buf = c.positions_outer ? at::randn({b, cap, c.kvh, width}).to(dt).transpose(1, 2)
                                                   : at::randn({b, c.kvh, cap, width}).to(dt);
          return buf.narrow(2, 4, c.s);  // a window inside the buffer, as a cache's narrow()
        };
        const at::Tensor k = cache(c.d), v = cache(c.dv);
        at::Tensor keep;
        if (c.mask == 1 || c.mask == 2) {
          keep = at::rand({b, c.s}).gt(0.3);
          keep[0].narrow(0, 0, std::min<int64_t>(5, c.s - 1)).fill_(false);  // left padding
          keep[0][c.s - 1] = true;
          if (c.mask == 2) keep[1].fill_(false);
        } else if (c.mask == 3) {
          keep = at::rand({1, c.s}).gt(0.5);
          keep[0][0] = true;
        }
        const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
        at::Tensor one, two;
        {
          flex_test::ThreadsGuard g(1);
          one = flex::grouped_decode_attention(q, k, v, keep, scale);
        }
        {
          flex_test::ThreadsGuard g(2);
          two = flex::grouped_decode_attention(q, k, v, keep, scale);
        }
        const std::string what = to_string(isa) + " " + c10::toString(dt) + " H " + std::to_string(c.h) + " Hkv " +
                                 std::to_string(c.kvh) + " D " + std::to_string(c.d) + " Dv " + std::to_string(c.dv) +
                                 " S " + std::to_string(c.s) + " mask " + std::to_string(c.mask);
        EXPECT_TRUE(flex_test::equal(two, one)) << what << ": 1 vs 2 threads";
        const int64_t g = c.h / c.kvh;
        const at::Tensor allowed = keep.defined() ? keep.view({keep.size(0), 1, 1, c.s}) : at::Tensor();
        const at::Tensor want = reference(q, fd::repeat_kv(k, g), fd::repeat_kv(v, g), allowed, scale, 0);
        // float32: a few roundings of the products, exp (2 ulp) and sums; bf16: plus the final rounding (2^-9).
        const double rtol = dt == at::kFloat ? 2e-6 : 4e-3, atol = dt == at::kFloat ? 2e-6 : 1e-5;
        EXPECT_TRUE(flex_test::close(one.to(at::kDouble), want, rtol, atol)) << what;
        const at::Tensor diff = (one.to(at::kDouble) - want).abs() / (want.abs() + 1);
        const int64_t at_ = diff.argmax().item<int64_t>();
        if (diff.view(-1)[at_].item<double>() > worst) {
          worst = diff.view(-1)[at_].item<double>();
          worst_at = what + ", flat index " + std::to_string(at_);
        }
      }
      std::cout << "decode kernel " << to_string(isa) << " " << dt << ": largest |got - want| / (|want| + 1) " << worst
                << " (" << worst_at << ")\n";
    }
  }
}

// The kernel refuses what it cannot compute, naming the tensor.
TEST(Attend, DecodeKernelRefusesBadInputsByName) {
  const at::Tensor q = at::randn({2, 4, 1, 8}), k = at::randn({2, 2, 5, 8}), v = at::randn({2, 2, 5, 8});
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const flex::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_THROW(flex::grouped_decode_attention(q, at::randn({2, 3, 5, 8}), v, {}, 1.0), flex::ShapeError);
  EXPECT_THROW(flex::grouped_decode_attention(at::randn({2, 4, 2, 8}), k, v, {}, 1.0), flex::ShapeError);
  EXPECT_THROW(flex::grouped_decode_attention(q, k.narrow(2, 0, 0), v.narrow(2, 0, 0), {}, 1.0), flex::ShapeError);
  EXPECT_NE(message([&] { flex::grouped_decode_attention(q, k, v, at::ones({3, 5}, at::kBool), 1.0); }).find("allowed"),
            std::string::npos);
  EXPECT_NO_THROW(flex::grouped_decode_attention(q, k, v, at::ones({2, 5}, at::kBool), 1.0));  // the control
  EXPECT_NE(message([&] { flex::grouped_decode_attention(q, k.to(at::kBFloat16), v, {}, 1.0); }).find("k is BFloat16"),
            std::string::npos);
  EXPECT_THROW(flex::grouped_decode_attention(q, k, at::randn({2, 2, 8, 5}).transpose(2, 3), {}, 1.0), flex::UnsupportedError);
  EXPECT_THROW(flex::grouped_decode_attention(q.to(at::kDouble), k.to(at::kDouble), v.to(at::kDouble), {}, 1.0),
               flex::UnsupportedError);
}

// The softmax kernels' exp (exp_poly.h) against std::exp in double over its
// whole domain, on every ISA: largest relative error printed, within 2.5e-7
// (about 2 ulp); 0 below float32's smallest normal's log, exactly 1 at 0.
TEST(Attend, SoftmaxExpIsWithinItsStatedErrorOfStdExp) {
  const int64_t n = 1 << 20;
  std::vector<float> x(n), y(n);
  for (int64_t i = 0; i < n; ++i) x[i] = -87.33f * static_cast<float>(i) / static_cast<float>(n - 1);
  for (const flex::Isa isa : flex_test::isa_levels()) {
    flex::ScopedIsa scoped(isa);
    flex::softmax_exp(x.data(), y.data(), n);
    double worst = 0;
    int64_t at_ = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double e = std::exp(static_cast<double>(x[i])), r = std::abs(y[i] - e) / e;
      if (r > worst) worst = r, at_ = i;
    }
    std::cout << "softmax_exp " << to_string(isa) << ": largest relative error " << worst << " at x = " << x[at_]
              << "\n";
    EXPECT_LE(worst, 2.5e-7) << to_string(isa) << " at x = " << x[at_] << ": " << y[at_];
    const float edge[] = {0.0f, -88.0f, -1000.0f, -std::numeric_limits<float>::infinity()};
    float out[4];
    flex::softmax_exp(edge, out, 4);
    EXPECT_EQ(out[0], 1.0f) << to_string(isa);
    EXPECT_EQ(out[1], 0.0f) << to_string(isa);
    EXPECT_EQ(out[2], 0.0f) << to_string(isa);
    EXPECT_EQ(out[3], 0.0f) << to_string(isa);
  }
}

TEST(Attend, ScoreOrderAndUpcastOptionsMatchTheirFormula) {
  at::manual_seed(1);
  at::Tensor q = at::randn({1, 2, 9, 4}), k = at::randn({1, 2, 9, 4}), v = at::randn({1, 2, 9, 4});
  const at::Tensor allowed = causal_allowed(9, 0, {});
  Identity point("HookPoint");
  AttendOptions o;  // GPT-2 with scale_attn_by_inverse_layer_idx on layer 2, upcast
  o.divide = {2.0, 3.0};
  o.upcast_scores = true;
  EXPECT_DOUBLE_EQ(o.scale(), 1.0 / 6.0);
  EXPECT_TRUE(close(fd::attend(q, k, v, allowed, o, point), reference(q, k, v, allowed, 1.0 / 6.0, 0), "/2 /3",
                    1e-5, 1e-5));
  // bfloat16 inputs: the result keeps v's dtype and stays near the reference.
  const at::Tensor z = fd::attend(q.to(at::kBFloat16), k.to(at::kBFloat16), v.to(at::kBFloat16), allowed, o, point);
  EXPECT_EQ(z.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(close(z.to(at::kFloat), reference(q, k, v, allowed, 1.0 / 6.0, 0), "bf16", 5e-2, 5e-2));
}

// The eager path applies a net power-of-two scale to q rather than to the
// scores, and masks and normalizes the scores in place where no graph is
// recorded. Both must leave the probabilities a hook sees with the bits of the
// architecture's own order (q k^T, * multiply, / each divide, masked_fill,
// softmax), written out here op by op; a factor that is not a power of two
// keeps that order. float32 scores on an AVX2 CPU go through
// flex::masked_softmax_ (its own exp: within a few ulps, not the bits), so the
// bits are checked with the ISA capped at scalar, where libtorch's softmax
// runs. With a graph recorded, the gradient equals the written-out formula's.
TEST(Attend, EagerProbabilitiesKeepTheScoreOrderBits) {
  at::manual_seed(5);
  const at::Tensor allowed = causal_allowed(11, 2, {});
  struct Factors { double multiply; std::vector<double> divide; };
  const std::vector<Factors> all = {{1.0, {8.0}}, {0.5, {2.0, 4.0}}, {1.0, {std::sqrt(128.0)}}, {0.7, {2.0}}};
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    for (const Factors& f : all) {
      const at::Tensor q = (at::randn({2, 3, 11, 16}) * 2).to(dt), k = at::randn({2, 3, 13, 16}).to(dt);
      const at::Tensor v = at::randn({2, 3, 13, 16}).to(dt);
      at::Tensor want = at::matmul(q, k.transpose(-1, -2));
      if (f.multiply != 1.0) want = want * f.multiply;
      for (double d : f.divide) want = want / d;
      want = at::softmax(want.masked_fill(allowed.logical_not(), fd::lowest_value(dt)), -1);
      AttendOptions o;
      o.multiply = f.multiply;
      o.divide = f.divide;
      Identity point("HookPoint");
      at::Tensor seen;
      auto handle = point.register_forward_hook([&](Module&, const Inputs&, Value& out) { seen = out.toTensor(); });
      for (flex::Isa isa : {flex::Isa::Scalar, flex::cpu_isa_supported()}) {
        flex::ScopedIsa cap(isa);
        const at::Tensor z = fd::attend(q, k, v, allowed, o, point);
        ASSERT_EQ(fd::last_attend_trace().path, AttendTrace::Path::Eager);
        const std::string what = std::string(c10::toString(dt)) + " " + flex::to_string(isa) + " multiply " +
                                 std::to_string(f.multiply) + " divide " + std::to_string(f.divide[0]);
        if (dt == at::kFloat && isa >= flex::Isa::Avx2) {
          EXPECT_TRUE(flex_test::close(seen, want, 2e-6, 1e-7)) << what;
          EXPECT_TRUE(flex_test::close(z, at::matmul(want, v), 1e-5, 1e-6)) << what;
        } else {
          EXPECT_TRUE(flex_test::equal(seen, want)) << what;
          EXPECT_TRUE(flex_test::equal(z, at::matmul(want, v))) << what;
        }
      }

      // Recording a graph: out of place, and the gradient reaches q.
      if (dt != at::kFloat) {
        handle.remove();
        continue;
      }
      const at::Tensor qg = q.clone().requires_grad_(true), qr = q.clone().requires_grad_(true);
      fd::attend(qg, k, v, allowed, o, point).square().sum().backward();
      at::Tensor r = at::matmul(qr, k.transpose(-1, -2));
      if (f.multiply != 1.0) r = r * f.multiply;
      for (double d : f.divide) r = r / d;
      at::matmul(at::softmax(r.masked_fill(allowed.logical_not(), fd::lowest_value(dt)), -1), v).square().sum()
          .backward();
      EXPECT_TRUE(flex_test::close(qg.grad(), qr.grad(), 1e-6, 1e-5)) << "multiply " << f.multiply;
      handle.remove();
    }
  }
}

TEST(Attend, BlocksOfQueriesStayUnderTheBudget) {
  // The case the budget is for: B=1, H=4, T=S=4096 in float32 is 256 MiB of scores.
  const int64_t mib = int64_t{1} << 20;
  EXPECT_EQ(fd::attention_block_budget(), 64 * mib);
  EXPECT_EQ(fd::query_block_rows(1, 4, 4096, 4096, 4, 64 * mib), 1024);
  for (int64_t budget : {int64_t{1}, 1000 * int64_t{1}, 3 * mib, 64 * mib}) {
    for (int64_t s : {int64_t{1}, int64_t{7}, int64_t{4096}, int64_t{100000}}) {
      const int64_t rows = fd::query_block_rows(2, 8, 4096, s, 4, budget);
      EXPECT_GE(rows, 1);
      EXPECT_LE(rows, 4096);
      if (rows > 1) {
        EXPECT_LE(2 * 8 * rows * s * 4, budget) << "budget " << budget << " s " << s;
      }
      if (rows < 4096) {
        EXPECT_GT(2 * 8 * (rows + 1) * s * 4, budget) << "budget " << budget << " s " << s;
      }
    }
  }
  EXPECT_EQ(fd::query_block_rows(1, 1, 1, 1 << 20, 4, 1), 1);  // decoding: one row, whatever the budget
}

TEST(Attend, OnlyTheModelsOwnCausalMaskCountsAsPlainCausal) {
  const at::Device cpu(at::kCPU);
  at::Tensor m = fd::allowed_mask({}, 1, 6, 0, cpu);
  EXPECT_TRUE(fd::is_plain_causal(m));
  EXPECT_TRUE(flex_test::equal(m, causal_allowed(6, 0, {})));
  EXPECT_FALSE(fd::is_plain_causal(m.clone()));  // a hook's replacement
  at::Tensor with_past = fd::allowed_mask({}, 1, 6, 2, cpu);
  EXPECT_FALSE(fd::is_plain_causal(with_past));
  at::Tensor padded = fd::allowed_mask(at::ones({1, 6}, at::kBool), 1, 6, 0, cpu);
  EXPECT_FALSE(fd::is_plain_causal(padded));
  at::Tensor again = fd::allowed_mask({}, 1, 6, 0, cpu);
  EXPECT_TRUE(fd::is_plain_causal(again));
  again.select(-1, 0).fill_(false);  // edited in place by a hook
  EXPECT_FALSE(fd::is_plain_causal(again));
  EXPECT_FALSE(fd::is_plain_causal(at::Tensor()));
}

// ---------------------------------------------------------------------------
// Whole models: unhooked path vs eager path.

// The fixture model with its queries and keys scaled by `factor` (scores by
// factor^2), so attention is peaked: the fixtures' random init gives nearly
// uniform probabilities, under which masks and blocks hardly matter.
std::shared_ptr<CausalLM> sharpened(const std::string& name, at::ScalarType dtype = at::kFloat, double factor = 4) {
  auto model = load_pretrained(models_test::model_dir(name), dtype);
  at::NoGradGuard g;
  const int64_t c = model->config().hidden_size, d = model->config().head_dim;
  for (auto& p : model->named_parameters()) {
    const std::string& n = p.key();
    at::Tensor w = p.value();
    auto has = [&](const char* part) { return n.find(part) != std::string::npos; };
    if (has("q_proj.") || has("k_proj.")) {
      w.mul_(factor);
    } else if (has("c_attn.")) {  // GPT-2 Conv1D, outputs [q | k | v] along the last dim
      w.narrow(-1, 0, 2 * c).mul_(factor);
    } else if (has("query_key_value.")) {  // GPT-NeoX, outputs per head [q | k | v] along dim 0
      for (int64_t h = 0; h < c / d; ++h) w.narrow(0, h * 3 * d, 2 * d).mul_(factor);
    }
  }
  return model;
}

std::vector<std::shared_ptr<Module>> attention_modules(CausalLM& model) {
  std::vector<std::shared_ptr<Module>> out;
  for (auto& [name, m] : model.named_flex_modules())
    for (auto& [child, unused] : m->named_flex_children())
      if (child == "hook_attn_probs") out.push_back(m);
  return out;
}

// One model call's outputs: logits, each attention module's output and the
// path its attend() took, and (hooked) each layer's probabilities.
struct Outputs {
  at::Tensor logits;
  std::vector<at::Tensor> attn_out, probs;
  std::vector<AttendTrace> traces;
};

constexpr int64_t kVocab = 256;  // every fixture model's

// Runs `steps` (one LMInputs each; they share one fresh KV cache when more than
// one). hooked: an identity hook on every hook_attn_probs (forces eager).
std::vector<Outputs> run(CausalLM& model, const std::vector<LMInputs>& steps, bool hooked) {
  std::vector<Outputs> outs(steps.size());
  size_t step = 0;
  std::vector<HookHandle> handles;
  for (auto& attn : attention_modules(model)) {
    handles.push_back(attn->register_forward_hook([&](Module&, const Inputs&, Value& out) {
      outs[step].attn_out.push_back(out.isTuple() ? out.toTupleRef().elements()[0].toTensor() : out.toTensor());
      outs[step].traces.push_back(fd::last_attend_trace());
    }));
    if (hooked) {
      auto point = attn->get_submodule("hook_attn_probs");
      handles.push_back(point->register_forward_hook(
          [&](Module&, const Inputs&, Value& out) { outs[step].probs.push_back(out.toTensor()); }));
    }
  }
  at::NoGradGuard g;
  auto cache = steps.size() > 1 ? c10::make_intrusive<KVCache>() : c10::intrusive_ptr<KVCache>();
  for (; step < steps.size(); ++step) {
    LMInputs in = steps[step];
    in.past_key_values = cache;
    outs[step].logits = model.run(in).logits;
  }
  for (auto& hd : handles) hd.remove();
  return outs;
}

at::Tensor random_ids(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  at::manual_seed(seed);
  return at::randint(1, vocab, {b, t}, at::kLong);
}

// Row 0 of `ids` behind `pads` padding tokens on the left; mask and positions as generate() makes them.
LMInputs left_padded(at::Tensor ids, int64_t pads) {
  LMInputs in;
  at::Tensor mask = at::ones_like(ids);
  mask.select(0, 0).narrow(0, 0, pads).fill_(0);
  ids.select(0, 0).narrow(0, 0, pads).fill_(0);
  in.input_ids = ids;
  in.attention_mask = mask;
  in.position_ids = (mask.cumsum(-1) - 1).masked_fill(mask.eq(0), 1);
  return in;
}

// Splits one left-padded call into a prefill of `first` tokens and then steps of the given lengths.
std::vector<LMInputs> cached_steps(const LMInputs& whole, int64_t first, const std::vector<int64_t>& lengths) {
  std::vector<LMInputs> steps;
  int64_t start = 0;
  std::vector<int64_t> all = {first};
  all.insert(all.end(), lengths.begin(), lengths.end());
  for (int64_t len : all) {
    LMInputs in;
    in.input_ids = whole.input_ids.narrow(1, start, len);
    if (whole.attention_mask.defined()) {
      in.attention_mask = whole.attention_mask.narrow(1, 0, start + len);
      in.position_ids = whole.position_ids.narrow(1, start, len);
    }
    steps.push_back(in);
    start += len;
  }
  return steps;
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// fast (unhooked, float32) against eager (hooked, float32) and ref (hooked,
// float64: Transformers' arithmetic without float32's rounding). Float32
// itself is only ~1e-5 accurate here, so: fast within 1e-5 of the largest
// |value| of eager, and no further from float64 than eager is (twice, plus
// 2e-6 of the largest value: eager's distance is one sample of float32's
// rounding, and it moves by 1.5x with the summation order of the
// projections alone, e.g. 5.8e-6 vs 3.7e-6 at one step when the decode
// GEMV replaced MKL's, while the fused path stayed at 1.1e-5).
//
// The float64 model's softmax runs in float32 (upcast, as in Transformers),
// where a left-padding query's masked scores (float64's lowest) become -inf:
// NaN, which spreads over that batch entry. The float64 comparison keeps to
// the batch entries it computes.
void expect_same(const at::Tensor& fast, const at::Tensor& eager, const at::Tensor& ref, const std::string& what) {
  const at::Tensor rows = at::nonzero(ref.isfinite().flatten(1).all(1)).flatten();
  ASSERT_GT(rows.numel(), 0) << what;
  const at::Tensor f = fast.index_select(0, rows), e = eager.index_select(0, rows), r = ref.index_select(0, rows);
  const double scale = r.abs().max().item<double>();
  EXPECT_LE(max_abs_diff(fast, eager), 1e-5 * scale) << what << ": unhooked vs hooked, largest |value| " << scale;
  EXPECT_LE(max_abs_diff(f, r), 2 * max_abs_diff(e, r) + 2e-6 * scale)
      << what << ": unhooked vs float64 (hooked float32 is " << max_abs_diff(e, r) << " away)";
}

// The scenario's steps run unhooked, hooked, and hooked in float64; each
// step's logits and attention outputs compared. The unhooked path must be the
// one this libtorch offers (the decode kernel for one query per row), and the
// first step's prefill must split into blocks.
void expect_fast_equals_eager(const std::string& name, const std::string& scenario,
                              const std::vector<LMInputs>& steps) {
  auto model = sharpened(name);
  const bool softcap = model->config().attn_logit_softcapping > 0;
  const auto fast = run(*model, steps, false);
  const auto eager = run(*model, steps, true);
  const auto ref = run(*sharpened(name, at::kDouble), steps, true);
  const std::string what = name + ", " + scenario;
  double sharpest = 0;
  int64_t past = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::string at_step = what + ", step " + std::to_string(i);
    expect_same(fast[i].logits, eager[i].logits, ref[i].logits, at_step + ": logits");
    ASSERT_EQ(fast[i].attn_out.size(), eager[i].attn_out.size()) << at_step;
    ASSERT_EQ(eager[i].probs.size(), eager[i].attn_out.size()) << at_step;
    for (size_t l = 0; l < fast[i].attn_out.size(); ++l) {
      const std::string layer = at_step + ", layer " + std::to_string(l);
      expect_same(fast[i].attn_out[l], eager[i].attn_out[l], ref[i].attn_out[l], layer + ": attention output");
      const AttendTrace& tr = fast[i].traces[l];
      // One query per row (a cached step) takes the decode kernel, reading grouped heads in place.
      const int64_t t_step = steps[i].input_ids.size(1);
      const auto expected_path = softcap ? AttendTrace::Path::Chunked
                                         : t_step == 1 ? AttendTrace::Path::Decode : AttendTrace::Path::Fused;
      EXPECT_EQ(tr.path, expected_path) << layer;
      if (tr.path == AttendTrace::Path::Chunked && i == 0) {
        EXPECT_GT(tr.blocks, 2) << layer;
      }
      EXPECT_EQ(eager[i].traces[l].path, AttendTrace::Path::Eager) << layer;
      const at::Tensor& p = eager[i].probs[l];
      const int64_t b = steps[i].input_ids.size(0), t = steps[i].input_ids.size(1);
      EXPECT_EQ(p.sizes(), (at::IntArrayRef{b, model->config().num_attention_heads, t, past + t})) << layer;
      sharpest = std::max(sharpest, p.select(2, t - 1).max().item<double>());
    }
    past += steps[i].input_ids.size(1);
  }
  // The comparison means something only if attention is far from uniform:
  // the last query sees at least 4 keys (the window), yet puts over half its
  // weight on one.
  EXPECT_GT(sharpest, 0.5) << what;
}

const std::vector<std::string> kModels = {"llama", "mistral", "gemma2", "gpt2", "gpt-neox"};

TEST(FastAttention, PrefillInBlocksEqualsEager) {
  BlockBudget budget(2 * 4 * 40 * 4 * 3);  // 3 query rows per block at B=2, H=4, S=40: 14 blocks
  for (const auto& name : kModels) {
    LMInputs in;
    in.input_ids = random_ids(2, 40, kVocab, 7);
    expect_fast_equals_eager(name, "prefill T=40", {in});
  }
}

TEST(FastAttention, LeftPaddedBatchEqualsEager) {
  BlockBudget budget(2 * 4 * 40 * 4 * 3);
  for (const auto& name : kModels) {
    // Every position is compared, the padding ones too: a query that sees no
    // key averages all values on both paths.
    expect_fast_equals_eager(name, "left padding", {left_padded(random_ids(2, 40, kVocab, 8), 7)});
  }
}

TEST(FastAttention, CachedDecodingEqualsEager) {
  BlockBudget budget(2 * 4 * 30 * 4 * 4);  // the 30-token prefill in 8 blocks
  const at::Tensor ids = random_ids(2, 40, kVocab, 9);
  LMInputs plain;
  plain.input_ids = ids;
  for (const auto& name : kModels) {
    // Prefill 30, one token, a 5-token chunk after the past (causal offset), one token.
    expect_fast_equals_eager(name, "cached", cached_steps(plain, 30, {1, 5, 1}));
    expect_fast_equals_eager(name, "cached, left padding", cached_steps(left_padded(ids.clone(), 5), 30, {1, 5, 1}));
  }
}

TEST(FastAttention, UnhookedRunsMatchGoldenLogits) {
  // The fast path against Transformers' own numbers (no hook anywhere).
  at::NoGradGuard g;
  for (const auto& name : kModels) {
    auto model = load_pretrained(models_test::model_dir(name), at::kFloat);
    EXPECT_TRUE(close(model->logits(models_test::golden_inputs()), models_test::golden_tensors(name)->get("logits"),
                      name + " logits"));
    EXPECT_NE(fd::last_attend_trace().path, AttendTrace::Path::Eager) << name;
  }
}

// ---------------------------------------------------------------------------
// Hooks on the probabilities.

TEST(FastAttention, HookedProbabilitiesAreMaterializedAndEditsFlowOn) {
  for (const std::string name : {"llama", "gpt2"}) {
    auto model = sharpened(name);
    auto attn = attention_modules(*model).at(0);
    const at::Tensor ids = random_ids(2, 12, model->config().vocab_size, 10);
    at::Tensor seen, out;
    AttendTrace tr;
    auto h1 = attn->get_submodule("hook_attn_probs")->register_forward_hook([&](Module&, const Inputs&, Value& v) {
      seen = v.toTensor();
      v = at::zeros_like(seen);  // no attention at all: the heads output 0
    });
    auto h2 = attn->register_forward_hook([&](Module&, const Inputs&, Value& v) {
      out = v.toTupleRef().elements()[0].toTensor();
      tr = fd::last_attend_trace();
    });
    at::NoGradGuard g;
    const at::Tensor edited = model->logits(ids);
    h1.remove();
    h2.remove();
    EXPECT_EQ(tr.path, AttendTrace::Path::Eager) << name;
    ASSERT_TRUE(seen.defined()) << name;
    EXPECT_EQ(seen.sizes(), (at::IntArrayRef{2, 4, 12, 12})) << name;
    // Each row a distribution over the keys it may see (causal).
    EXPECT_TRUE(close(seen.sum(-1), at::ones({2, 4, 12}), name + " rows sum to 1"));
    EXPECT_EQ(seen.triu(1).abs().max().item<float>(), 0.0f) << name;
    // Zero probabilities: the output projection sees zeros, so the attention
    // module returns its bias (GPT-2's c_proj) or zero (Llama, no bias).
    at::Tensor bias = name == "gpt2" ? get_module_tensor(*model, "transformer.h.0.attn.c_proj.bias")
                                     : at::zeros({model->config().hidden_size});
    EXPECT_TRUE(close(out, bias.expand_as(out), name + " attention output with zeroed probabilities", 1e-6, 0));
    EXPECT_GT((edited - model->logits(ids)).abs().max().item<double>(), 1e-3) << name;
  }
}

TEST(FastAttention, Gpt2AttnDropoutHookOrTrainingDropoutTakesTheEagerPath) {
  auto model = sharpened("gpt2");
  auto attn = std::dynamic_pointer_cast<GPT2Attention>(attention_modules(*model).at(0));
  ASSERT_TRUE(attn);
  const at::Tensor ids = random_ids(1, 6, model->config().vocab_size, 11);
  AttendTrace tr;
  at::Tensor seen;
  auto h = attn->register_forward_hook([&](Module&, const Inputs&, Value&) { tr = fd::last_attend_trace(); });
  {
    // A hook on attn_dropout sees the probabilities, as in Transformers.
    auto hd =
        attn->attn_dropout->register_forward_hook([&](Module&, const Inputs& in, Value&) { seen = in.tensor(0); });
    at::NoGradGuard g;
    model->logits(ids);
    hd.remove();
    EXPECT_EQ(tr.path, AttendTrace::Path::Eager);
    ASSERT_TRUE(seen.defined());
    EXPECT_EQ(seen.sizes(), (at::IntArrayRef{1, 4, 6, 6}));
  }
  {
    at::NoGradGuard g;
    model->train();  // attn_pdrop 0.1
    model->logits(ids);
    model->eval();
    EXPECT_EQ(tr.path, AttendTrace::Path::Eager);
    model->logits(ids);
    EXPECT_NE(tr.path, AttendTrace::Path::Eager);
  }
  h.remove();
}

// ---------------------------------------------------------------------------
// A long context.

// Peak resident memory since the last reset_peak(), in bytes (Linux: VmHWM,
// reset by writing 5 to /proc/self/clear_refs). -1 where unsupported.
int64_t status_kib(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  return -1;
}
bool reset_peak() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}
// Growth of the peak resident memory over the current size while `fn` runs, in MiB; -1 where unmeasurable.
double peak_growth_mib(const std::function<void()>& fn) {
  if (!reset_peak()) return -1;
  const int64_t before = status_kib("VmRSS");
  if (before < 0 || status_kib("VmHWM") > before + 1024) return -1;  // the reset did not take
  fn();
  return static_cast<double>(status_kib("VmHWM") - before) / 1024.0;
}

TEST(FastAttention, LongContextNeverHoldsTheWholeProbabilities) {
  // Llama fixture (4 heads) stretched to 4096 positions: at T = S = 4096 one
  // layer's probabilities [1, 4, 4096, 4096] in float32 are 256 MiB.
  auto cfg_json = models_test::read_json(models_test::model_dir("llama") + "/config.json");
  cfg_json["max_position_embeddings"] = 4096;
  auto model = build_causal_lm(parse_config(cfg_json, "llama-4096"));
  load_weights(*model, models_test::model_dir("llama") + "/model.safetensors");
  const double full_mib = 4.0 * 4096 * 4096 * 4 / (1 << 20);
  const at::Tensor ids = random_ids(1, 4096, kVocab, 12);

  std::vector<AttendTrace> traces;
  std::vector<HookHandle> hs;
  for (auto& attn : attention_modules(*model))
    hs.push_back(attn->register_forward_hook(
        [&](Module&, const Inputs&, Value&) { traces.push_back(fd::last_attend_trace()); }));
  at::Tensor fast_logits;
  const double fast_mib = peak_growth_mib([&] {
    at::NoGradGuard g;
    fast_logits = model->logits(ids);
  });
  if (!fast_logits.defined()) {  // memory not measurable here: run it anyway
    at::NoGradGuard g;
    fast_logits = model->logits(ids);
  }
  ASSERT_EQ(traces.size(), 2u);
  for (const auto& tr : traces) {
    EXPECT_NE(tr.path, AttendTrace::Path::Eager);
    if (tr.path == AttendTrace::Path::Chunked) {
      EXPECT_EQ(tr.blocks, 4);  // 1024 queries per 64 MiB block
      EXPECT_LE(tr.largest_block_bytes, fd::attention_block_budget());
    } else {
      EXPECT_TRUE(tr.causal_kernel);  // no padding, no past: the mask-free causal kernel
    }
  }
  EXPECT_EQ(fast_logits.sizes(), (at::IntArrayRef{1, 4096, kVocab}));
  EXPECT_FALSE(fast_logits.isnan().any().item<bool>());

  // The causal prefix property, checked independently of the path: the first
  // 32 positions' logits are those of the 32-token prompt alone.
  {
    at::NoGradGuard g;
    EXPECT_TRUE(close(fast_logits.narrow(1, 0, 32), model->logits(ids.narrow(1, 0, 32)), "prefix logits", 1e-5, 1e-4));
  }
  if (fast_mib < 0) {
    GTEST_SKIP() << "peak resident memory cannot be reset here (/proc/self/clear_refs); paths and blocks checked";
  }
  // A [1, 4, 4096, 4096] float32 tensor alone would take full_mib.
  EXPECT_LT(fast_mib, full_mib) << "the unhooked forward's peak grew by " << fast_mib << " MiB";
  // The same measurement sees the eager path's probabilities.
  auto point = attention_modules(*model).at(0)->get_submodule("hook_attn_probs");
  hs.push_back(point->register_forward_hook([](Module&, const Inputs&, Value&) {}));
  const double eager_mib = peak_growth_mib([&] {
    at::NoGradGuard g;
    model->logits(ids);
  });
  EXPECT_GE(eager_mib, full_mib) << "hooked: the probabilities are materialized";
  std::cout << "peak resident growth at T = 4096: unhooked " << fast_mib << " MiB, hooked layer 0 " << eager_mib
            << " MiB (probabilities: " << full_mib << " MiB)\n";
  for (auto& h : hs) h.remove();
}

}  // namespace
