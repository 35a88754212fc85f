// Tests of the LibTorch adapter (issue 6): the tensor concept over at::Tensor,
// the capture object (rows, host moments, device moments), the manifest
// checks, and the device Gram plasticity — each against a reference computed
// directly from the same tensors with plain indexing.
//
// Groups (Catch tags = CTest names torch.<tag>): [adapter] [capture]
// [device_moments] [plasticity] [errors] [manifest]; [cuda] repeats the
// device properties on a CUDA device (torch.cuda, skipped without one).
// LibTorch first: its logging header (glog) defines CHECK, which Catch must
// own in this file.
#include <qkgeom/adapters/torch.hpp>
#include <qkgeom/adapters/torch_capture.hpp>
#include <qkgeom/adapters/torch_plasticity.hpp>
#include <qkgeom/geometry/householder.hpp>
#include <qkgeom/plasticity/attention_plasticity.hpp>
#include <qkgeom/stats/moments.hpp>

#include <torch/torch.h>
#undef CHECK

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#ifndef QKGEOM_HAS_TORCH
#error "the LibTorch adapter is not active although <torch/torch.h> is on the include path"
#endif

namespace {

using Catch::Matchers::Contains;
using qkgeom::kind;

std::string error_of(std::function<void()> const& f) {
    try {
        f();
    } catch (std::exception const& e) {
        return e.what();
    }
    return "<no exception>";
}

/// Element (i, j) of a rank-2 tensor as double, by plain indexing of a
/// contiguous f64 copy (the reference for every reader test).
double ref_at(at::Tensor const& t, std::int64_t i, std::int64_t j) {
    return t.to(at::kCPU).to(at::kDouble).contiguous()[i][j].item<double>();
}

/// The reader equals plain indexing, element by element, exactly.
void check_reader_exact(at::Tensor const& t) {
    auto const r = qkgeom::as_matrix(t);
    REQUIRE(r.rows() == t.size(0));
    REQUIRE(r.cols() == t.size(1));
    at::Tensor const ref = t.to(at::kCPU).to(at::kDouble).contiguous();
    auto const* p = ref.data_ptr<double>();
    std::vector<double> row(static_cast<std::size_t>(r.cols()));
    for (qkgeom::index_t i = 0; i < r.rows(); ++i) {
        r.read_row(i, row.data());
        for (qkgeom::index_t j = 0; j < r.cols(); ++j) {
            REQUIRE(row[static_cast<std::size_t>(j)] == p[i * r.cols() + j]);
            REQUIRE(r(i, j) == p[i * r.cols() + j]);
        }
    }
}

constexpr std::int64_t kB = 2, kT = 16, kD = 8;

qkgeom::io::manifest test_manifest(qkgeom::bucket_spec buckets = {qkgeom::bucket_scheme::uniform, 4, 1.0},
                                   std::int64_t head_count = 100, std::int64_t hq = 4, std::int64_t hkv = 2) {
    qkgeom::rope_spec rope;
    rope.pairing = qkgeom::rope_pairing::rotate_half;
    rope.rotary_dim = kD;
    rope.theta = 10000.0;
    return qkgeom::make_capture_manifest("tiny-llama", qkgeom::uniform_layout(2, hq, hkv, kD), rope,
                                         qkgeom::capture_sampler{buckets, 7}, qkgeom::io::head_sampling{head_count, 3},
                                         8 * kT);
}

/// One step of inputs: queries/keys [B, H, T, D] (contiguous), positions [B, T],
/// example ids [B].
struct step_inputs {
    at::Tensor q, k, pos, ex;
};

step_inputs make_step(at::ScalarType dt, std::int64_t step, at::Device dev = at::kCPU, std::int64_t hq = 4,
                      std::int64_t hkv = 2) {
    step_inputs s;
    auto const o = at::TensorOptions().dtype(at::kDouble);
    s.q = (at::randn({kB, hq, kT, kD}, o) * 3.0 + 1.0).to(dt).to(dev);
    s.k = (at::randn({kB, hkv, kT, kD}, o) * 2.0 - 0.5).to(dt).to(dev);
    // Chunked sequences with a padding offset on batch row 1: positions are
    // never arange(T).
    s.pos = at::arange(kT, at::TensorOptions().dtype(at::kLong)).unsqueeze(0).repeat({kB, 1}) + step * kT;
    s.pos[1] += 5;
    s.ex = at::tensor({std::int64_t{100}, std::int64_t{101}}, at::TensorOptions().dtype(at::kLong));
    return s;
}

/// The reference: the rows the capture must store for (layer, kind, head)
/// after the given steps, computed by plain indexing of the [B, H, T, D]
/// tensors with the method §0.1 sampler.
struct ref_rows {
    std::vector<double> values;
    std::vector<std::int64_t> position, bucket, example_id;
};

ref_rows reference_rows(qkgeom::capture_sampler const& sampler, std::vector<step_inputs> const& steps,
                        std::int64_t layer, kind k, std::int64_t head) {
    ref_rows out;
    for (auto const& s : steps) {
        at::Tensor const x = (k == kind::query ? s.q : s.k).to(at::kCPU).to(at::kDouble).contiguous();
        at::Tensor const pos = s.pos.to(at::kCPU).contiguous(), ex = s.ex.to(at::kCPU).contiguous();
        std::vector<std::int64_t> fpos, fex;
        for (std::int64_t b = 0; b < kB; ++b)
            for (std::int64_t t = 0; t < kT; ++t) {
                fpos.push_back(pos[b][t].item<std::int64_t>());
                fex.push_back(ex[b].item<std::int64_t>());
            }
        for (auto i : sampler.select(fpos, fex, layer, k)) {
            std::int64_t const b = i / kT, t = i % kT;
            for (std::int64_t j = 0; j < kD; ++j) out.values.push_back(x[b][head][t][j].item<double>());
            out.position.push_back(fpos[static_cast<std::size_t>(i)]);
            out.bucket.push_back(qkgeom::bucket_of(sampler.buckets, fpos[static_cast<std::size_t>(i)]));
            out.example_id.push_back(fex[static_cast<std::size_t>(i)]);
        }
    }
    return out;
}

template <class Scalar>
void check_store_equals_reference(qkgeom::torch_capture<Scalar>& cap, std::vector<step_inputs> const& steps) {
    auto const& store = cap.store();
    std::int64_t total = 0;
    for (auto const& h : cap.heads())
        for (auto [k, head] : {std::pair{kind::query, h.q_head}, std::pair{kind::key, h.k_head}}) {
            auto const ref = reference_rows(cap.sampler(), steps, h.layer, k, head);
            auto const& got = store.rows(h.layer, k, head);
            REQUIRE(got.position.values() == ref.position);
            REQUIRE(got.bucket.values() == ref.bucket);
            REQUIRE(got.example_id.values() == ref.example_id);
            REQUIRE(got.values.size() == ref.values.size());
            for (std::size_t i = 0; i < ref.values.size(); ++i)
                REQUIRE(static_cast<double>(got.values[i]) == ref.values[i]);  // exact (bf16/f16/f32 -> float)
            total += got.rows();
        }
    REQUIRE(total > 0);
}

/// Relative comparison of two moments to `tol` (scale = the largest entry).
void check_moments_close(qkgeom::moments const& a, qkgeom::moments const& b, double tol) {
    REQUIRE(a.n == b.n);
    REQUIRE(a.t_min == b.t_min);
    REQUIRE(a.t_max == b.t_max);
    auto close = [tol](double x, double y, double scale) { return std::abs(x - y) <= tol * std::max(1.0, scale); };
    REQUIRE(close(a.mean_t, b.mean_t, std::abs(b.mean_t)));
    REQUIRE(close(a.m2_t, b.m2_t, std::abs(b.m2_t)));
    double const sx = b.mean_x.cwiseAbs().maxCoeff(), sxt = b.c_xt.cwiseAbs().maxCoeff(),
                 sxx = b.c_xx.cwiseAbs().maxCoeff();
    for (qkgeom::index_t i = 0; i < b.dim(); ++i) {
        REQUIRE(close(a.mean_x(i), b.mean_x(i), sx));
        REQUIRE(close(a.c_xt(i), b.c_xt(i), sxt));
        for (qkgeom::index_t j = 0; j < b.dim(); ++j) REQUIRE(close(a.c_xx(i, j), b.c_xx(i, j), sxx));
    }
}

void check_head_moments_close(qkgeom::head_moments const& a, qkgeom::head_moments const& b, double tol) {
    REQUIRE(a.id == b.id);
    for (kind k : {kind::query, kind::key}) {
        REQUIRE(a[k].buckets.size() == b[k].buckets.size());
        for (auto const& [bucket, mb] : b[k].buckets) {
            REQUIRE(a[k].buckets.count(bucket) == 1);
            check_moments_close(a[k].buckets.at(bucket), mb, tol);
        }
    }
}

/// Capture `steps` of both layers; `bthd` passes the tensors as permuted
/// (non-contiguous) [B, T, H, D] views.
template <class Scalar = float>
void run_steps(qkgeom::torch_capture<Scalar>& cap, std::vector<step_inputs> const& steps, bool bthd) {
    for (auto const& s : steps)
        for (std::int64_t layer = 0; layer < 2; ++layer) {
            at::Tensor const q = bthd ? s.q.transpose(1, 2) : s.q;
            at::Tensor const k = bthd ? s.k.transpose(1, 2) : s.k;
            cap(layer, q, k, s.pos, s.ex, std::nullopt);
        }
}

/// Rows, host moments and device moments on one device, against the references.
void check_capture_on(at::Device dev) {
    for (auto dt : {at::kBFloat16, at::kHalf, at::kFloat}) {
        at::manual_seed(11);
        std::vector<step_inputs> steps{make_step(dt, 0, dev), make_step(dt, 1, dev)};
        for (bool bthd : {false, true}) {
            qkgeom::torch_capture_options o;
            o.layout = bthd ? qkgeom::torch_layout::bthd : qkgeom::torch_layout::bhtd;
            qkgeom::torch_capture<float> cap(test_manifest(), o);
            run_steps(cap, steps, bthd);
            check_store_equals_reference(cap, steps);
        }
    }
    // f64 rows into a double store: exact as well.
    at::manual_seed(12);
    std::vector<step_inputs> steps{make_step(at::kDouble, 0, dev), make_step(at::kDouble, 1, dev)};
    qkgeom::torch_capture<double> cap(test_manifest());
    run_steps(cap, steps, false);
    check_store_equals_reference(cap, steps);

    // Device moments equal the host moments of the same rows (1e-12, f64).
    for (auto spec : {qkgeom::bucket_spec{qkgeom::bucket_scheme::all, 4, 1.0},
                      qkgeom::bucket_spec{qkgeom::bucket_scheme::uniform, 2, 1.0}}) {
        auto const m = test_manifest(spec);
        qkgeom::torch_capture_options oh, od;
        oh.mode = qkgeom::torch_capture_mode::moments;
        od.mode = qkgeom::torch_capture_mode::device_moments;
        od.layout = qkgeom::torch_layout::bthd;
        qkgeom::torch_capture<double> host(m, oh), device(m, od);
        run_steps(host, steps, false);
        run_steps(device, steps, true);
        for (auto const& h : host.heads()) check_head_moments_close(device.moments(h), host.moments(h), 1e-12);
    }
}

}  // namespace

// ---------------------------------------------------------------------------
// [adapter] the tensor concept over at::Tensor
// ---------------------------------------------------------------------------

TEST_CASE("rank-2 tensors of every dtype are read exactly", "[adapter]") {
    at::manual_seed(1);
    at::Tensor const base = at::randn({7, 5}, at::TensorOptions().dtype(at::kDouble)) * 100.0;
    for (auto dt : {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16}) {
        at::Tensor const t = base.to(dt);
        check_reader_exact(t);
        auto const r = qkgeom::as_matrix(t);
        CHECK(r.host_tensor().data_ptr() == t.data_ptr());  // CPU: read in place, never copied
    }
    CHECK(qkgeom::as_matrix(base.to(at::kBFloat16)).dtype() == "bf16");
    CHECK(qkgeom::as_matrix(base.to(at::kHalf)).dtype() == "f16");
    CHECK(qkgeom::as_matrix(base.to(at::kFloat)).dtype() == "f32");
}

TEST_CASE("16-bit elements widen bit-exactly (subnormals, extremes)", "[adapter]") {
    std::vector<float> vals{0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 5.960464477539063e-08f, 6.097555160522461e-05f,
                            3.3895313892515355e+38f, 1.1754943508222875e-38f, -1.0e-3f};
    at::Tensor const f = at::tensor(vals).reshape({2, 5});
    for (auto dt : {at::kHalf, at::kBFloat16}) {
        at::Tensor const t = f.to(dt);
        auto const r = qkgeom::as_matrix(t);
        for (std::int64_t i = 0; i < 2; ++i)
            for (std::int64_t j = 0; j < 5; ++j) {
                auto const expect = static_cast<double>(t[i][j].item<float>());  // torch's own widening
                if (std::isfinite(expect)) CHECK(r(i, j) == expect);
            }
    }
}

TEST_CASE("strided and non-contiguous tensors are read in place", "[adapter]") {
    at::manual_seed(2);
    at::Tensor const big = at::randn({9, 12}, at::TensorOptions().dtype(at::kFloat));
    at::Tensor const tr = big.t();                                    // transposed view
    at::Tensor const sl = big.narrow(0, 2, 5).narrow(1, 3, 6);        // slice
    at::Tensor const st = big.slice(0, 0, 9, 2).slice(1, 1, 12, 3);   // stepped slice
    at::Tensor const ex = big[4].unsqueeze(0).expand({6, 12});        // zero row stride
    for (auto const& t : {tr, sl, st, ex}) {
        REQUIRE_FALSE((t.is_contiguous() && t.data_ptr() == big.data_ptr() && t.sizes() == big.sizes()));
        check_reader_exact(t);
        CHECK(qkgeom::as_matrix(t).host_tensor().data_ptr() == t.data_ptr());
    }
    for (auto dt : {at::kHalf, at::kBFloat16}) check_reader_exact(big.to(dt).t());
}

TEST_CASE("head_rows: per-head [T, D] views of both rank-4 layouts", "[adapter]") {
    at::manual_seed(3);
    at::Tensor const bhtd = at::randn({2, 3, 5, 4}, at::TensorOptions().dtype(at::kBFloat16));
    at::Tensor const bthd_view = bhtd.transpose(1, 2);             // strided [B, T, H, D]
    at::Tensor const bthd_dense = bhtd.transpose(1, 2).contiguous();  // contiguous [B, T, H, D]
    for (std::int64_t b = 0; b < 2; ++b)
        for (std::int64_t h = 0; h < 3; ++h) {
            at::Tensor const expect = bhtd[b][h];
            for (auto const& [x, lay] : {std::pair{bhtd, qkgeom::torch_layout::bhtd},
                                         std::pair{bthd_view, qkgeom::torch_layout::bthd},
                                         std::pair{bthd_dense, qkgeom::torch_layout::bthd}}) {
                at::Tensor const rows = qkgeom::head_rows(x, lay, b, h);
                REQUIRE(rows.sizes() == expect.sizes());
                CHECK(rows.is_same_size(expect));
                CHECK(at::equal(rows, expect));
                CHECK(rows.storage().data() == x.storage().data());  // a view, never a copy
                check_reader_exact(rows);
            }
        }
    auto const s = qkgeom::attention_shape_of(bthd_view, qkgeom::torch_layout::bthd);
    CHECK((s.batch == 2 && s.heads == 3 && s.tokens == 5 && s.head_dim == 4));
}

TEST_CASE("integer tensors are index vectors, the core accepts tensors", "[adapter]") {
    at::Tensor const p64 = at::arange(20, at::TensorOptions().dtype(at::kLong)).slice(0, 1, 20, 3);
    for (auto dt : {at::kLong, at::kInt, at::kShort, at::kChar, at::kByte}) {
        at::Tensor const p = p64.to(dt);
        auto const r = qkgeom::as_indices(p);
        REQUIRE(r.size() == p.size(0));
        for (qkgeom::index_t i = 0; i < r.size(); ++i) CHECK(r[i] == 1 + 3 * i);
    }
    // moments from tensors == moments from plain vectors of the same values
    at::manual_seed(4);
    at::Tensor const x = at::randn({6, 30}, at::TensorOptions().dtype(at::kBFloat16)).t();  // [30, 6], strided
    at::Tensor const t = at::arange(30, at::TensorOptions().dtype(at::kInt)) * 2 + 3;
    qkgeom::moments a(6), b(6);
    qkgeom::add_rows(a, x, t);
    Eigen::MatrixXd xe(30, 6);
    std::vector<std::int64_t> te;
    for (std::int64_t i = 0; i < 30; ++i) {
        for (std::int64_t j = 0; j < 6; ++j) xe(i, j) = ref_at(x, i, j);
        te.push_back(2 * i + 3);
    }
    qkgeom::add_rows(b, xe, te);
    check_moments_close(a, b, 0.0);
}

// ---------------------------------------------------------------------------
// [errors]
// ---------------------------------------------------------------------------

TEST_CASE("reader errors name the argument and the value", "[errors]") {
    at::Tensor const r3 = at::zeros({2, 3, 4});
    CHECK_THAT(error_of([&] { (void)qkgeom::as_matrix(r3); }),
               Contains("must have rank 2") && Contains("head_rows") && Contains("value 3"));
    CHECK_THAT(error_of([&] { (void)qkgeom::as_matrix(at::zeros({2, 3}, at::TensorOptions().dtype(at::kInt))); }),
               Contains("dtype") && Contains("Int"));
    CHECK_THAT(error_of([&] { (void)qkgeom::as_indices(at::zeros({3})); }), Contains("integer") && Contains("Float"));
    CHECK_THAT(error_of([&] { (void)qkgeom::as_indices(at::zeros({3}, at::TensorOptions().dtype(at::kBool))); }),
               Contains("integer") && Contains("Bool"));
    CHECK_THAT(error_of([&] { (void)qkgeom::as_indices(at::zeros({2, 2}, at::TensorOptions().dtype(at::kLong))); }),
               Contains("rank 1") && Contains("value 2"));
    CHECK_THAT(error_of([&] { (void)qkgeom::as_matrix(at::Tensor()); }), Contains("undefined"));
    CHECK_THAT(error_of([&] { (void)qkgeom::head_rows(at::zeros({2, 3, 4, 5}), qkgeom::torch_layout::bthd, 0, 4); }),
               Contains("head must be in [0, 4)") && Contains("value 4"));
}

TEST_CASE("capture errors: rank, head counts, positions, example ids, window", "[errors]") {
    at::manual_seed(5);
    auto const s = make_step(at::kFloat, 0);
    qkgeom::torch_capture<float> cap(test_manifest());
    auto call = [&](at::Tensor const& q, at::Tensor const& k, at::Tensor const& p, at::Tensor const& e,
                    std::optional<std::int64_t> w = std::nullopt, std::int64_t layer = 0) {
        return error_of([&] { cap(layer, q, k, p, e, w); });
    };
    // wrong rank
    CHECK_THAT(call(s.q[0], s.k, s.pos, s.ex), Contains("queries: must have rank 4") && Contains("value 3"));
    CHECK_THAT(call(s.q, s.k.flatten(2), s.pos, s.ex), Contains("keys: must have rank 4") && Contains("value 3"));
    // Hq not a multiple of Hkv (6 query heads, 4 key heads)
    at::Tensor const q6 = at::randn({kB, 6, kT, kD}), k4 = at::randn({kB, 4, kT, kD});
    CHECK_THAT(call(q6, k4, s.pos, s.ex), Contains("Hq = 6") && Contains("not a multiple of Hkv") && Contains("value 4"));
    // head counts differ from the manifest (8 query heads for a 4-head layer)
    CHECK_THAT(call(at::randn({kB, 8, kT, kD}), s.k, s.pos, s.ex),
               Contains("n_q_heads = 4") && Contains("value 8"));
    CHECK_THAT(call(s.q, at::randn({kB, 4, kT, kD}), s.pos, s.ex), Contains("n_kv_heads = 2") && Contains("value 4"));
    // the layout matters: bhtd tensors read as bthd have T heads
    {
        qkgeom::torch_capture_options o;
        o.layout = qkgeom::torch_layout::bthd;
        qkgeom::torch_capture<float> c2(test_manifest(), o);
        CHECK_THAT(error_of([&] { c2(0, s.q, s.k, s.pos, s.ex, std::nullopt); }), Contains("layout bthd"));
    }
    // positions of the wrong length / shape, negative positions
    CHECK_THAT(call(s.q, s.k, s.pos.narrow(1, 0, kT - 1), s.ex),
               Contains("positions: shape must be [B, T] = [2, 16] or [T] = [16]") && Contains("[2, 15]"));
    CHECK_THAT(call(s.q, s.k, at::arange(kT + 1), s.ex), Contains("positions: shape") && Contains("[17]"));
    CHECK_THAT(call(s.q, s.k, s.pos - 40, s.ex), Contains("negative position at batch 0, token 0") && Contains("value -40"));
    CHECK_THAT(call(s.q, s.k, s.pos + 8 * kT - 10, s.ex),
               Contains("at batch 0, token 10 is beyond the manifest's context_length = 128") && Contains("value 128"));
    CHECK_THAT(call(s.q, s.k, s.pos.to(at::kFloat), s.ex), Contains("positions: dtype must be an integer type"));
    // example ids of the wrong shape
    CHECK_THAT(call(s.q, s.k, s.pos, at::zeros({3}, at::TensorOptions().dtype(at::kLong))),
               Contains("example_ids: shape must be [B] = [2] or [B, T] = [2, 16]") && Contains("[3]"));
    // sliding window / layer / head_dim / dtype mismatches
    CHECK_THAT(call(s.q, s.k, s.pos, s.ex, 64), Contains("sliding_window differs") && Contains("value 64"));
    CHECK_THAT(call(s.q, s.k, s.pos, s.ex, std::nullopt, 2), Contains("layer must be in [0, 2)") && Contains("value 2"));
    CHECK_THAT(call(s.q.narrow(3, 0, 4), s.k.narrow(3, 0, 4), s.pos, s.ex),
               Contains("head_dim differs from the manifest's (8)") && Contains("value 4"));
    CHECK_THAT(call(s.q, s.k.to(at::kHalf), s.pos, s.ex), Contains("keys: dtype differs") && Contains("Half"));
    CHECK_THAT(call(s.q.to(at::kInt), s.k.to(at::kInt), s.pos, s.ex), Contains("queries: dtype must be"));
    CHECK(cap.rows_captured() == 0);  // nothing was captured by a failing call
}

TEST_CASE("device plasticity errors", "[errors]") {
    qkgeom::head_moments hm(3);
    Eigen::MatrixXd q = Eigen::MatrixXd::Random(40, 3);
    std::vector<std::int64_t> t(40), b(40), e(40, 0);
    for (int i = 0; i < 40; ++i) {
        t[static_cast<std::size_t>(i)] = i;
        b[static_cast<std::size_t>(i)] = i / 10;
    }
    hm.add(kind::query, q, t, b);
    auto const model = qkgeom::householder(hm);
    qkgeom::plasticity_options o;
    qkgeom::capture_facts const facts;
    auto keys = [&](at::Tensor x) {
        return qkgeom::token_rows<at::Tensor>{std::move(x), qkgeom::token_positions(t), qkgeom::token_buckets(b),
                                              qkgeom::example_ids(e)};
    };
    CHECK_THAT(error_of([&] { (void)qkgeom::torch_attention_plasticity(model, keys(at::zeros({40, 4})), facts, o); }),
               Contains("head dimension differs") && Contains("value 4"));
    CHECK_THAT(error_of([&] { (void)qkgeom::torch_attention_plasticity(model, keys(at::zeros({40})), facts, o); }),
               Contains("keys: must have rank 2") && Contains("value 1"));
    o.enumeration = qkgeom::enumeration_policy::sampled;
    CHECK_THAT(error_of([&] { (void)qkgeom::torch_attention_plasticity(model, keys(at::zeros({40, 3})), facts, o); }),
               Contains("enumerates every pair"));
    o.enumeration = qkgeom::enumeration_policy::exact;
    at::Tensor bad = at::zeros({40, 3});
    bad[3][1] = std::nan("");
    CHECK_THAT(error_of([&] { (void)qkgeom::torch_attention_plasticity(model, keys(bad), facts, o); }),
               Contains("not finite"));
    // the input limit |x| < 2^128 (method §9.18): finite but beyond it, in a float64 tensor
    at::Tensor big = at::zeros({40, 3}, at::TensorOptions().dtype(at::kDouble));
    big[5][2] = 1e200;
    CHECK_THAT(error_of([&] { (void)qkgeom::torch_attention_plasticity(model, keys(big), facts, o); }),
               Contains("outside the input limit") && Contains("row 5, column 2"));

    // A mislabelled key bucket array: the positions wrapped as buckets. With
    // the capture's scheme in the facts, bucket_of(position) is checked per row
    // and the message names both arrays (row 1: position 1 is bucket 0, not 1).
    at::Tensor const k3 = at::randn({40, 3}, at::TensorOptions().dtype(at::kDouble));
    qkgeom::token_rows<at::Tensor> const mislabelled{k3, qkgeom::token_positions(t), qkgeom::token_buckets(t),
                                                     qkgeom::example_ids(e)};
    qkgeom::capture_facts scheme;
    scheme.buckets = qkgeom::bucket_spec{qkgeom::bucket_scheme::uniform, 10, 1.0};
    CHECK_THROWS_AS(qkgeom::torch_attention_plasticity(model, mislabelled, scheme, o), std::invalid_argument);
    auto const msg = error_of([&] { (void)qkgeom::torch_attention_plasticity(model, mislabelled, scheme, o); });
    CHECK_THAT(msg, Contains("qkgeom::torch_attention_plasticity: keys: bucket does not match position 1 at row 1") &&
                        Contains("(scheme uniform, width 10 gives 0)") && Contains("positions") &&
                        Contains("buckets") && Contains("swapped or mislabelled") && Contains("(value 1)"));
    // The CPU path rejects the same rows with the same words.
    Eigen::MatrixXd k3e(40, 3);
    for (std::int64_t i = 0; i < 40; ++i)
        for (std::int64_t j = 0; j < 3; ++j) k3e(i, j) = k3[i][j].item<double>();
    qkgeom::token_rows<Eigen::MatrixXd> const mislabelled_e{k3e, qkgeom::token_positions(t), qkgeom::token_buckets(t),
                                                            qkgeom::example_ids(e)};
    CHECK_THAT(error_of([&] { (void)qkgeom::attention_plasticity(model, mislabelled_e, scheme, qkgeom::head_id{}, o); }),
               Contains("keys: bucket does not match position 1 at row 1") && Contains("positions and buckets"));
    // The correctly labelled rows pass under the same facts.
    qkgeom::token_rows<at::Tensor> const labelled{k3, qkgeom::token_positions(t), qkgeom::token_buckets(b),
                                                  qkgeom::example_ids(e)};
    CHECK_NOTHROW(qkgeom::torch_attention_plasticity(model, labelled, scheme, o));
    // A length that differs from the rows names the array; a window needs the scheme.
    qkgeom::token_rows<at::Tensor> const short_pos{k3.narrow(0, 0, 39), qkgeom::token_positions(t),
                                                   qkgeom::token_buckets(b), qkgeom::example_ids(e)};
    CHECK_THAT(error_of([&] { (void)qkgeom::torch_attention_plasticity(model, short_pos, facts, o); }),
               Contains("keys: positions: length differs from the 39 rows") && Contains("value 40"));
    qkgeom::capture_facts window_only;
    window_only.sliding_window = 8;
    CHECK_THAT(error_of([&] { (void)qkgeom::torch_attention_plasticity(model, labelled, window_only, o); }),
               Contains("sliding window needs the bucket scheme") && Contains("value 8"));
}

// ---------------------------------------------------------------------------
// [capture]
// ---------------------------------------------------------------------------

TEST_CASE("captured rows equal the rows computed directly (CPU)", "[capture]") { check_capture_on(at::kCPU); }

TEST_CASE("capture: [T] positions, [B, T] example ids, sliced inputs, GQA, head sampling", "[capture]") {
    at::manual_seed(6);
    qkgeom::torch_capture<float> cap(test_manifest({qkgeom::bucket_scheme::log, 2, 2.0}, /*head_count=*/3, /*hq=*/4,
                                                   /*hkv=*/1));
    REQUIRE(cap.heads().size() == 3);
    auto const& sampler = cap.sampler();
    // queries are a slice of a fused qkv projection (non-contiguous, offset storage)
    at::Tensor const qkv = at::randn({kB, kT, 6, kD}, at::TensorOptions().dtype(at::kBFloat16));
    at::Tensor const q = qkv.narrow(2, 0, 4).transpose(1, 2);  // [B, 4, T, D] strided
    at::Tensor const k = qkv.narrow(2, 4, 1).transpose(1, 2);  // [B, 1, T, D] strided
    REQUIRE_FALSE(q.is_contiguous());
    at::Tensor const pos_t = at::arange(kT, at::TensorOptions().dtype(at::kInt)) + 7;  // [T], shared
    at::Tensor ex_bt = at::zeros({kB, kT}, at::TensorOptions().dtype(at::kLong));    // packed: 2 examples per row
    ex_bt.narrow(1, kT / 2, kT / 2).fill_(1);
    ex_bt[1] += 10;
    for (std::int64_t layer = 0; layer < 2; ++layer) cap(layer, q, k, pos_t, ex_bt, std::nullopt);
    step_inputs ref;
    ref.q = q.contiguous();
    ref.k = k.contiguous();
    // the reference flattens [B, T] positions / example ids
    ref.pos = pos_t.to(at::kLong).unsqueeze(0).repeat({kB, 1});
    ref.ex = at::zeros({kB}, at::TensorOptions().dtype(at::kLong));
    auto const& store = cap.store();
    for (auto const& h : cap.heads()) {
        REQUIRE(h.k_head == 0);  // GQA: 4 query heads read key head 0
        for (auto [kd, head] : {std::pair{kind::query, h.q_head}, std::pair{kind::key, h.k_head}}) {
            at::Tensor const x = (kd == kind::query ? ref.q : ref.k).to(at::kDouble);
            std::vector<std::int64_t> fpos, fex;
            for (std::int64_t b = 0; b < kB; ++b)
                for (std::int64_t t = 0; t < kT; ++t) {
                    fpos.push_back(t + 7);
                    fex.push_back(ex_bt[b][t].item<std::int64_t>());
                }
            auto const kept = sampler.select(fpos, fex, h.layer, kd);
            auto const& got = store.rows(h.layer, kd, head);
            REQUIRE(got.rows() == static_cast<std::int64_t>(kept.size()));
            for (std::size_t r = 0; r < kept.size(); ++r) {
                std::int64_t const b = kept[r] / kT, t = kept[r] % kT;
                CHECK(got.position[r] == t + 7);
                CHECK(got.example_id[r] == fex[static_cast<std::size_t>(kept[r])]);
                CHECK(got.bucket[r] == qkgeom::bucket_of(sampler.buckets, t + 7));
                for (std::int64_t j = 0; j < kD; ++j)
                    REQUIRE(static_cast<double>(got.values[r * kD + static_cast<std::size_t>(j)]) ==
                            x[b][head][t][j].item<double>());
            }
        }
    }
    // heads outside the sample are not stored
    std::int64_t stored = 0;
    for (auto const* e : store.entries()) stored += e->k == kind::query ? 1 : 0;
    CHECK(stored == 3);
}

TEST_CASE("host moments equal the moments of the captured rows", "[capture]") {
    at::manual_seed(7);
    std::vector<step_inputs> steps{make_step(at::kBFloat16, 0), make_step(at::kBFloat16, 1)};
    auto const m = test_manifest();
    qkgeom::torch_capture<float> rows(m);
    qkgeom::torch_capture_options o;
    o.mode = qkgeom::torch_capture_mode::moments;
    o.layout = qkgeom::torch_layout::bthd;
    qkgeom::torch_capture<float> mom(m, o);
    run_steps(rows, steps, false);
    run_steps(mom, steps, true);
    auto const& store = rows.store();
    for (auto const& h : rows.heads()) {
        qkgeom::head_moments ref(kD, qkgeom::head_id{h.layer, h.q_head, h.k_head});
        auto const& rq = store.rows(h.layer, kind::query, h.q_head);
        auto const& rk = store.rows(h.layer, kind::key, h.k_head);
        ref.add(kind::query, rq.matrix(), rq.position, rq.bucket);
        ref.add(kind::key, rk.matrix(), rk.position, rk.bucket);
        check_head_moments_close(mom.moments(h), ref, 1e-12);
    }
    CHECK(mom.bytes_to_host() == 0);  // CPU tensors: nothing is copied
    CHECK_THROWS_AS((void)mom.store(), std::logic_error);
    CHECK_THROWS_AS((void)rows.moments(rows.heads()[0]), std::logic_error);
}

// ---------------------------------------------------------------------------
// [device_moments]
// ---------------------------------------------------------------------------

TEST_CASE("device moments equal host moments of the same rows (f64, 1e-12)", "[device_moments]") {
    at::manual_seed(8);
    std::vector<step_inputs> steps;
    for (std::int64_t s = 0; s < 3; ++s) steps.push_back(make_step(at::kDouble, s));
    for (auto spec : {qkgeom::bucket_spec{qkgeom::bucket_scheme::all, 8, 1.0},
                      qkgeom::bucket_spec{qkgeom::bucket_scheme::log, 2, 3.0}}) {
        auto const m = test_manifest(spec);
        qkgeom::torch_capture_options oh, od;
        oh.mode = qkgeom::torch_capture_mode::moments;
        od.mode = qkgeom::torch_capture_mode::device_moments;
        qkgeom::torch_capture<double> host(m, oh), dev(m, od);
        run_steps(host, steps, false);
        run_steps(dev, steps, false);
        auto const a = dev.result(), b = host.result();
        REQUIRE(a.heads.size() == host.heads().size());
        for (std::size_t i = 0; i < a.heads.size(); ++i) check_head_moments_close(a.heads[i], b.heads[i], 1e-12);
    }
}

TEST_CASE("device moments of bf16 rows, shards merge like one capture", "[device_moments]") {
    at::manual_seed(9);
    std::vector<step_inputs> steps;
    for (std::int64_t s = 0; s < 4; ++s) steps.push_back(make_step(at::kBFloat16, s));
    auto const m = test_manifest({qkgeom::bucket_scheme::all, 4, 1.0});
    qkgeom::torch_capture_options od;
    od.mode = qkgeom::torch_capture_mode::device_moments;
    auto od_bthd = od;
    od_bthd.layout = qkgeom::torch_layout::bthd;
    qkgeom::torch_capture<float> whole(m, od), shard_a(m, od), shard_b(m, od_bthd);
    run_steps(whole, steps, false);
    run_steps(shard_a, {steps[0], steps[2]}, false);
    run_steps(shard_b, {steps[1], steps[3]}, true);
    shard_b += shard_a;
    for (auto const& h : whole.heads()) check_head_moments_close(shard_b.moments(h), whole.moments(h), 1e-12);
    // and via capture_moments
    auto r = shard_a.result();
    qkgeom::torch_capture<float> shard_c(m, od);
    run_steps(shard_c, {steps[1], steps[3]}, false);
    r += shard_c.result();
    auto const w = whole.result();
    for (std::size_t i = 0; i < r.heads.size(); ++i) check_head_moments_close(r.heads[i], w.heads[i], 1e-12);
}

// ---------------------------------------------------------------------------
// [manifest]
// ---------------------------------------------------------------------------

TEST_CASE("merging captures or moments with mismatched manifests names the field", "[manifest]") {
    auto const base = test_manifest();
    auto mismatch = [&](std::function<void(qkgeom::io::manifest&)> const& edit) {
        auto m = base;
        edit(m);
        return error_of([&] { qkgeom::io::check_compatible(base, m); });
    };
    CHECK(error_of([&] { qkgeom::io::check_compatible(base, base); }) == "<no exception>");
    CHECK_THAT(mismatch([](auto& m) { m.rope->pairing = qkgeom::rope_pairing::interleaved; }),
               Contains("rope.pairing") && Contains("rotate_half") && Contains("interleaved"));
    CHECK_THAT(mismatch([](auto& m) { m.rope->rotary_dim = 4; }), Contains("rope.rotary_dim"));
    CHECK_THAT(mismatch([](auto& m) { m.rope->theta = 500000.0; }), Contains("rope.theta") && Contains("500000"));
    CHECK_THAT(mismatch([](auto& m) { m.rope->scaling = "llama3"; }), Contains("rope.scaling") && Contains("llama3"));
    CHECK_THAT(mismatch([](auto& m) { m.rope->scaling_factor = 8.0; }), Contains("rope.scaling_factor"));
    CHECK_THAT(mismatch([](auto& m) { m.n_kv_heads[1] = 1; }), Contains("n_kv_heads[1]"));
    CHECK_THAT(mismatch([](auto& m) { m.n_q_heads[0] = 8; }), Contains("n_q_heads[0]"));
    CHECK_THAT(mismatch([](auto& m) { m.sliding_window[0] = 128; }), Contains("sliding_window[0]") && Contains("128"));
    CHECK_THAT(mismatch([](auto& m) { m.buckets.width = 8; }), Contains("buckets.width"));
    CHECK_THAT(mismatch([](auto& m) { m.buckets.scheme = qkgeom::bucket_scheme::log; }), Contains("buckets.scheme"));
    CHECK_THAT(mismatch([](auto& m) { m.buckets.rate = 2.0; }), Contains("buckets.rate"));
    CHECK_THAT(mismatch([](auto& m) { m.seed = 8; }), Contains("capture.seed"));
    CHECK_THAT(mismatch([](auto& m) { m.heads->seed = 99; }), Contains("capture.head_seed"));
    CHECK_THAT(mismatch([](auto& m) { m.heads->count = 2; }), Contains("capture.head_count"));
    CHECK_THAT(mismatch([](auto& m) { m.head_dim = 16; }), Contains("head_dim"));
    CHECK_THAT(mismatch([](auto& m) { m.model = "other"; }), Contains("model"));
    // a capture needs the RoPE and the head sampling recorded
    {
        auto m = base;
        m.rope.reset();
        CHECK_THAT(error_of([&] { qkgeom::torch_capture<float> c(m); }), Contains("manifest.rope"));
        m = base;
        m.heads.reset();
        CHECK_THAT(error_of([&] { qkgeom::torch_capture<float> c(m); }), Contains("manifest.heads"));
    }

    // captures and capture_moments refuse to merge, naming the field
    at::manual_seed(10);
    auto const s = make_step(at::kFloat, 0);
    qkgeom::torch_capture_options o;
    o.mode = qkgeom::torch_capture_mode::moments;
    auto other = base;
    other.rope->theta = 1e6;
    qkgeom::torch_capture<float> a(base, o), b(other, o);
    for (std::int64_t layer = 0; layer < 2; ++layer) {
        a(layer, s.q, s.k, s.pos, s.ex, std::nullopt);
        b(layer, s.q, s.k, s.pos, s.ex, std::nullopt);
    }
    CHECK_THAT(error_of([&] { a += b; }), Contains("rope.theta"));
    auto ra = a.result();
    auto const rb = b.result();
    CHECK_THAT(error_of([&] { ra += rb; }), Contains("check_compatible") && Contains("rope.theta"));
    // same manifest: counts add up
    qkgeom::torch_capture<float> c(base, o);
    for (std::int64_t layer = 0; layer < 2; ++layer) c(layer, s.q, s.k, s.pos, s.ex, std::nullopt);
    auto rc = c.result();
    auto const n_before = ra.heads[0].q.count();
    ra += rc;
    CHECK(ra.heads[0].q.count() == 2 * n_before);
}

// ---------------------------------------------------------------------------
// [plasticity] the device Gram path against the CPU
// ---------------------------------------------------------------------------

namespace {

struct plasticity_case {
    qkgeom::householder_result model;
    at::Tensor keys;  // [n, d] f64
    std::vector<std::int64_t> pos, bucket, example;
    Eigen::MatrixXd keys_e;
};

plasticity_case make_plasticity_case(qkgeom::semantic_model sm, std::uint64_t seed) {
    constexpr std::int64_t d = 6, nq = 400, nk = 300;
    at::manual_seed(seed);
    plasticity_case c;
    qkgeom::bucket_spec const spec{qkgeom::bucket_scheme::uniform, 16, 1.0};
    // queries with a positional drift along one direction
    at::Tensor const tq = at::randint(0, 128, {nq}, at::TensorOptions().dtype(at::kLong));
    at::Tensor const dir = at::randn({d}, at::TensorOptions().dtype(at::kDouble));
    at::Tensor const q = at::randn({nq, d}, at::TensorOptions().dtype(at::kDouble)) +
                         tq.to(at::kDouble).unsqueeze(1) * dir.unsqueeze(0) * 0.02 + 3.0;
    std::vector<std::int64_t> qpos(static_cast<std::size_t>(nq)), qb(static_cast<std::size_t>(nq));
    for (std::int64_t i = 0; i < nq; ++i) {
        qpos[static_cast<std::size_t>(i)] = tq[i].item<std::int64_t>();
        qb[static_cast<std::size_t>(i)] = qkgeom::bucket_of(spec, qpos[static_cast<std::size_t>(i)]);
    }
    qkgeom::bucketed_moments qm(d);
    qm.add(q, qpos, qb);
    qkgeom::householder_options ho;
    ho.model = sm;
    c.model = qkgeom::householder(qm, ho);
    // keys: three examples, a large common offset, some exact duplicates
    at::Tensor k = at::randn({nk, d}, at::TensorOptions().dtype(at::kDouble)) * 0.7 + 5.0;
    for (std::int64_t i = 0; i < 12; ++i) k[i + 100] = k[i + 40];  // identical keys (same example 0? see below)
    at::Tensor const tk = at::randint(0, 128, {nk}, at::TensorOptions().dtype(at::kLong));
    for (std::int64_t i = 0; i < nk; ++i) {
        std::int64_t t = tk[i].item<std::int64_t>();
        if (i >= 100 && i < 112) t = tk[i - 60].item<std::int64_t>();  // duplicates share position and bucket
        c.pos.push_back(t);
        c.bucket.push_back(qkgeom::bucket_of(spec, t));
        c.example.push_back(i >= 100 && i < 112 ? (i - 60) % 3 : i % 3);
    }
    c.keys = k;
    c.keys_e.resize(nk, d);
    for (std::int64_t i = 0; i < nk; ++i)
        for (std::int64_t j = 0; j < d; ++j) c.keys_e(i, j) = k[i][j].item<double>();
    return c;
}

/// The key rows of a case with `vectors` (an Eigen matrix for the CPU path,
/// a tensor for the device path).
template <class M>
qkgeom::token_rows<M> key_rows(M vectors, plasticity_case const& c) {
    return {std::move(vectors), qkgeom::token_positions(c.pos), qkgeom::token_buckets(c.bucket),
            qkgeom::example_ids(c.example)};
}

void check_cells(qkgeom::torch_plasticity_result const& got, qkgeom::plasticity_result const& ref, double tol) {
    REQUIRE(got.cells.size() == ref.cells.size());
    REQUIRE(got.n_pairs == ref.n_pairs);
    REQUIRE(got.n_pairs_skipped == ref.n_pairs_skipped);
    REQUIRE(got.n_query_buckets_skipped == ref.n_query_buckets_skipped);
    std::int64_t nonempty = 0;
    for (std::size_t i = 0; i < ref.cells.size(); ++i) {
        auto const& a = got.cells[i];
        auto const& b = ref.cells[i];
        REQUIRE(a.q_bucket == b.q_bucket);
        REQUIRE(a.k_bucket == b.k_bucket);
        REQUIRE(a.n_pairs == b.n_pairs);
        if (b.n_pairs == 0) {
            CHECK(std::isnan(a.plasticity));
            continue;
        }
        ++nonempty;
        INFO("cell (" << b.q_bucket << ", " << b.k_bucket << "): device " << a.plasticity << ", cpu " << b.plasticity);
        REQUIRE(std::abs(a.plasticity - b.plasticity) <= tol * std::abs(b.plasticity));
    }
    REQUIRE(nonempty > 3);
}

void check_plasticity_on(at::Device dev) {
    for (auto sm : {qkgeom::semantic_model::diag, qkgeom::semantic_model::full}) {
        auto const c = make_plasticity_case(sm, 21);
        for (auto pp : {qkgeom::pair_policy::same_bucket, qkgeom::pair_policy::prefix}) {
            for (std::int64_t window : {std::int64_t{0}, std::int64_t{40}}) {
                qkgeom::plasticity_options o;
                o.enumeration = qkgeom::enumeration_policy::exact;
                o.pairs = pp;
                qkgeom::capture_facts facts;
                facts.buckets = qkgeom::bucket_spec{qkgeom::bucket_scheme::uniform, 16, 1.0};
                facts.sliding_window = window;
                auto const ref = qkgeom::attention_plasticity(c.model, key_rows(c.keys_e, c), facts, qkgeom::head_id{}, o);
                REQUIRE(ref.n_pairs_skipped > 0);  // the duplicates are exercised
                qkgeom::torch_plasticity_options t64;
                t64.tile_keys = 7;  // many tiles, ragged edges
                auto const g64 = qkgeom::torch_attention_plasticity(c.model, key_rows(c.keys.to(dev), c), facts, o, t64);
                check_cells(g64, ref, 1e-12);
                // f32 keys, f32 GEMM: against the CPU on the same f32 values
                at::Tensor const k32 = c.keys.to(at::kFloat);
                Eigen::MatrixXd k32e(k32.size(0), k32.size(1));
                for (std::int64_t i = 0; i < k32.size(0); ++i)
                    for (std::int64_t j = 0; j < k32.size(1); ++j) k32e(i, j) = static_cast<double>(k32[i][j].item<float>());
                auto const ref32 = qkgeom::attention_plasticity(c.model, key_rows(k32e, c), facts, qkgeom::head_id{}, o);
                auto const g32 = qkgeom::torch_attention_plasticity(c.model, key_rows(k32.to(dev), c), facts, o);
                check_cells(g32, ref32, 1e-6);
            }
        }
    }
}

}  // namespace

TEST_CASE("device Gram plasticity equals the CPU cells (f64 1e-12, f32 1e-6)", "[plasticity]") {
    check_plasticity_on(at::kCPU);
}

TEST_CASE("device Gram plasticity takes tensors for the annotations", "[plasticity]") {
    auto const c = make_plasticity_case(qkgeom::semantic_model::diag, 22);
    qkgeom::plasticity_options o;
    o.enumeration = qkgeom::enumeration_policy::exact;
    auto const ref = qkgeom::attention_plasticity(c.model, key_rows(c.keys_e, c), qkgeom::capture_facts{}, qkgeom::head_id{}, o);
    auto const lt = at::TensorOptions().dtype(at::kLong);
    // The per-row arrays copy LibTorch integer tensors (explicitly, by meaning).
    qkgeom::token_rows<at::Tensor> const keys{c.keys.to(at::kBFloat16).to(at::kDouble),
                                              qkgeom::token_positions(at::tensor(c.pos, lt)),
                                              qkgeom::token_buckets(at::tensor(c.bucket, lt)),
                                              qkgeom::example_ids(at::tensor(c.example, lt).to(at::kInt))};
    CHECK(keys.position.values() == c.pos);
    CHECK(keys.bucket.values() == c.bucket);
    CHECK(keys.example_id.values() == c.example);
    auto const g = qkgeom::torch_attention_plasticity(c.model, keys, qkgeom::capture_facts{}, o);
    REQUIRE(g.cells.size() == ref.cells.size());
}

// ---------------------------------------------------------------------------
// [cuda] the same properties on a CUDA device (torch.cuda; skipped without one)
// ---------------------------------------------------------------------------

TEST_CASE("CUDA: captured rows, device moments, pinned async copies", "[cuda]") {
    REQUIRE(torch::cuda::is_available());
    check_capture_on(at::Device(at::kCUDA, 0));
    // rows mode copied through pinned memory: bytes are accounted
    at::manual_seed(13);
    std::vector<step_inputs> steps{make_step(at::kBFloat16, 0, at::Device(at::kCUDA, 0))};
    qkgeom::torch_capture<float> cap(test_manifest());
    run_steps(cap, steps, true);
    check_store_equals_reference(cap, steps);
    CHECK(cap.bytes_to_host() > 0);
}

TEST_CASE("CUDA: device Gram plasticity equals the CPU cells", "[cuda]") {
    REQUIRE(torch::cuda::is_available());
    check_plasticity_on(at::Device(at::kCUDA, 0));
}

TEST_CASE("a rows capture writes a dataset that reads back exactly", "[manifest]") {
    at::manual_seed(14);
    std::vector<step_inputs> steps{make_step(at::kBFloat16, 0), make_step(at::kBFloat16, 1)};
    qkgeom::torch_capture<float> cap(test_manifest());
    run_steps(cap, steps, false);
    auto const dir = std::filesystem::temp_directory_path() / "qkgeom_torch_test_dataset";
    std::filesystem::remove_all(dir);
    cap.write_dataset(dir, qkgeom::io::storage_format::safetensors, "bf16");
    auto const m = qkgeom::io::read_manifest(dir);
    qkgeom::io::check_compatible(m, cap.manifest());  // RoPE, heads, windows, sampler round-trip
    REQUIRE((qkgeom::io::sampled_heads(m) == cap.heads()));  // (bool: glog streams vectors)
    std::int64_t entries = 0;
    for (auto const* e : cap.store().entries()) {
        auto const back = qkgeom::io::read_head(dir, m, e->layer, e->head, e->k);
        REQUIRE(back.dtype == "bf16");
        REQUIRE(back.position == e->position);
        REQUIRE(back.bucket == e->bucket);
        REQUIRE(back.example_id == e->example_id);
        REQUIRE(back.vectors.rows() == e->rows());
        for (std::size_t i = 0; i < e->values.size(); ++i)
            REQUIRE(back.vectors.data()[i] == static_cast<double>(e->values[i]));  // bf16 rows: bit-exact
        ++entries;
    }
    CHECK(entries == static_cast<std::int64_t>(cap.store().entries().size()));
    // Each analysed head as one value: the capture's head (views of the store,
    // the manifest's facts) equals the head read back from the dataset.
    for (auto const& h : cap.heads()) {
        auto const live = cap.head(h);
        auto const back = qkgeom::io::read_capture(dir, m, h);
        REQUIRE(live.id == h);
        REQUIRE(back.id == h);
        REQUIRE(live.facts == back.facts);
        REQUIRE(live.facts.context_length == 8 * kT);
        for (auto [a, b] : {std::pair{&live.queries, &back.queries}, std::pair{&live.keys, &back.keys}}) {
            REQUIRE(a->position == b->position);
            REQUIRE(a->bucket == b->bucket);
            REQUIRE(a->example_id == b->example_id);
            REQUIRE(a->vectors.rows() == b->vectors.rows());
            REQUIRE(a->vectors.cols() == b->vectors.cols());
            for (qkgeom::index_t i = 0; i < b->vectors.rows(); ++i)
                for (qkgeom::index_t j = 0; j < b->vectors.cols(); ++j) REQUIRE(a->vectors(i, j) == b->vectors(i, j));
        }
    }
    std::filesystem::remove_all(dir);
}
