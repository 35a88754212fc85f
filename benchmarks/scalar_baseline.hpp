// qkgeom benchmarks — the baseline: a straightforward scalar implementation
// of the same per-head analysis, written the way a first research script in
// C++ would be (the reference point "scalar baseline" of issue 7):
//
//  * moments: per bucket, rows widened to double, a mean pass and a
//    co-moment pass with a plain triple loop over the full d × d matrix;
//  * the closed forms (PCA eigen-decomposition, rotation, Householder model)
//    are O(d³) per head and taken from the library, as a script would call a
//    linear-algebra package;
//  * diagnostics: H formed densely, every query row rotated by a d × d
//    matrix-vector product, then skew/kurtosis loops and the same KS test;
//  * plasticity: every admissible pair evaluated directly (δ, m, v, Φ), the
//    empirical check by looping over the bucket's queries and forming both
//    dot products per query, the heatmap bin found by a linear scan.
//
// It computes the same numbers (ap_overall, gaussian_gap, pos_ks_p, ...) as
// the library, which the benchmark checks once before timing.
#pragma once

#include "workload.hpp"

#include <qkgeom/geometry/householder.hpp>
#include <qkgeom/geometry/pca.hpp>
#include <qkgeom/geometry/rotation.hpp>
#include <qkgeom/stats/gaussian.hpp>
#include <qkgeom/stats/kolmogorov.hpp>

#include <cmath>
#include <map>
#include <vector>

namespace qkbench::scalar {

struct result {
    double ap_overall = qkgeom::detail::nan;
    double gaussian_gap = qkgeom::detail::nan;
    double pos_ks_p = qkgeom::detail::nan;
    double sem_median_ks_p = qkgeom::detail::nan;
    double pc0_r_q = qkgeom::detail::nan;
    double bias_strength = qkgeom::detail::nan;
    std::int64_t n_pairs = 0;
};

/// Naive per-bucket moments of one kind (full d × d triple loop).
inline qkgeom::bucketed_moments naive_moments(rows_f32 const& x, std::vector<std::int64_t> const& pos,
                                              std::vector<std::int64_t> const& bucket) {
    index_t const d = x.cols();
    std::map<std::int64_t, std::vector<index_t>> rows_of;
    for (index_t i = 0; i < x.rows(); ++i) rows_of[bucket[static_cast<std::size_t>(i)]].push_back(i);
    qkgeom::bucketed_moments bm(d);
    std::vector<double> xc(static_cast<std::size_t>(d), 0.0);
    for (auto const& [b, rows] : rows_of) {
        qkgeom::moments m(d);
        double const n = double(rows.size());
        m.n = std::int64_t(rows.size());
        for (index_t i : rows) {
            double const t = double(pos[static_cast<std::size_t>(i)]);
            m.mean_t += t / n;
            m.t_min = std::min(m.t_min, t);
            m.t_max = std::max(m.t_max, t);
            for (index_t a = 0; a < d; ++a) m.mean_x(a) += double(x(i, a)) / n;
        }
        for (index_t i : rows) {
            double const tc = double(pos[static_cast<std::size_t>(i)]) - m.mean_t;
            m.m2_t += tc * tc;
            for (index_t a = 0; a < d; ++a) xc[static_cast<std::size_t>(a)] = double(x(i, a)) - m.mean_x(a);
            for (index_t a = 0; a < d; ++a) {
                m.c_xt(a) += xc[static_cast<std::size_t>(a)] * tc;
                for (index_t c = 0; c < d; ++c) m.c_xx(a, c) += xc[static_cast<std::size_t>(a)] * xc[static_cast<std::size_t>(c)];
            }
        }
        bm.buckets.emplace(b, std::move(m));
    }
    return bm;
}

inline double dot(double const* a, double const* b, index_t d) {
    double s = 0;
    for (index_t i = 0; i < d; ++i) s += a[i] * b[i];
    return s;
}

/// Linear-scan bin of a half-open grid with the last bin closed (method §9.13).
inline index_t bin_of(std::vector<double> const& e, double v) {
    for (std::size_t j = 0; j + 1 < e.size(); ++j)
        if (v >= e[j] && (v < e[j + 1] || (j + 2 == e.size() && v == e[j + 1]))) return index_t(j);
    return -1;
}

/// The whole per-head analysis, default options (same_bucket, exact, diag
/// model, diagnostics and empirical check on), uniform buckets.
inline result analyze(head_data const& h, std::int64_t context_length) {
    rows_f32 const& q = h.queries.vectors;
    rows_f32 const& k = h.keys.vectors;
    std::vector<std::int64_t> const& q_position = h.queries.position.values();
    std::vector<std::int64_t> const& q_bucket = h.queries.bucket.values();
    std::vector<std::int64_t> const& k_position = h.keys.position.values();
    std::vector<std::int64_t> const& k_bucket = h.keys.bucket.values();
    std::vector<std::int64_t> const& k_example = h.keys.example_id.values();
    index_t const d = q.cols();
    qkgeom::head_moments hm(d, h.id);
    hm.q = naive_moments(q, q_position, q_bucket);
    hm.k = naive_moments(k, k_position, k_bucket);
    result out;
    auto const p = qkgeom::pca(hm);
    auto const rot = qkgeom::planar_rotation(hm);
    auto const model = qkgeom::householder(hm);
    out.pc0_r_q = p.pc0_r_q;
    out.bias_strength = rot.bias_strength;
    Eigen::MatrixXd const H = model.H.dense(d);

    // --- diagnostics: coordinate-1 residual and the first min(64, d−1) semantic coordinates
    index_t const nq = q.rows(), msem = std::min<index_t>(64, d - 1);
    Eigen::VectorXd const bh = model.beta / model.beta_pos;
    std::vector<std::vector<double>> cols(static_cast<std::size_t>(msem + 1), std::vector<double>(static_cast<std::size_t>(nq)));
    std::vector<double> row(static_cast<std::size_t>(d)), y(static_cast<std::size_t>(d));
    for (index_t i = 0; i < nq; ++i) {
        for (index_t a = 0; a < d; ++a) row[static_cast<std::size_t>(a)] = double(q(i, a));
        for (index_t a = 0; a < d; ++a) {
            double s = 0;
            for (index_t c = 0; c < d; ++c) s += H(a, c) * row[static_cast<std::size_t>(c)];
            y[static_cast<std::size_t>(a)] = s;
        }
        cols[0][static_cast<std::size_t>(i)] =
            dot(bh.data(), row.data(), d) - model.alpha_pos - model.beta_pos * double(q_position[static_cast<std::size_t>(i)]);
        for (index_t j = 1; j <= msem; ++j) cols[static_cast<std::size_t>(j)][static_cast<std::size_t>(i)] = y[static_cast<std::size_t>(j)];
    }
    std::vector<double> ps;
    for (index_t j = 0; j <= msem; ++j) {
        auto& c = cols[static_cast<std::size_t>(j)];
        double mean = 0, sd = 0;
        if (j == 0) {
            sd = std::sqrt(model.sigma2_pos);
        } else {
            for (double v : c) mean += v;
            mean /= double(nq);
            for (double v : c) sd += (v - mean) * (v - mean);
            sd = std::sqrt(sd / double(nq - 1));
        }
        for (double& v : c) v = (v - mean) / sd;
        double const pv = qkgeom::ks_test_normal(c).pvalue;
        if (j == 0) out.pos_ks_p = pv;
        else ps.push_back(pv);
    }
    out.sem_median_ks_p = qkgeom::detail::median(ps);

    // --- plasticity, same_bucket, exact
    index_t const nk = k.rows();
    std::vector<double> krot(static_cast<std::size_t>(nk * d)), korig(static_cast<std::size_t>(nk * d));
    for (index_t i = 0; i < nk; ++i) {
        for (index_t a = 0; a < d; ++a) korig[static_cast<std::size_t>(i * d + a)] = double(k(i, a));
        for (index_t a = 0; a < d; ++a) {
            double s = 0;
            for (index_t c = 0; c < d; ++c) s += H(a, c) * korig[static_cast<std::size_t>(i * d + c)];
            krot[static_cast<std::size_t>(i * d + a)] = s;
        }
    }
    std::map<std::int64_t, std::vector<index_t>> q_of;
    for (index_t i = 0; i < nq; ++i) q_of[q_bucket[static_cast<std::size_t>(i)]].push_back(i);
    std::map<std::int64_t, std::map<std::int64_t, std::vector<index_t>>> groups;
    for (index_t i = 0; i < nk; ++i) groups[k_bucket[static_cast<std::size_t>(i)]][k_example[static_cast<std::size_t>(i)]].push_back(i);
    auto const L = double(context_length);
    std::vector<double> de(17), oe(17);
    for (int i = 0; i <= 16; ++i) {
        de[static_cast<std::size_t>(i)] = L * i / 16;
        oe[static_cast<std::size_t>(i)] = -L + 2 * L * i / 16;
    }
    Eigen::MatrixXd heat = Eigen::MatrixXd::Zero(16, 16);
    double wsum = 0, wap = 0, gap = 0;
    std::int64_t ngap = 0;
    std::vector<double> delta(static_cast<std::size_t>(d)), qd(static_cast<std::size_t>(d));
    for (auto const& s : model.buckets) {
        if (!s.used) continue;
        auto const& qrows = q_of[s.bucket];
        double sum_cells = 0, sum_emp = 0;
        std::int64_t n_cells = 0;
        for (auto const& [c, g] : groups) {
            if (c >= s.bucket) break;
            double cs = 0, ce = 0;
            std::int64_t cn = 0;
            for (auto const& [ex, idx] : g)
                for (std::size_t a = 0; a < idx.size(); ++a)
                    for (std::size_t b = a + 1; b < idx.size(); ++b) {
                        index_t const i = idx[a], j = idx[b];
                        for (index_t u = 0; u < d; ++u)
                            delta[static_cast<std::size_t>(u)] = krot[static_cast<std::size_t>(i * d + u)] - krot[static_cast<std::size_t>(j * d + u)];
                        double m = 0, v = 0;
                        for (index_t u = 0; u < d; ++u) {
                            m += s.mean(u) * delta[static_cast<std::size_t>(u)];
                            v += delta[static_cast<std::size_t>(u)] * delta[static_cast<std::size_t>(u)] * s.var(u);
                        }
                        if (!(v > 0)) continue;
                        double const pp = qkgeom::pairwise_plasticity(m / std::sqrt(v));
                        cs += pp;
                        ++cn;
                        double const ti = double(k_position[static_cast<std::size_t>(i)]), tj = double(k_position[static_cast<std::size_t>(j)]);
                        index_t const bx = bin_of(de, std::abs(ti - tj)), by = bin_of(oe, s.tau - 0.5 * (ti + tj));
                        if (bx >= 0 && by >= 0) heat(bx, by) += pp;
                        std::int64_t wins = 0;
                        for (index_t r : qrows) {
                            for (index_t u = 0; u < d; ++u) qd[static_cast<std::size_t>(u)] = double(q(r, u));
                            double const si = dot(qd.data(), &korig[static_cast<std::size_t>(i * d)], d);
                            double const sj = dot(qd.data(), &korig[static_cast<std::size_t>(j * d)], d);
                            wins += si > sj ? 1 : 0;
                        }
                        double const ph = double(wins) / double(qrows.size());
                        ce += 4 * ph * (1 - ph) * double(qrows.size()) / double(qrows.size() - 1);
                    }
            out.n_pairs += cn;
            if (cn == 0) continue;
            sum_cells += cs / double(cn);
            sum_emp += ce / double(cn);
            ++n_cells;
        }
        if (n_cells == 0) continue;
        double const ap = sum_cells / double(n_cells), ape = sum_emp / double(n_cells);
        wsum += double(s.n_queries);
        wap += double(s.n_queries) * ap;
        gap += std::abs(ap - ape);
        ++ngap;
    }
    volatile double sink = heat.sum();  // the heatmap is part of the work
    (void)sink;
    if (wsum > 0) out.ap_overall = wap / wsum;
    if (ngap > 0) out.gaussian_gap = gap / double(ngap);
    return out;
}

}  // namespace qkbench::scalar
