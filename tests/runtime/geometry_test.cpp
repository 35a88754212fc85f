// Geometry (method §2–4): closed forms over moments checked against brute-force
// computations on the rows, invariants of the rotations, input-type and
// shard-order independence, degenerate inputs.
#include <qkgeom/plasticity.hpp>

#ifdef QKGEOM_TEST_XTENSOR
#include <qkgeom/adapters/xtensor.hpp>
#include <xtensor/xtensor.hpp>
#endif
#ifdef QKGEOM_TEST_RANGE_V3
#include <range/v3/view/iota.hpp>
#include <range/v3/view/transform.hpp>
#endif

#include <qkgeom/capture/synthetic.hpp>

#include <catch2/catch.hpp>

#include <Eigen/SVD>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "test_util.hpp"

// One namespace per file: the test program is built as a unity build
// (tests/CMakeLists.txt), where the files' helpers must not meet.
namespace qkgeom_tests_geometry_test {

using qkgeom::index_t;
using qkgeom_test::rel_diff;

namespace {

/// A structured head: queries and keys with an offset, a drift along a
/// random direction with different slopes, anisotropic noise.
struct head_rows {
    Eigen::MatrixXd q, k;
    std::vector<std::int64_t> tq, tk, bq, bk;
};

head_rows make_head(std::uint64_t seed, index_t n, index_t d, double slope_q = 2e-3, double slope_k = 4e-3,
                    double offset = 1.5) {
    std::mt19937_64 gen(seed);
    std::normal_distribution<double> nd;
    std::uniform_int_distribution<std::int64_t> pos(0, 2047);
    Eigen::VectorXd dir = Eigen::VectorXd::NullaryExpr(d, [&] { return nd(gen); }).normalized();
    Eigen::VectorXd off = Eigen::VectorXd::NullaryExpr(d, [&] { return nd(gen); }).normalized() * offset;
    Eigen::VectorXd scale = Eigen::VectorXd::NullaryExpr(d, [&] { return 0.3 + std::abs(nd(gen)); });
    head_rows h;
    h.q.resize(n, d);
    h.k.resize(n, d);
    for (auto* v : {&h.tq, &h.tk, &h.bq, &h.bk}) v->resize(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) {
        auto const s = static_cast<std::size_t>(i);
        h.tq[s] = pos(gen);
        h.tk[s] = pos(gen);
        h.bq[s] = h.tq[s] / 256;
        h.bk[s] = h.tk[s] / 256;
        for (index_t j = 0; j < d; ++j) {
            h.q(i, j) = off(j) + slope_q * double(h.tq[s]) * dir(j) + scale(j) * nd(gen);
            h.k(i, j) = -0.5 * off(j) + slope_k * double(h.tk[s]) * dir(j) + scale(j) * nd(gen);
        }
    }
    return h;
}

Eigen::VectorXd as_vec(std::vector<std::int64_t> const& v) {
    Eigen::VectorXd out(static_cast<index_t>(v.size()));
    for (std::size_t i = 0; i < v.size(); ++i) out(static_cast<index_t>(i)) = static_cast<double>(v[i]);
    return out;
}

double pearson(Eigen::VectorXd const& x, Eigen::VectorXd const& y) {
    Eigen::VectorXd const xc = x.array() - x.mean(), yc = y.array() - y.mean();
    return xc.dot(yc) / std::sqrt(xc.squaredNorm() * yc.squaredNorm());
}

double ols_slope(Eigen::VectorXd const& x, Eigen::VectorXd const& t) {
    Eigen::VectorXd const xc = x.array() - x.mean(), tc = t.array() - t.mean();
    return xc.dot(tc) / tc.squaredNorm();
}

double sample_var(Eigen::VectorXd const& x) { return (x.array() - x.mean()).square().sum() / double(x.size() - 1); }

Eigen::MatrixXd centred(Eigen::MatrixXd const& x) { return x.rowwise() - x.colwise().mean(); }

qkgeom::head_moments moments_of(head_rows const& h) {
    qkgeom::head_moments hm(h.q.cols());
    hm.add(qkgeom::kind::query, h.q, h.tq, h.bq);
    hm.add(qkgeom::kind::key, h.k, h.tk, h.bk);
    return hm;
}

}  // namespace

TEST_CASE("PCA equals an SVD of the centred pooled rows", "[geometry][pca]") {
    auto const h = make_head(1, 3000, 12);
    auto const p = qkgeom::pca(moments_of(h), {.n_components = 12});
    Eigen::MatrixXd pool(6000, 12);
    pool << h.q, h.k;
    Eigen::JacobiSVD<Eigen::MatrixXd> svd(centred(pool), Eigen::ComputeThinV);
    Eigen::VectorXd const lambda = svd.singularValues().array().square() / (6000.0 - 1.0);
    CHECK(rel_diff(p.eigenvalues, lambda) < 1e-10);
    double const trace = lambda.sum();
    Eigen::VectorXd const tq = as_vec(h.tq), tk = as_vec(h.tk);
    for (index_t j = 0; j < 12; ++j) {
        auto const& c = p.components[static_cast<std::size_t>(j)];
        Eigen::VectorXd const v = svd.matrixV().col(j);
        CHECK(std::abs(std::abs(v.dot(c.loading)) - 1.0) < 1e-10);  // same axis
        CHECK(std::abs(c.explained_variance_ratio - lambda(j) / trace) < 1e-10);
        // correlations recomputed from the projected rows, with the reported sign
        CHECK(std::abs(c.r_q - pearson(h.q * c.loading, tq)) < 1e-10);
        CHECK(std::abs(c.r_k - pearson(h.k * c.loading, tk)) < 1e-10);
        // dominant policy: the larger |r| is positive
        CHECK((std::abs(c.r_q) >= std::abs(c.r_k) ? c.r_q : c.r_k) >= 0);
    }
    // positional variance fractions, brute force
    Eigen::MatrixXd const qc = centred(h.q);
    Eigen::VectorXd const tqc = tq.array() - tq.mean();
    double const frac_q = (qc.transpose() * tqc).squaredNorm() / (tqc.squaredNorm() * qc.squaredNorm());
    CHECK(std::abs(p.q_pos_var_frac - frac_q) < 1e-12);
}

TEST_CASE("PCA sign policies and taxonomy thresholds", "[geometry][pca]") {
    using qkgeom::classify;
    using qkgeom::head_class;
    CHECK(classify(0.8, -0.9) == head_class::position_dominated);
    CHECK(classify(0.8, 0.2) == head_class::q_positional);
    CHECK(classify(0.1, 0.71) == head_class::k_positional);
    CHECK(classify(0.1, -0.29) == head_class::content_focused);
    CHECK(classify(0.7, 0.9) == head_class::mixed);  // strict: 0.7 is not > 0.7
    CHECK(classify(0.3, 0.1) == head_class::mixed);  // strict: 0.3 is not < 0.3
    CHECK(classify(NAN, 0.1) == head_class::undefined);
    CHECK(classify(0.5, 0.5, {.low = 0.6, .high = 0.9}) == head_class::content_focused);
    CHECK(qkgeom::to_string(head_class::k_positional) == "k_positional");

    // query_anchor makes r_q >= 0 on every component where |r_q| >= 0.05
    auto const h = make_head(2, 2000, 8);
    auto const hm = moments_of(h);
    auto const dom = qkgeom::pca(hm);
    auto const qa = qkgeom::pca(hm, {.sign = qkgeom::sign_policy::query_anchor});
    for (std::size_t j = 0; j < qa.components.size(); ++j) {
        auto const& c = qa.components[j];
        if (std::abs(c.r_q) >= 0.05) CHECK(c.r_q >= 0);
        else CHECK(c.r_k >= 0);
        // same axis, same |r|; the sign differs exactly when the policies disagree
        CHECK(std::abs(std::abs(c.loading.dot(dom.components[j].loading)) - 1.0) < 1e-12);
        CHECK(std::abs(std::abs(c.r_q) - std::abs(dom.components[j].r_q)) < 1e-12);
    }
}

TEST_CASE("planar rotation metrics equal brute force on the rows", "[geometry][rotation]") {
    auto const h = make_head(3, 2500, 10);
    for (auto policy : {qkgeom::separation_policy::centroid, qkgeom::separation_policy::max_separation}) {
        auto const r = qkgeom::planar_rotation(moments_of(h), {.separation = policy});
        REQUIRE_FALSE(r.degenerate_a);
        REQUIRE_FALSE(r.degenerate_b);
        Eigen::MatrixXd pool(5000, 10);
        pool << h.q, h.k;
        Eigen::VectorXd tp(5000);
        tp << as_vec(h.tq), as_vec(h.tk);
        Eigen::VectorXd const c = centred(pool).transpose() * (tp.array() - tp.mean()).matrix() / 4999.0;
        CHECK(rel_diff(r.a, Eigen::VectorXd(c.normalized())) < 1e-12);
        CHECK(std::abs(r.a.norm() - 1) < 1e-12);
        CHECK(std::abs(r.b.norm() - 1) < 1e-12);
        CHECK(std::abs(r.a.dot(r.b)) < 1e-12);
        CHECK(r.residual_pos_cov < 1e-10);
        Eigen::VectorXd const tq = as_vec(h.tq), tk = as_vec(h.tk);
        Eigen::VectorXd const qa = h.q * r.a, ka = h.k * r.a, qb = h.q * r.b, kb = h.k * r.b;
        CHECK(std::abs(r.mu_q_a - qa.mean()) < 1e-12 * (1 + std::abs(qa.mean())));
        CHECK(std::abs(r.mu_k_b - kb.mean()) < 1e-12 * (1 + std::abs(kb.mean())));
        CHECK(rel_diff(r.alpha_q, ols_slope(qa, tq)) < 1e-10);
        CHECK(rel_diff(r.alpha_k, ols_slope(ka, tk)) < 1e-10);
        CHECK(std::abs(r.r_q_a - pearson(qa, tq)) < 1e-12);
        CHECK(std::abs(r.r_k_a - pearson(ka, tk)) < 1e-12);
        CHECK(std::abs(r.position_r - std::abs(pearson(pool * r.a, tp))) < 1e-12);
        CHECK(rel_diff(r.bias_strength, qa.mean() * ols_slope(ka, tk)) < 1e-10);
        CHECK(rel_diff(r.content_var_b, 0.5 * (sample_var(qb) + sample_var(kb))) < 1e-10);
        Eigen::MatrixXd const Sp = centred(pool).transpose() * centred(pool) / 4999.0;
        CHECK(rel_diff(r.var_frac_a, r.a.dot(Sp * r.a) / Sp.trace()) < 1e-10);
        CHECK(rel_diff(r.plane_var_fraction, (r.a.dot(Sp * r.a) + r.b.dot(Sp * r.b)) / Sp.trace()) < 1e-10);
        Eigen::VectorXd const delta = h.q.colwise().mean() - h.k.colwise().mean();
        CHECK(delta.dot(r.b) >= 0);
        Eigen::MatrixXd const M = centred(h.q).transpose() * centred(h.q) / 2499.0 +
                                  centred(h.k).transpose() * centred(h.k) / 2499.0 + delta * delta.transpose();
        CHECK(rel_diff(r.separation_strength, r.b.dot(M * r.b) / M.trace()) < 1e-10);
        if (policy == qkgeom::separation_policy::max_separation) {
            // b maximises bᵀMb over unit b ⟂ a: compare with a dense projector + SVD
            Eigen::MatrixXd const P = Eigen::MatrixXd::Identity(10, 10) - r.a * r.a.transpose();
            Eigen::JacobiSVD<Eigen::MatrixXd> svd(P * M * P, Eigen::ComputeFullU);
            CHECK(std::abs(std::abs(svd.matrixU().col(0).dot(r.b)) - 1) < 1e-10);
        } else {
            Eigen::VectorXd const pd = delta - r.a * r.a.dot(delta);
            CHECK(rel_diff(r.b, Eigen::VectorXd(pd.normalized())) < 1e-12);
        }
    }
}

TEST_CASE("q.k is preserved by the PCA basis, {a, b, complement} and H", "[geometry][invariants]") {
    auto const h = make_head(4, 1500, 16);
    auto const hm = moments_of(h);
    Eigen::MatrixXd const S = h.q.topRows(40) * h.k.topRows(40).transpose();  // 40 x 40 scores
    auto const p = qkgeom::pca(hm);
    Eigen::MatrixXd const V = p.basis;
    CHECK((V.transpose() * V - Eigen::MatrixXd::Identity(16, 16)).cwiseAbs().maxCoeff() < 1e-12);
    CHECK(rel_diff(Eigen::MatrixXd((h.q.topRows(40) * V) * (h.k.topRows(40) * V).transpose()), S) < 1e-10);
    auto const r = qkgeom::planar_rotation(hm);
    Eigen::MatrixXd const B = r.basis();
    CHECK((B.transpose() * B - Eigen::MatrixXd::Identity(16, 16)).cwiseAbs().maxCoeff() < 1e-12);
    CHECK(rel_diff(B.col(0), r.a) == 0.0);
    CHECK(rel_diff(Eigen::MatrixXd((h.q.topRows(40) * B) * (h.k.topRows(40) * B).transpose()), S) < 1e-10);
    auto const hh = qkgeom::householder(hm);
    Eigen::MatrixXd Hq = h.q.topRows(40), Hk = h.k.topRows(40);
    hh.H.apply_rows(Hq);
    hh.H.apply_rows(Hk);
    CHECK(rel_diff(Eigen::MatrixXd(Hq * Hk.transpose()), S) < 1e-10);
}

TEST_CASE("the Householder reflector: symmetric, orthogonal, involutory, H b = e1", "[geometry][householder]") {
    std::mt19937_64 gen(5);
    std::normal_distribution<double> nd;
    for (int trial = 0; trial < 40; ++trial) {
        index_t const d = 1 + trial % 9;
        Eigen::VectorXd beta = Eigen::VectorXd::NullaryExpr(d, [&] { return nd(gen); });
        if (trial % 4 == 1) beta(0) = -std::abs(beta(0));                         // β̂₁ < 0
        if (trial % 4 == 2) beta = Eigen::VectorXd::Unit(d, 0) + 1e-9 * beta;      // β̂ ≈ e1 (cancellation)
        if (trial % 4 == 3) beta = -Eigen::VectorXd::Unit(d, 0) + 1e-9 * beta;     // β̂ ≈ −e1
        auto const H = qkgeom::householder_reflector::from_direction(beta);
        Eigen::MatrixXd const D = H.dense(d);
        Eigen::VectorXd const bh = beta.normalized();
        Eigen::MatrixXd const I = Eigen::MatrixXd::Identity(d, d);
        CHECK((D - D.transpose()).cwiseAbs().maxCoeff() < 1e-15);
        CHECK((D * D.transpose() - I).cwiseAbs().maxCoeff() < 1e-14);
        CHECK((D * D - I).cwiseAbs().maxCoeff() < 1e-14);
        CHECK((D * bh - Eigen::VectorXd::Unit(d, 0)).cwiseAbs().maxCoeff() < 1e-14);
        CHECK((H.apply(bh) - D * bh).cwiseAbs().maxCoeff() < 1e-15);
        Eigen::MatrixXd const S = Eigen::MatrixXd::Random(d, d);
        Eigen::MatrixXd const Ssym = S * S.transpose();
        CHECK((H.apply_sym(Ssym) - D * Ssym * D).cwiseAbs().maxCoeff() < 1e-13);
        CHECK((H.apply_sym_diag(Ssym) - (D * Ssym * D).diagonal()).cwiseAbs().maxCoeff() < 1e-13);
    }
    // β = 0 or β̂ = e1 exactly: H = I
    CHECK(qkgeom::householder_reflector::from_direction(Eigen::VectorXd::Zero(4)).is_identity());
    CHECK(qkgeom::householder_reflector::from_direction(Eigen::VectorXd::Unit(4, 0) * 3).is_identity());
}

TEST_CASE("Householder parameters and bucket models equal brute force on rotated rows", "[geometry][householder]") {
    auto const h = make_head(6, 3000, 8);
    Eigen::VectorXd const t = as_vec(h.tq);
    Eigen::MatrixXd const qc = centred(h.q);
    Eigen::VectorXd const tc = t.array() - t.mean();
    Eigen::VectorXd const beta = qc.transpose() * tc / tc.squaredNorm();
    for (auto model : {qkgeom::semantic_model::diag, qkgeom::semantic_model::full,
                       qkgeom::semantic_model::global_linear}) {
        auto const r = qkgeom::householder(h.q, h.tq, h.bq, {.model = model});
        CHECK(rel_diff(r.beta, beta) < 1e-11);
        Eigen::VectorXd const alpha = h.q.colwise().mean().transpose() - beta * t.mean();
        CHECK(rel_diff(r.alpha, alpha) < 1e-11);
        CHECK(rel_diff(r.beta_pos, beta.norm()) < 1e-12);
        CHECK(rel_diff(r.alpha_pos, beta.normalized().dot(alpha)) < 1e-11);
        for (index_t j = 0; j < 8; ++j) {
            double const rr = pearson(h.q.col(j), t);
            CHECK(std::abs(r.component_r2(j) - rr * rr) < 1e-12);
        }
        CHECK(std::abs(r.q_R2_pos - r.component_r2.mean()) < 1e-15);
        CHECK(std::abs(r.component_weight.sum() - 1) < 1e-12);
        CHECK(rel_diff(r.component_weight, Eigen::VectorXd(r.component_r2 / r.component_r2.sum())) < 1e-12);
        // rotate the rows densely and recompute everything
        Eigen::MatrixXd const Hd = r.H.dense(8);
        Eigen::MatrixXd const Y = h.q * Hd;  // rows: (H q)ᵀ
        Eigen::VectorXd const y0 = Y.col(0);
        CHECK(rel_diff(ols_slope(y0, t), r.beta_pos) < 1e-10);
        Eigen::VectorXd const resid = y0.array() - r.alpha_pos - r.beta_pos * t.array();
        CHECK(std::abs(resid.mean()) < 1e-9);
        CHECK(rel_diff(r.sigma2_pos, resid.squaredNorm() / (3000.0 - 1.0)) < 1e-10);
        for (auto const& s : r.buckets) {
            std::vector<index_t> rows;
            for (index_t i = 0; i < 3000; ++i)
                if (h.bq[static_cast<std::size_t>(i)] == s.bucket) rows.push_back(i);
            Eigen::MatrixXd const Yb = Y(rows, Eigen::all);
            Eigen::VectorXd const tb = t(rows);
            CHECK(s.n_queries == static_cast<std::int64_t>(rows.size()));
            CHECK(std::abs(s.tau - tb.mean()) < 1e-12 * tb.mean());
            CHECK(std::abs(s.mean(0) - (r.alpha_pos + r.beta_pos * tb.mean())) < 1e-12);
            CHECK(s.var(0) == r.sigma2_pos);
            if (model == qkgeom::semantic_model::global_linear) {
                Eigen::VectorXd const ar = Hd * r.alpha;
                CHECK(rel_diff(Eigen::VectorXd(s.mean.tail(7)), Eigen::VectorXd(ar.tail(7))) < 1e-12);
                // global residual variance of every rotated coordinate
                for (index_t j = 1; j < 8; ++j) {
                    Eigen::VectorXd const yj = Y.col(j);
                    Eigen::VectorXd const e = yj.array() - yj.mean() - ols_slope(yj, t) * (t.array() - t.mean());
                    CHECK(rel_diff(s.var(j), e.squaredNorm() / 2999.0) < 1e-10);
                }
            } else {
                Eigen::MatrixXd const Sb = centred(Yb).transpose() * centred(Yb) / double(rows.size() - 1);
                CHECK(rel_diff(Eigen::VectorXd(s.mean.tail(7)), Eigen::VectorXd(Yb.colwise().mean().tail(7).transpose())) <
                      1e-12);
                CHECK(rel_diff(Eigen::VectorXd(s.var.tail(7)), Eigen::VectorXd(Sb.diagonal().tail(7))) < 1e-10);
                if (model == qkgeom::semantic_model::full) CHECK(rel_diff(s.cov, Sb.bottomRightCorner(7, 7)) < 1e-10);
                else CHECK(s.cov.size() == 0);
            }
        }
    }
}

TEST_CASE("results are identical from any input type, rows or merged shards", "[geometry][adapters]") {
    auto const h = make_head(7, 1200, 4);
    auto const ref_p = qkgeom::pca(h.q, h.tq, h.k, h.tk);
    auto const ref_r = qkgeom::planar_rotation(h.q, h.tq, h.k, h.tk);
    auto const ref_h = qkgeom::householder(h.q, h.tq, h.bq);
    auto agree = [&](qkgeom::pca_result const& p, qkgeom::rotation_result const& r,
                     qkgeom::householder_result const& hh) {
        bool ok = rel_diff(p.eigenvalues, ref_p.eigenvalues) < 1e-13;
        for (std::size_t j = 0; j < p.components.size(); ++j) {
            ok = ok && std::abs(p.components[j].r_q - ref_p.components[j].r_q) < 1e-13;
            ok = ok && rel_diff(p.components[j].loading, ref_p.components[j].loading) < 1e-12;
        }
        ok = ok && rel_diff(r.a, ref_r.a) < 1e-13 && rel_diff(r.b, ref_r.b) < 1e-13;
        ok = ok && rel_diff(r.bias_strength, ref_r.bias_strength) < 1e-13;
        ok = ok && rel_diff(hh.beta, ref_h.beta) < 1e-13 && rel_diff(hh.sigma2_pos, ref_h.sigma2_pos) < 1e-13;
        for (std::size_t b = 0; b < hh.buckets.size(); ++b)
            ok = ok && rel_diff(hh.buckets[b].var, ref_h.buckets[b].var) < 1e-13;
        return ok;
    };
    // row-major, float-free copies through other adapters
    Eigen::Matrix<double, -1, -1, Eigen::RowMajor> const qr = h.q, kr = h.k;
    auto const qs = qkgeom::make_matrix_view(std::span<double const>(qr.data(), 4800), 1200, 4);
    auto const ks = qkgeom::make_matrix_view(std::span<double const>(kr.data(), 4800), 1200, 4);
    CHECK(agree(qkgeom::pca(qs, h.tq, ks, h.tk), qkgeom::planar_rotation(qs, h.tq, ks, h.tk),
                qkgeom::householder(qs, h.tq, h.bq)));
    std::vector<std::array<double, 4>> qa(1200), ka(1200);
    for (index_t i = 0; i < 1200; ++i)
        for (index_t j = 0; j < 4; ++j) {
            qa[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)] = h.q(i, j);
            ka[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)] = h.k(i, j);
        }
    CHECK(agree(qkgeom::pca(qa, h.tq, ka, h.tk), qkgeom::planar_rotation(qa, h.tq, ka, h.tk),
                qkgeom::householder(qa, h.tq, h.bq)));
#ifdef QKGEOM_TEST_RANGE_V3
    auto const qv = ranges::views::iota(0, 1200) |
                    ranges::views::transform([&](int i) { return qa[static_cast<std::size_t>(i)]; });
    auto const kv = ranges::views::iota(0, 1200) |
                    ranges::views::transform([&](int i) { return ka[static_cast<std::size_t>(i)]; });
    CHECK(agree(qkgeom::pca(qv, h.tq, kv, h.tk), qkgeom::planar_rotation(qv, h.tq, kv, h.tk),
                qkgeom::householder(qv, h.tq, h.bq)));
#endif
#ifdef QKGEOM_TEST_XTENSOR
    xt::xtensor<double, 2> xq = xt::zeros<double>({1200, 4}), xk = xt::zeros<double>({1200, 4});
    for (std::size_t i = 0; i < 1200; ++i)
        for (std::size_t j = 0; j < 4; ++j) {
            xq(i, j) = h.q(static_cast<index_t>(i), static_cast<index_t>(j));
            xk(i, j) = h.k(static_cast<index_t>(i), static_cast<index_t>(j));
        }
    CHECK(agree(qkgeom::pca(xq, h.tq, xk, h.tk), qkgeom::planar_rotation(xq, h.tq, xk, h.tk),
                qkgeom::householder(xq, h.tq, h.bq)));
#endif
    // merged shards, in two different orders
    std::mt19937_64 gen(3);
    for (int trial = 0; trial < 3; ++trial) {
        std::vector<qkgeom::head_moments> shards;
        for (index_t lo = 0; lo < 1200; lo += 300) {
            qkgeom::head_moments s(4);
            s.add(qkgeom::kind::query, h.q.middleRows(lo, 300), std::span(h.tq).subspan(std::size_t(lo), 300),
                  std::span(h.bq).subspan(std::size_t(lo), 300));
            s.add(qkgeom::kind::key, h.k.middleRows(lo, 300), std::span(h.tk).subspan(std::size_t(lo), 300),
                  std::span(h.bk).subspan(std::size_t(lo), 300));
            shards.push_back(std::move(s));
        }
        std::shuffle(shards.begin(), shards.end(), gen);
        qkgeom::head_moments merged;
        for (auto const& s : shards) merged += s;
        CHECK(agree(qkgeom::pca(merged), qkgeom::planar_rotation(merged), qkgeom::householder(merged)));
    }
}

TEST_CASE("degenerate inputs give flags and NaNs, never garbage", "[geometry][degenerate]") {
    auto const h = make_head(8, 400, 5);
    SECTION("all positions equal") {
        std::vector<std::int64_t> const same(400, 17), bucket(400, 0);
        auto const p = qkgeom::pca(h.q, same, h.k, same);
        CHECK(std::isnan(p.pc0_r_q));
        CHECK(p.taxonomy == qkgeom::head_class::undefined);
        CHECK(std::isnan(p.q_pos_var_frac));
        CHECK_FALSE(p.degenerate);  // variance itself is fine
        auto const r = qkgeom::planar_rotation(h.q, same, h.k, same);
        CHECK(r.degenerate_a);
        CHECK(r.degenerate_b);
        CHECK(std::isnan(r.bias_strength));
        CHECK(r.a.array().isNaN().all());
        auto const hh = qkgeom::householder(h.q, same, bucket);
        CHECK(hh.degenerate_t);
        CHECK(hh.beta.isZero(0));
        CHECK(hh.H.is_identity());
        CHECK(std::isnan(hh.q_R2_pos));
        CHECK(hh.component_weight.isApproxToConstant(0.2));
    }
    SECTION("Q = K: no centroid offset, b (centroid) is degenerate, a is reported") {
        auto const r = qkgeom::planar_rotation(h.q, h.tq, h.q, h.tq);
        CHECK_FALSE(r.degenerate_a);
        CHECK(r.degenerate_b);
        CHECK(std::isfinite(r.bias_strength));
        CHECK(std::isnan(r.mu_q_b));
        CHECK(std::isnan(r.separation_strength));
        CHECK(std::isnan(r.plane_var_fraction));
        CHECK_THROWS_AS(r.basis(), std::invalid_argument);
    }
    SECTION("a single bucket") {
        std::vector<std::int64_t> const bucket(400, 3);
        auto const hh = qkgeom::householder(h.q, h.tq, bucket);
        REQUIRE(hh.buckets.size() == 1);
        CHECK(hh.buckets[0].bucket == 3);
        CHECK(hh.buckets[0].used);
    }
    SECTION("d = 1") {
        Eigen::MatrixXd const q1 = h.q.leftCols(1), k1 = h.k.leftCols(1);
        auto const p = qkgeom::pca(q1, h.tq, k1, h.tk);
        CHECK(p.components.size() == 1);
        CHECK(std::abs(p.components[0].explained_variance_ratio - 1) < 1e-15);
        auto const r = qkgeom::planar_rotation(q1, h.tq, k1, h.tk);
        CHECK_FALSE(r.degenerate_a);
        CHECK(r.degenerate_b);
        CHECK(std::abs(std::abs(r.a(0)) - 1) < 1e-15);
        auto const hh = qkgeom::householder(q1, h.tq, h.bq);
        CHECK(hh.buckets.front().mean.size() == 1);
    }
    SECTION("n < 3: one bucket with one query is skipped, n = 1 overall gives NaN") {
        std::vector<std::int64_t> bucket = h.bq;
        bucket[0] = 999;  // a bucket holding a single query
        auto const hh = qkgeom::householder(h.q, h.tq, bucket);
        CHECK(hh.n_buckets_skipped == 1);
        CHECK_FALSE(hh.buckets.back().used);
        CHECK(hh.buckets.back().var.array().isNaN().all());
        auto const gl = qkgeom::householder(h.q, h.tq, bucket, {.model = qkgeom::semantic_model::global_linear});
        CHECK(gl.n_buckets_skipped == 0);
        CHECK(gl.buckets.back().used);
        Eigen::MatrixXd const two = h.q.topRows(1), twok = h.k.topRows(1);
        std::vector<std::int64_t> const t1{5};
        auto const r = qkgeom::planar_rotation(two, t1, twok, t1);
        CHECK(r.degenerate_a);
        auto const p = qkgeom::pca(two, t1, twok, t1);
        CHECK(std::isnan(p.pc0_r_q));
        auto const one = qkgeom::householder(two, t1, t1);
        CHECK(one.degenerate_t);
        CHECK(std::isnan(one.sigma2_pos));
    }
    SECTION("no rows of a kind is an error, not a NaN") {
        qkgeom::head_moments hm(5);
        hm.add(qkgeom::kind::query, h.q, h.tq, h.bq);
        CHECK_THROWS_WITH(qkgeom::pca(hm), Catch::Contains("no key rows"));
        CHECK_THROWS_WITH(qkgeom::planar_rotation(h.q, h.tq, h.k.leftCols(4), h.tk),
                          Catch::Contains("head dimensions differ"));
    }
}

TEST_CASE("normality diagnostics: brute force, Gaussian and heavy-tailed heads", "[geometry][householder][diagnostics]") {
    auto h = make_head(9, 4000, 6);
    auto const model = qkgeom::householder(h.q, h.tq, h.bq);
    auto const g = qkgeom::householder_diagnostics(model, h.q, h.tq);
    CHECK(g.sem_coordinates == 5);
    // brute force: standardised coordinate-1 residual, biased g1 and g2
    Eigen::VectorXd const t = as_vec(h.tq);
    Eigen::VectorXd const y0 = h.q * model.beta.normalized();
    Eigen::VectorXd z = (y0.array() - model.alpha_pos - model.beta_pos * t.array()) / std::sqrt(model.sigma2_pos);
    Eigen::ArrayXd const c = z.array() - z.mean();
    double const m2 = c.square().mean(), m3 = c.cube().mean(), m4 = c.square().square().mean();
    CHECK(std::abs(g.pos_skew - m3 / std::pow(m2, 1.5)) < 1e-10);
    CHECK(std::abs(g.pos_excess_kurtosis - (m4 / (m2 * m2) - 3)) < 1e-10);
    std::vector<double> zs(z.data(), z.data() + z.size());
    CHECK(std::abs(g.pos_ks_p - qkgeom::ks_test_normal(zs).pvalue) < 1e-12);
    // Gaussian data: shape statistics within 5 standard errors of 0, KS rarely rejects
    double const n = 4000;
    CHECK(std::abs(g.pos_skew) < 5 * std::sqrt(6 / n));
    CHECK(std::abs(g.pos_excess_kurtosis) < 5 * std::sqrt(24 / n));
    CHECK(g.pos_ks_p > 1e-4);
    CHECK(g.sem_median_abs_kurtosis < 5 * std::sqrt(24 / n));
    CHECK(g.sem_frac_ks_reject <= 0.4);  // 5 coordinates at alpha 0.05
    // heavy tails (Laplace noise) in every coordinate: kurtosis ≈ 3, KS rejects everywhere
    std::mt19937_64 gen(10);
    std::exponential_distribution<double> ex(1.0);
    std::bernoulli_distribution coin;
    for (index_t i = 0; i < h.q.rows(); ++i)
        for (index_t j = 0; j < h.q.cols(); ++j) h.q(i, j) += 8.0 * (coin(gen) ? ex(gen) : -ex(gen));
    auto const heavy_model = qkgeom::householder(h.q, h.tq, h.bq);
    auto const heavy = qkgeom::householder_diagnostics(heavy_model, h.q, h.tq);
    CHECK(heavy.pos_excess_kurtosis > 1.0);
    CHECK(heavy.sem_median_abs_kurtosis > 1.0);
    CHECK(heavy.pos_ks_p < 1e-3);
    CHECK(heavy.sem_frac_ks_reject == 1.0);
    // fewer than 3 rows: NaN; bad inputs: errors
    auto const few = qkgeom::householder_diagnostics(model, h.q.topRows(2), std::span(h.tq).first(2));
    CHECK(std::isnan(few.pos_skew));
    CHECK(std::isnan(few.sem_median_ks_p));
    CHECK_THROWS_WITH(qkgeom::householder_diagnostics(model, h.q.leftCols(5), h.tq), Catch::Contains("columns"));
    CHECK_THROWS_AS(qkgeom::householder_diagnostics(model, h.q, h.tq, 1.5), std::invalid_argument);
}

// ---------------------------------------------------------------------------
// Planted truth (capture/synthetic.hpp). Bounds: every estimate must lie within 5
// standard errors of the planted value, with the standard errors derived from
// the sample sizes and the (conservative, total) sample variances:
//   se(β_j) = sd(q_j) / (sd(t)·√n),  se(α_j) = sd(q_j)·√(1/n + t̄²/M2_t),
//   ‖a − a*‖ ≤ 5·√(trace Σ_pool)·sd(t) / (√N·‖c‖), and first-order propagation
// for the derived scalars.
// ---------------------------------------------------------------------------
TEST_CASE("planted truth is recovered within sampling error", "[geometry][synthetic][truth]") {
    qkgeom::synthetic::layer_spec L;
    L.d = 32;
    L.rotary_dims = 16;
    L.mix = true;  // generic directions
    L.n_q_heads = 2;
    L.n_kv_heads = 1;
    L.model_seed = 11;
    auto qh = qkgeom::synthetic::default_q_head();  // + a Q/K offset ⟂ drift, so that b is defined
    qh.query.centroid = Eigen::VectorXd::Unit(16, 2);
    L.q_heads = {qh, qh};
    qkgeom::synthetic::capture_spec cap;
    cap.n_examples = 300;
    cap.context_length = 4096;
    cap.buckets = {.scheme = qkgeom::bucket_scheme::uniform, .width = 256, .rate = 2.0};
    cap.seed = 5;
    auto const hc = qkgeom::synthetic::generate_head(L, cap, 1);
    auto const& tr = hc.truth;
    qkgeom::head_moments hm(32);
    hm.add(qkgeom::kind::query, hc.queries);
    hm.add(qkgeom::kind::key, hc.keys);
    auto const n = static_cast<double>(hc.queries.vectors.rows());
    REQUIRE(n > 5000);
    auto const q = hm.q.pooled(), k = hm.k.pooled(), pool = hm.pooled();

    // --- Householder: β, α and the rotated-basis scalars
    auto const h = qkgeom::householder(hm);
    Eigen::VectorXd const sd_q = q.cov_x().diagonal().cwiseSqrt();
    double const sd_t = std::sqrt(q.var_t());
    Eigen::VectorXd const se_beta = sd_q / (sd_t * std::sqrt(n));
    Eigen::VectorXd const se_alpha = sd_q * std::sqrt(1 / n + q.mean_t * q.mean_t / q.m2_t);
    CHECK(((h.beta - tr.beta).cwiseAbs().array() < 5 * se_beta.array()).all());
    CHECK(((h.alpha - tr.alpha).cwiseAbs().array() < 5 * se_alpha.array()).all());
    CHECK(std::abs(h.beta_pos - tr.beta_pos) < 5 * se_beta.norm());
    Eigen::VectorXd const bh = h.beta / h.beta_pos, bh_true = tr.beta / tr.beta_pos;
    double const se_a1 = std::sqrt(h.sigma2_pos * (1 / n + q.mean_t * q.mean_t / q.m2_t));
    CHECK(std::abs(h.alpha_pos - tr.alpha_pos) < 5 * se_a1 + (bh - bh_true).norm() * tr.alpha.norm());
    CHECK(std::abs(h.sigma2_pos - tr.sigma2_pos) < 5 * tr.sigma2_pos * std::sqrt(2 / n) + 1e-3);
    // H maps the estimated β̂ to e1 and is symmetric/orthogonal (dense check, d = 32)
    Eigen::MatrixXd const H = h.H.dense(32);
    CHECK((H * bh - Eigen::VectorXd::Unit(32, 0)).cwiseAbs().maxCoeff() < 1e-14);

    // --- Rotation: a, b, bias_strength, alpha_k, mu_q_a
    auto const r = qkgeom::planar_rotation(hm);
    REQUIRE(tr.a_defined);
    REQUIRE_FALSE(r.degenerate_a);
    REQUIRE_FALSE(r.degenerate_b);
    CHECK(std::abs(r.a.norm() - 1) < 1e-12);
    CHECK(std::abs(r.b.norm() - 1) < 1e-12);
    CHECK(std::abs(r.a.dot(r.b)) < 1e-12);
    CHECK(r.residual_pos_cov < 1e-10);
    double const N = static_cast<double>(pool.n);
    double const a_err = 5 * std::sqrt(pool.cov_x().trace() * pool.var_t()) / (std::sqrt(N) * pool.cov_xt().norm());
    CHECK((r.a - tr.a).norm() < a_err);
    double const nk = static_cast<double>(k.n);
    double const se_alpha_k = std::sqrt(r.a.dot(k.cov_x() * r.a) / (k.var_t() * nk));
    CHECK(std::abs(r.alpha_k - tr.alpha_k) < 5 * se_alpha_k);
    double const mu_err = 5 * std::sqrt(r.a.dot(q.cov_x() * r.a) / n) + (r.a - tr.a).norm() * tr.mu_q.norm();
    CHECK(std::abs(r.mu_q_a - tr.mu_q_a) < mu_err);
    CHECK(std::abs(r.bias_strength - tr.bias_strength) <
          mu_err * std::abs(tr.alpha_k) + std::abs(tr.mu_q_a) * 5 * se_alpha_k + mu_err * 5 * se_alpha_k);
    REQUIRE(tr.b_defined);
    // b ∝ P(μ_Q − μ_K): se of each mean difference coordinate ≈ sd·√(1/n_q + 1/n_k)
    double const se_delta = std::sqrt((q.cov_x().trace() / n + k.cov_x().trace() / nk));
    Eigen::VectorXd const pd_true = (tr.mu_q - tr.mu_k) - tr.a * tr.a.dot(tr.mu_q - tr.mu_k);
    CHECK((r.b - tr.b).norm() < 5 * se_delta / pd_true.norm() + 2 * (r.a - tr.a).norm());
}

TEST_CASE("the thesis' reversal: PCA favours Q, the drift axis favours K", "[geometry][synthetic][reversal]") {
    // Q/K centroid offset along the drift and along plain axis 1, where the
    // keys are noisy and the queries are not: PC0 tilts toward axis 1 and its
    // key correlation collapses, while on the drift axis a the keys, which
    // drift twice as fast, correlate more (thesis §4.2.3 and §6).
    qkgeom::synthetic::layer_spec L;
    L.d = 16;
    L.rotary_dims = 8;
    L.n_q_heads = 1;
    L.n_kv_heads = 1;
    qkgeom::synthetic::q_head_params qh;
    qh.query.intercept = 2.0;
    qh.query.slope = 1e-3;
    qh.query.centroid = Eigen::VectorXd::Unit(8, 1) * 3.0;
    qh.query.noise_axis_scale = Eigen::VectorXd::Ones(8);
    qh.query.noise_axis_scale(1) = 0.3;
    qkgeom::synthetic::kv_head_params kv;
    kv.key.intercept = -1.0;
    kv.key.slope = 2e-3;
    kv.key.centroid = Eigen::VectorXd::Unit(8, 1) * -3.0;
    kv.key.noise_axis_scale = Eigen::VectorXd::Ones(8);
    kv.key.noise_axis_scale(1) = 4.0;
    L.q_heads = {qh};
    L.kv_heads = {kv};
    qkgeom::synthetic::capture_spec cap;
    cap.n_examples = 200;
    cap.buckets = {.scheme = qkgeom::bucket_scheme::uniform, .width = 256, .rate = 2.0};
    auto const hc = qkgeom::synthetic::generate_head(L, cap, 0);
    auto const p = qkgeom::pca(hc.queries.vectors, hc.queries.position, hc.keys.vectors, hc.keys.position);
    auto const r = qkgeom::planar_rotation(hc.queries.vectors, hc.queries.position, hc.keys.vectors, hc.keys.position);
    INFO("PC0 r_q " << p.pc0_r_q << " r_k " << p.pc0_r_k << "; axis a r_q_a " << r.r_q_a << " r_k_a " << r.r_k_a);
    CHECK(std::abs(p.pc0_r_q) > std::abs(p.pc0_r_k) + 0.2);
    CHECK(std::abs(r.r_k_a) > std::abs(r.r_q_a) + 0.05);
    CHECK(std::abs(r.r_q_a - hc.truth.r_q_a) < 0.03);
    CHECK(std::abs(r.r_k_a - hc.truth.r_k_a) < 0.03);
    CHECK(p.taxonomy != qkgeom::head_class::position_dominated);
}

// ---------------------------------------------------------------------------
// Issue 14, classes 1 and 2: the input limit (method §9.18) and degenerate
// data as NaN plus a flag (method §9.17), on planted data.
// ---------------------------------------------------------------------------

namespace {

/// A synthetic head (d = 32 by default; rows grow with n_examples and rate).
qkgeom::synthetic::head_capture degenerate_base(std::int64_t n_examples = 24, double rate = 1.0, index_t d = 32) {
    qkgeom::synthetic::layer_spec L;
    L.d = d;
    L.rotary_dims = d / 2;
    L.n_q_heads = 1;
    L.n_kv_heads = 1;
    L.mix = true;
    qkgeom::synthetic::capture_spec cap;
    cap.n_examples = n_examples;
    cap.context_length = 1024;
    cap.buckets = {.scheme = qkgeom::bucket_scheme::uniform, .width = 128, .rate = rate};
    return qkgeom::synthetic::generate_head(L, cap, 0);
}

bool has_flag(qkgeom::head_analysis const& h, qkgeom::head_flag f) { return h.has(f); }

double metric(qkgeom::head_analysis const& h, std::string_view name) {
    auto const v = qkgeom::head_metric_values(h);
    for (std::size_t i = 0; i < v.size(); ++i)
        if (qkgeom::head_metric_names[i] == name) return v[i];
    FAIL("no metric " << name);
    return 0;
}

}  // namespace

TEST_CASE("input limit: |x| >= 2^128 is rejected with row, column, value and limit on every path", "[degenerate][limit]") {
    auto hc = degenerate_base(4);
    double const big = std::ldexp(1.0, 128);
    for (double bad : {1e154, big, -big, std::numeric_limits<double>::max()}) {
        auto h = hc;
        h.queries.vectors(3, 5) = bad;
        std::string const msg = qkgeom_test::invalid_argument_of([&] { (void)qkgeom::analyze_head(h); });
        INFO(msg);
        CHECK(msg.find("row 3, column 5") != std::string::npos);
        CHECK(msg.find("input limit |x| < 2^128") != std::string::npos);
        CHECK(msg.find("value") != std::string::npos);
        // streaming add
        qkgeom::bucketed_moments bm(h.queries.vectors.cols());
        CHECK(qkgeom_test::invalid_argument_of([&] { bm.add(h.queries.vectors, h.queries.position, h.queries.bucket); })
                  .find("row 3, column 5") != std::string::npos);
        CHECK(bm.count() == 0);
        qkgeom::moments m(h.queries.vectors.cols());
        CHECK(qkgeom_test::invalid_argument_of([&] { qkgeom::add_rows(m, h.queries.vectors, h.queries.position); })
                  .find("input limit") != std::string::npos);
    }
    // keys: both plasticity overloads and the moments overload of analyze_head
    auto const model = qkgeom::householder(hc.queries.vectors, hc.queries.position, hc.queries.bucket);
    auto h = hc;
    h.keys.vectors(7, 0) = -1e200;
    CHECK(qkgeom_test::invalid_argument_of([&] { (void)qkgeom::attention_plasticity(model, h); })
              .find("keys: rows: f64 value at row 7, column 0 is outside the input limit") != std::string::npos);
    CHECK(qkgeom_test::invalid_argument_of([&] { (void)qkgeom::attention_plasticity(model, h.keys, h.facts, h.id); })
              .find("row 7, column 0") != std::string::npos);
    qkgeom::head_moments hm(hc.queries.vectors.cols(), hc.id);
    hm.add(qkgeom::kind::query, hc.queries);
    hm.add(qkgeom::kind::key, hc.keys);
    CHECK(qkgeom_test::invalid_argument_of([&] { (void)qkgeom::analyze_head(hm, h.keys, h.facts); })
              .find("row 7, column 0 is outside the input limit") != std::string::npos);
    // moments holding an out-of-range mean (e.g. a hand-built shard)
    auto hm_bad = hm;
    hm_bad.q.buckets.begin()->second.mean_x(2) = 1e300;
    CHECK(qkgeom_test::invalid_argument_of([&] { (void)qkgeom::analyze_head(hm_bad, hc.keys, hc.facts); })
              .find("outside |x| < 2^128") != std::string::npos);
    // the largest value below the limit is accepted
    auto ok = hc;
    ok.queries.vectors(0, 0) = std::nextafter(big, 0.0);
    CHECK_NOTHROW(qkgeom::analyze_head(ok));
}

TEST_CASE("values just under the input limit keep every output finite and scale-invariant ones unchanged",
          "[degenerate][limit]") {
    auto const hc = degenerate_base(32, 16.0, 64);  // d = 64, about 4000 rows per kind
    double const m = std::max(hc.queries.vectors.cwiseAbs().maxCoeff(), hc.keys.vectors.cwiseAbs().maxCoeff());
    // a power of two: the scaled rows are exact, and the largest is in [2^126, 2^127)
    double const s = std::ldexp(1.0, 126 - std::ilogb(m));
    auto big = hc;
    big.queries.vectors *= s;
    big.keys.vectors *= s;
    REQUIRE(big.queries.vectors.cwiseAbs().maxCoeff() < std::ldexp(1.0, 128));
    REQUIRE(big.queries.vectors.cwiseAbs().maxCoeff() >= std::ldexp(1.0, 126));
    INFO("rows " << hc.queries.vectors.rows() << " x " << hc.queries.vectors.cols());
    REQUIRE(hc.queries.vectors.rows() >= 2000);
    auto const a = qkgeom::analyze_head(hc), b = qkgeom::analyze_head(big);
    auto const va = qkgeom::head_metric_values(a), vb = qkgeom::head_metric_values(b);
    for (std::size_t i = 0; i < va.size(); ++i) {
        INFO(qkgeom::head_metric_names[i] << ": " << va[i] << " vs " << vb[i]);
        CHECK(std::isnan(va[i]) == std::isnan(vb[i]));
        CHECK(!std::isinf(vb[i]));
    }
    CHECK(a.flags == b.flags);
    // scale-invariant metrics: the same numbers (power-of-two scaling is exact)
    for (auto name : {"q_R2_pos", "pos_ks_p", "sem_median_ks_p", "ap_overall", "ap_drop", "gaussian_gap", "r_q_a",
                      "r_k_a", "position_r", "var_frac_a", "plane_var_fraction", "pc0_r_q", "pc0_r_k",
                      "q_pos_var_frac", "k_pos_var_frac"}) {
        INFO(name << ": " << metric(a, name) << " vs " << metric(b, name));
        CHECK(std::isfinite(metric(b, name)));
        CHECK(std::abs(metric(a, name) - metric(b, name)) <= 1e-9 * std::max(1.0, std::abs(metric(a, name))));
    }
    CHECK(metric(b, "q_beta_norm") == Approx(metric(a, "q_beta_norm") * s).epsilon(1e-9));
}

TEST_CASE("identical query rows give NaN and flags, at every scale", "[degenerate]") {
    auto const hc = degenerate_base(8);
    std::mt19937_64 gen(7);
    std::normal_distribution<double> nd;
    Eigen::RowVectorXd v = Eigen::RowVectorXd::NullaryExpr(hc.queries.vectors.cols(), [&] { return nd(gen); });
    for (double scale : {1e-3, 1.0, 1e3}) {
        INFO("scale " << scale);
        auto h = hc;
        h.queries.vectors.rowwise() = v * scale;
        auto const r = qkgeom::analyze_head(h);
        using F = qkgeom::head_flag;
        for (auto name : {"pc0_r_q", "q_pos_var_frac", "r_q_a", "pos_skew", "pos_ks_p", "sem_median_ks_p",
                          "sem_frac_ks_reject", "ap_overall", "ap_drop"}) {
            INFO(name << " = " << metric(r, name));
            CHECK(std::isnan(metric(r, name)));
        }
        CHECK(r.pca.taxonomy == qkgeom::head_class::undefined);
        // β = 0 exactly: H = I, alpha_pos is the mean of coordinate 0 (method §9.7), R² of constants 0
        CHECK(metric(r, "q_beta_norm") == 0.0);
        CHECK(metric(r, "alpha_pos") == Approx(v(0) * scale).epsilon(1e-12));
        CHECK(metric(r, "q_R2_pos") == 0.0);
        CHECK(metric(r, "alpha_q") == 0.0);
        CHECK(metric(r, "sigma2_pos") == 0.0);
        for (F f : {F::q_constant, F::pc0_q_flat, F::q_beta_zero, F::pos_residual_degenerate, F::sem_degenerate,
                    F::no_plasticity_pairs})
            CHECK(has_flag(r, f));
        for (F f : {F::k_constant, F::q_positions_constant, F::k_positions_constant, F::pca_degenerate,
                    F::drift_degenerate})
            CHECK_FALSE(has_flag(r, f));
        // the keys are healthy: their metrics stay finite
        CHECK(std::isfinite(metric(r, "r_k_a")));
        CHECK(std::isfinite(metric(r, "k_pos_var_frac")));
        CHECK(qkgeom::head_flags_text(r).find("q_constant") == 0);
    }
}

TEST_CASE("identical key rows give NaN and flags", "[degenerate]") {
    auto const hc = degenerate_base(8);
    for (double scale : {1e-3, 1.0, 1e3}) {
        INFO("scale " << scale);
        auto h = hc;
        Eigen::RowVectorXd const v = hc.keys.vectors.row(0) * scale;
        h.keys.vectors.rowwise() = v;
        auto const r = qkgeom::analyze_head(h);
        using F = qkgeom::head_flag;
        for (auto name : {"pc0_r_k", "k_pos_var_frac", "r_k_a", "ap_overall"}) {
            INFO(name << " = " << metric(r, name));
            CHECK(std::isnan(metric(r, name)));
        }
        CHECK(metric(r, "alpha_k") == 0.0);
        CHECK(metric(r, "bias_strength") == 0.0);
        for (F f : {F::k_constant, F::pc0_k_flat, F::no_plasticity_pairs}) CHECK(has_flag(r, f));
        CHECK_FALSE(has_flag(r, F::q_constant));
        CHECK(std::isfinite(metric(r, "pc0_r_q")));
        CHECK(std::isfinite(metric(r, "pos_ks_p")));
        CHECK(r.plasticity.n_pairs_skipped > 0);
    }
}

TEST_CASE("queries and keys all the same vector: every closed form NaN, flagged", "[degenerate]") {
    auto h = degenerate_base(4);
    Eigen::RowVectorXd const v = h.queries.vectors.row(0);
    h.queries.vectors.rowwise() = v;
    h.keys.vectors.rowwise() = v;
    auto const r = qkgeom::analyze_head(h);
    using F = qkgeom::head_flag;
    for (F f : {F::q_constant, F::k_constant, F::pca_degenerate, F::drift_degenerate, F::separation_degenerate})
        CHECK(has_flag(r, f));
    for (auto name : {"pc0_r_q", "pc0_r_k", "r_q_a", "r_k_a", "position_r", "var_frac_a", "separation_strength"})
        CHECK(std::isnan(metric(r, name)));
}

TEST_CASE("a query coordinate constant, or positions constant: its R² is 0, flags name the cause", "[degenerate]") {
    auto h = degenerate_base(8);
    h.queries.vectors.col(3).setConstant(0.7);
    auto const r = qkgeom::analyze_head(h);
    CHECK(r.householder.component_r2(3) == 0.0);
    CHECK(r.householder.component_weight(3) == 0.0);
    CHECK(r.flags == 0);
    // every key at one position (bucket 0): the key position correlations are undefined
    auto hk = degenerate_base(8);
    std::fill(hk.keys.position.values().begin(), hk.keys.position.values().end(), 5);
    std::fill(hk.keys.bucket.values().begin(), hk.keys.bucket.values().end(), 0);
    auto const rk = qkgeom::analyze_head(hk);
    CHECK(rk.has(qkgeom::head_flag::k_positions_constant));
    CHECK(rk.has(qkgeom::head_flag::pc0_k_flat));
    CHECK(std::isnan(metric(rk, "pc0_r_k")));
    CHECK(std::isnan(metric(rk, "k_pos_var_frac")));
    CHECK(std::isnan(metric(rk, "alpha_k")));
    CHECK(std::isnan(metric(rk, "r_k_a")));
    // key bucket 0 is earlier than every later query bucket: the plasticity is defined
    CHECK_FALSE(rk.has(qkgeom::head_flag::no_plasticity_pairs));
    CHECK(std::isfinite(metric(rk, "ap_overall")));
}

TEST_CASE("data just above the zero threshold stays finite (the threshold is not too coarse)", "[degenerate]") {
    auto const hc = degenerate_base(8);
    // every query row = a large common vector + the head's own spread: relative
    // variance ~1e-12 per coordinate, far above 16 ε but far below 1
    Eigen::RowVectorXd const off = Eigen::RowVectorXd::Constant(hc.queries.vectors.cols(), 1e6);
    auto h = hc;
    h.queries.vectors.rowwise() += off;
    h.keys.vectors.rowwise() += off;
    auto const a = qkgeom::analyze_head(hc), b = qkgeom::analyze_head(h);
    CHECK(b.flags == a.flags);
    // translation-invariant metrics agree to the rounding of the shifted inputs
    for (auto name : {"q_R2_pos", "q_beta_norm", "sigma2_pos", "pos_ks_p", "sem_median_ks_p", "r_q_a", "r_k_a",
                      "pc0_r_q", "pc0_r_k", "q_pos_var_frac", "k_pos_var_frac", "position_r"}) {
        INFO(name << ": " << metric(a, name) << " vs " << metric(b, name));
        REQUIRE(std::isfinite(metric(b, name)));
        CHECK(std::abs(metric(a, name) - metric(b, name)) <= 1e-5 * std::max(1.0, std::abs(metric(a, name))));
    }
    CHECK(std::isfinite(metric(b, "ap_overall")));
    // a tiny spread, 3e-7 relative (5 float32 ulps): still a variance
    auto t = hc;
    Eigen::RowVectorXd const v = hc.queries.vectors.row(0);
    for (index_t i = 0; i < t.queries.vectors.rows(); ++i)
        t.queries.vectors.row(i) = v * (1.0 + 3e-7 * std::sin(double(i)));
    auto const rt = qkgeom::analyze_head(t);
    CHECK_FALSE(rt.has(qkgeom::head_flag::q_constant));
    CHECK(std::isfinite(metric(rt, "q_pos_var_frac")));
}

TEST_CASE("householder_diagnostics on no rows: NaN and flags, no exception", "[degenerate]") {
    auto const hc = degenerate_base(4);
    auto const model = qkgeom::householder(hc.queries.vectors, hc.queries.position, hc.queries.bucket);
    Eigen::MatrixXd const none(0, hc.queries.vectors.cols());
    std::vector<std::int64_t> const no_pos;
    auto const d = qkgeom::householder_diagnostics(model, none, no_pos);
    CHECK(std::isnan(d.pos_ks_p));
    CHECK(std::isnan(d.sem_median_ks_p));
    CHECK(d.pos_degenerate);
    CHECK(d.sem_degenerate);
    auto const full = qkgeom::householder_diagnostics(model, hc.queries.vectors, hc.queries.position);
    CHECK_FALSE(full.pos_degenerate);
    CHECK_FALSE(full.sem_degenerate);
}

TEST_CASE("analyze_head from moments: clear errors for missing or mismatched keys", "[degenerate]") {
    auto const hc = degenerate_base(4);
    qkgeom::head_moments hm(hc.queries.vectors.cols(), hc.id);
    hm.add(qkgeom::kind::query, hc.queries);
    CHECK(qkgeom_test::invalid_argument_of([&] { (void)qkgeom::analyze_head(hm, hc.keys, hc.facts); })
              .find("no key rows in the head's moments") != std::string::npos);
    hm.add(qkgeom::kind::key, hc.keys);
    auto const r = qkgeom::analyze_head(hm, hc.keys, hc.facts);
    CHECK(r.id == hc.id);
    // keys of another dimension, or another row count, than the key moments
    auto fewer = hc.keys;
    fewer.vectors = hc.keys.vectors.topRows(hc.keys.vectors.rows() - 1);
    fewer.position.values().pop_back();
    fewer.bucket.values().pop_back();
    fewer.example_id.values().pop_back();
    CHECK(qkgeom_test::invalid_argument_of([&] { (void)qkgeom::analyze_head(hm, fewer, hc.facts); })
              .find("row count differs from the key moments") != std::string::npos);
    auto narrow = hc.keys;
    narrow.vectors = hc.keys.vectors.leftCols(hc.keys.vectors.cols() - 1);
    CHECK(qkgeom_test::invalid_argument_of([&] { (void)qkgeom::analyze_head(hm, narrow, hc.facts); })
              .find("keys: head dimension differs from the moments' d = 32") != std::string::npos);
}

TEST_CASE("moments: negative dimension and an empty shard of another dimension are rejected", "[degenerate][moments]") {
    CHECK(qkgeom_test::invalid_argument_of([] { qkgeom::moments m(-1); }).find("d must be >= 0") != std::string::npos);
    qkgeom::bucketed_moments a(4);
    qkgeom::bucketed_moments const empty5(5);
    CHECK(qkgeom_test::invalid_argument_of([&] { a += empty5; }).find("head dimension mismatch") != std::string::npos);
    CHECK(a.d == 4);
    qkgeom::bucketed_moments z;
    z += empty5;
    CHECK(z.d == 5);
}

}  // namespace qkgeom_tests_geometry_test
