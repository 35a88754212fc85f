// qkgeom — the Gaussian closed form of attention plasticity (method §5) and
// its enumeration (method §6): per key pair (i, j) and query bucket b with
// rotated-basis mean w_b and variances V_b = diag(σ²_pos, σ²_b) (or
// blockdiag(σ²_pos, Σ_b)), and rotated keys k̃ = H k:
//   m = w_b·(k̃_i − k̃_j) = s_i − s_j,        s_i = w_b·k̃_i
//   v = (k̃_i − k̃_j)ᵀ V_b (k̃_i − k̃_j) = n_i + n_j − 2 g_ij,  g_ij = k̃_iᵀ V_b k̃_j
//   PP = 4 Φ(−|z|)(1 − Φ(−|z|)),  z = m/√v
// Small groups of keys are evaluated pair by pair ("direct"); groups with at
// least `dense_min_keys` keys form the weighted Gram matrix G = K̃ V_b K̃ᵀ
// tile by tile (GEMM) followed by an element-wise Φ ("dense"); both give the
// same PP to rounding (tested to 1e-12). Sampled enumeration draws pairs per
// cell with a seed of (head stream, b, c); the head stream mixes the options'
// seed with the head's identity (`head_stream_seed`, pair_plan.hpp).
// IWYU pragma: private, include <qkgeom/attention_plasticity.hpp>
#pragma once

#include <qkgeom/buckets.hpp>
#include <qkgeom/config.hpp>
#include <qkgeom/gaussian.hpp>
#include <qkgeom/plasticity/empirical.hpp>
#include <qkgeom/plasticity/options.hpp>
#include <qkgeom/plasticity/rows.hpp>
#include <qkgeom/plasticity/split.hpp>
#include <qkgeom/simd/sse2.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
#include <emmintrin.h>
#define QKGEOM_DETAIL_SPLIT_SSE2 1
#endif

namespace qkgeom::detail {

/// Accumulates one cell.
struct cell_acc {
    double sum = 0, sumsq = 0, emp_sum = 0;
    std::int64_t n = 0, emp_n = 0;
    split_acc split;  ///< the split pass (docs/beyond-split.md), when the bucket's split model is on
};

/// PP of a counterfactual (m, v): the closed form when v > 0; v ≤ 0 (the
/// counterfactual variance vanishes along δ) gives the limit PP = 0 for
/// m ≠ 0 and PP = 1 (a tie) for m = 0, counted in `degenerate`.
inline double split_pp(double m, double v, std::int64_t& degenerate) noexcept {
    if (v > 0) return pairwise_plasticity(m / std::sqrt(v));
    ++degenerate;
    return m == 0 ? 1.0 : 0.0;
}

/// Content sums over l = 1..d−1 of δ = a − b: Σ w δ, Σ s2 δ², Σ wf δ, Σ s2f δ²
/// (two lanes × two partial sums each, then the scalar tail).
inline void split_content_sums(double const* a, double const* b, double const* w, double const* s2,
                               double const* wf, double const* s2f, index_t d, double out[4]) noexcept {
    double m = 0, v = 0, mf = 0, vf = 0;
    index_t l = 1;
#ifdef QKGEOM_DETAIL_SPLIT_SSE2
    __m128d m0 = _mm_setzero_pd(), v0 = m0, f0 = m0, g0 = m0, m1 = m0, v1 = m0, f1 = m0, g1 = m0;
    for (; l + 4 <= d; l += 4) {
        __m128d const d0 = _mm_sub_pd(_mm_loadu_pd(a + l), _mm_loadu_pd(b + l));
        __m128d const d1 = _mm_sub_pd(_mm_loadu_pd(a + l + 2), _mm_loadu_pd(b + l + 2));
        __m128d const q0 = _mm_mul_pd(d0, d0), q1 = _mm_mul_pd(d1, d1);
        m0 = _mm_add_pd(m0, _mm_mul_pd(_mm_loadu_pd(w + l), d0));
        m1 = _mm_add_pd(m1, _mm_mul_pd(_mm_loadu_pd(w + l + 2), d1));
        v0 = _mm_add_pd(v0, _mm_mul_pd(_mm_loadu_pd(s2 + l), q0));
        v1 = _mm_add_pd(v1, _mm_mul_pd(_mm_loadu_pd(s2 + l + 2), q1));
        f0 = _mm_add_pd(f0, _mm_mul_pd(_mm_loadu_pd(wf + l), d0));
        f1 = _mm_add_pd(f1, _mm_mul_pd(_mm_loadu_pd(wf + l + 2), d1));
        g0 = _mm_add_pd(g0, _mm_mul_pd(_mm_loadu_pd(s2f + l), q0));
        g1 = _mm_add_pd(g1, _mm_mul_pd(_mm_loadu_pd(s2f + l + 2), q1));
    }
    alignas(16) double r[8];
    _mm_store_pd(r, _mm_add_pd(m0, m1));
    _mm_store_pd(r + 2, _mm_add_pd(v0, v1));
    _mm_store_pd(r + 4, _mm_add_pd(f0, f1));
    _mm_store_pd(r + 6, _mm_add_pd(g0, g1));
    m = r[0] + r[1], v = r[2] + r[3], mf = r[4] + r[5], vf = r[6] + r[7];
#endif
    for (; l < d; ++l) {
        double const dl = a[l] - b[l];
        m += w[l] * dl;
        v += s2[l] * (dl * dl);
        mf += wf[l] * dl;
        vf += s2f[l] * (dl * dl);
    }
    out[0] = m, out[1] = v, out[2] = mf, out[3] = vf;
}

/// Records one pair in `acc` from δ₁ and the content sums c = (m_con, v_con,
/// m_con,frozen, v_con,frozen): w0 = w_b[0], s0 = σ²_pos.
inline void split_record(split_model const& sm, double d1, double w0, double s0, double const c[4], split_acc& acc) {
    double const mpos = w0 * d1, vpos = s0 * (d1 * d1), mnd = sm.alpha_pos * d1;
    double const v = vpos + c[1];
    acc.act += split_pp(mpos + c[0], v, acc.degenerate);
    acc.nd += split_pp(mnd + c[0], v, acc.degenerate);
    if (sm.frozen) {
        double const vf = vpos + c[3];
        acc.fr += split_pp(mpos + c[2], vf, acc.degenerate);
        acc.ne += split_pp(mnd + c[2], vf, acc.degenerate);
    }
    acc.mpos2 += mpos * mpos;
    acc.mcon2 += c[0] * c[0];
    acc.vpos += vpos;
    acc.vcon += c[1];
    ++acc.n;
}

/// The split bucket of query bucket `b`: `pooled` the sums over its pairs,
/// `cell_sum` the sums over its `n_cells` non-empty cells of the four
/// profiles' cell means (AP_b = their mean, method §9.10–9.11); the
/// frozen-content fields stay NaN unless `frozen`.
inline split_bucket finish_split_bucket(std::int64_t b, split_acc const& pooled, double const cell_sum[4],
                                        std::int64_t n_cells, bool frozen) {
    split_bucket sb;
    sb.q_bucket = b;
    if (pooled.n == 0 || n_cells == 0) return sb;
    auto const n = double(pooled.n), nc = double(n_cells);
    sb.pos_mean_rms = std::sqrt(pooled.mpos2 / n);
    sb.content_mean_rms = std::sqrt(pooled.mcon2 / n);
    sb.pos_var = pooled.vpos / n;
    sb.content_var = pooled.vcon / n;
    sb.ap = cell_sum[0] / nc;
    sb.ap_no_drift = cell_sum[1] / nc;
    if (frozen) {
        sb.ap_frozen_content = cell_sum[2] / nc;
        sb.ap_neither = cell_sum[3] / nc;
    }
    return sb;
}


/// Everything one query bucket needs to evaluate pairs: its Gaussian model
/// in the rotated basis and its empirical side.
struct bucket_eval {
    Eigen::VectorXd w;     ///< rotated mean
    Eigen::VectorXd var;   ///< diag variances (diag / global_linear)
    Eigen::MatrixXd V;     ///< full: d × d blockdiag(σ²_pos, Σ_b); empty otherwise
    double tau = nan;
    empirical_bucket emp;  ///< the cross-check (inactive without ≥ 2 query rows)
    split_model split;     ///< the counterfactual models of the split (off unless evaluate_plasticity sets it)
};

/// Evaluates and records the pairs of one head: the closed form of a pair,
/// its cell accumulators, its heatmap bin and its empirical count. (A class
/// template, instantiated on use.)
template <class = void>
class pair_evaluator_t {
public:
    pair_evaluator_t(key_store const& keys, plasticity_heatmap& hm, std::int64_t& skipped, empirical_check& emp)
        : k_(keys), hm_(hm), skipped_(skipped), emp_(emp), dist_(hm.distance_edges), offs_(hm.offset_edges) {}

    /// The closed form of one pair, direct path. Returns false (and counts it)
    /// when the keys are identical (v ≤ 0).
    /// Identical keys give v = 0 and are skipped by the same test as v < 0.
    bool pp_direct(bucket_eval const& e, index_t i, index_t j, double& pp) {
        double m = 0, v = 0;
        if (e.V.size() != 0) {
            auto& delta = delta_;  // member scratch: no allocation per pair
            delta = (k_.rot.row(i) - k_.rot.row(j)).transpose();
            m = e.w.dot(delta);
            vdelta_.noalias() = e.V * delta;
            v = delta.dot(vdelta_);
        } else {
            // m = w·δ and v = Σ var_l δ_l² in one pass, δ never stored
            sse2::diag_pair_moments(k_.rot.row(i).data(), k_.rot.row(j).data(), e.w.data(), e.var.data(), k_.d, m, v);
        }
        if (!(v > 0)) return false;
        pp = pairwise_plasticity(m / std::sqrt(v));
        return true;
    }

    /// Record an evaluated pair: cell accumulators, heatmap, empirical value.
    void record(bucket_eval const& e, index_t i, index_t j, double pp, cell_acc& acc) {
        acc.sum += pp;
        acc.sumsq += pp * pp;
        ++acc.n;
        if (e.split.on) split_pair(e, i, j, acc);
        double const ti = static_cast<double>(k_.position[static_cast<std::size_t>(i)]);
        double const tj = static_cast<double>(k_.position[static_cast<std::size_t>(j)]);
        bin(std::abs(ti - tj), e.tau - 0.5 * (ti + tj), pp);
        if (!e.emp.active()) return;
        // method §9.14: the fraction of the bucket's queries whose score for key i
        // is strictly larger than for key j (original basis).
        std::int64_t const wins = emp_.wins(e.emp, i, j);
        double const p = static_cast<double>(wins) / static_cast<double>(e.emp.nq);
        acc.emp_sum += 4.0 * p * (1.0 - p) * e.emp.emp_scale;
        ++acc.emp_n;
    }

    void skip() { ++skipped_; }

    /// The split pass of one evaluated pair (docs/beyond-split.md): the four
    /// profiles' PP and the parts of m and v, into `acc.split`.
    void split_pair(bucket_eval const& e, index_t i, index_t j, cell_acc& acc) {
        split_model const& sm = e.split;
        index_t const d = k_.d;
        double const* a = k_.rot.row(i).data();
        double const* b = k_.rot.row(j).data();
        double c[4] = {0, 0, 0, 0};
        if (e.V.size() == 0) {
            bool const f = sm.frozen;
            split_content_sums(a, b, e.w.data(), e.var.data(), f ? sm.wf.data() : e.w.data(),
                               f ? sm.varf.data() : e.var.data(), d, c);
            split_record(sm, a[0] - b[0], e.w(0), e.var(0), c, acc.split);
            return;
        }
        delta_ = (k_.rot.row(i) - k_.rot.row(j)).transpose();  // full: O(d²) per pair, as pp_direct
        auto const t = delta_.tail(d - 1);
        c[0] = e.w.tail(d - 1).dot(t);
        vdelta_.noalias() = e.V.bottomRightCorner(d - 1, d - 1) * t;
        c[1] = t.dot(vdelta_.head(d - 1));
        if (sm.frozen) {
            c[2] = sm.wf.tail(d - 1).dot(t);
            if (sm.pref != nullptr) {  // Σ_ref δ₂:d = P_i − P_j
                double const* pi = sm.pref + i * (d - 1);
                double const* pj = sm.pref + j * (d - 1);
                for (index_t l = 0; l < d - 1; ++l) c[3] += t(l) * (pi[l] - pj[l]);
            } else {
                vdelta_.noalias() = sm.covf * t;
                c[3] = t.dot(vdelta_.head(d - 1));
            }
        }
        split_record(sm, delta_(0), e.w(0), e.V(0, 0), c, acc.split);
    }

    /// Dense path without the empirical check: the pairs (i_a, j), a < n, in
    /// order, skipping those with skip[a] ≠ 0; t_i[a] and t_j are the keys'
    /// positions. The same additions in the same order as `record` pair by pair
    /// (bit-identical), with the running sums and heatmap bin in registers.
    void record_column(bucket_eval const& e, double const* t_i, double t_j, double const* pp,
                       unsigned char const* skip, index_t n, cell_acc& acc) {
        double sum = acc.sum, sumsq = acc.sumsq;
        std::int64_t cnt = 0, outside = 0, hc = 0;
        index_t hx = -1, hy = -1, cur_x = -1, cur_y = -1;
        double hs = 0;
        for (index_t a = 0; a < n; ++a) {
            if (skip[a] != 0) continue;
            double const p = pp[a];
            sum += p;
            sumsq += p * p;
            ++cnt;
            double const ti = t_i[a];
            index_t const bx = dist_.locate_hint(std::abs(ti - t_j), hx);
            index_t const by = offs_.locate_hint(e.tau - 0.5 * (ti + t_j), hy);
            if (bx < 0 || by < 0) {
                ++outside;
                continue;
            }
            hx = bx;
            hy = by;
            if (bx != cur_x || by != cur_y) {
                if (cur_x >= 0) {
                    hm_.sum(cur_x, cur_y) = hs;
                    hm_.count(cur_x, cur_y) += hc;
                }
                cur_x = bx;
                cur_y = by;
                hs = hm_.sum(bx, by);
                hc = 0;
            }
            hs += p;
            ++hc;
        }
        if (cur_x >= 0) {
            hm_.sum(cur_x, cur_y) = hs;
            hm_.count(cur_x, cur_y) += hc;
        }
        acc.sum = sum;
        acc.sumsq = sumsq;
        acc.n += cnt;
        hm_.n_outside += outside;
    }

private:
    /// Bin lookup on a grid of edges (half-open bins, the last one closed;
    /// method §9.13). Equally spaced grids (the default) take a first guess by
    /// arithmetic and correct it against the stored edges, so the result is
    /// exactly that of a binary search; other grids use the binary search.
    struct grid {
        std::vector<double> const& e;
        double lo = 0, scale = 0;
        bool uniform = false;
        explicit grid(std::vector<double> const& edges) : e(edges) {
            if (e.size() < 2) return;
            auto const bins = static_cast<double>(e.size() - 1);
            lo = e.front();
            scale = bins / (e.back() - e.front());
            uniform = std::isfinite(scale);
        }
        [[nodiscard]] index_t locate(double v) const {
            if (e.size() < 2 || !(v >= e.front()) || !(v <= e.back())) return -1;
            auto const last = static_cast<index_t>(e.size()) - 2;
            if (v == e.back()) return last;  // last bin closed
            if (!uniform) {
                auto const it = std::upper_bound(e.begin(), e.end(), v);
                return static_cast<index_t>(it - e.begin()) - 1;
            }
            auto j = static_cast<index_t>((v - lo) * scale);
            j = std::clamp<index_t>(j, 0, last);
            while (j > 0 && v < e[static_cast<std::size_t>(j)]) --j;
            while (j < last && v >= e[static_cast<std::size_t>(j + 1)]) ++j;
            return j;
        }
        /// `locate(v)`, trying bin h (≥ 0) first.
        [[nodiscard]] index_t locate_hint(double v, index_t h) const {
            if (h >= 0 && v >= e[static_cast<std::size_t>(h)] && v < e[static_cast<std::size_t>(h + 1)]) return h;
            return locate(v);
        }
    };

    void bin(double x, double y, double pp) {
        index_t const a = dist_.locate(x), c = offs_.locate(y);
        if (a < 0 || c < 0) {
            ++hm_.n_outside;
            return;
        }
        hm_.sum(a, c) += pp;
        ++hm_.count(a, c);
    }

    key_store const& k_;
    plasticity_heatmap& hm_;
    std::int64_t& skipped_;
    empirical_check& emp_;
    grid dist_, offs_;
    Eigen::VectorXd delta_, vdelta_;
};

using pair_evaluator = pair_evaluator_t<>;

/// The weighted Gram matrix of one dense group of rotated keys K̃ (m × d) for
/// one query bucket (method §5): s = K̃ w, B = K̃ V, n_i = (B ⊙ K̃) 1, and
/// G = B K̃ᵀ formed tile by tile (GEMM), so memory stays O(tile² + m·d).
template <class = void>
struct dense_group_t {
    Eigen::MatrixXd const& K;
    Eigen::VectorXd s, nrm;
    Eigen::MatrixXd B, G;

    /// `V` non-empty: full model (d × d); otherwise the diagonal `var`.
    dense_group_t(Eigen::MatrixXd const& keys, Eigen::VectorXd const& w, Eigen::VectorXd const& var,
                Eigen::MatrixXd const& V)
        : K(keys) {
        s.noalias() = K * w;
        if (V.size() != 0) B.noalias() = K * V;
        else B = K * var.asDiagonal();
        nrm = (B.array() * K.array()).rowwise().sum();
    }

    /// Calls f(a0, na, b0, nb, G) for every tile of the upper triangle
    /// (b0 >= a0): G(a, b) = g_{a0+a, b0+b}. Diagonal tiles hold both triangles.
    template <class F>
    void for_each_tile(index_t tile, F&& f) {
        index_t const m = K.rows();
        index_t const T = std::max<index_t>(1, tile);
        for (index_t a0 = 0; a0 < m; a0 += T) {
            index_t const na = std::min(T, m - a0);
            for (index_t b0 = a0; b0 < m; b0 += T) {
                index_t const nb = std::min(T, m - b0);
                G.noalias() = B.middleRows(a0, na) * K.middleRows(b0, nb).transpose();
                f(a0, na, b0, nb, static_cast<Eigen::MatrixXd const&>(G));
            }
        }
    }
};

/// The split pass (docs/beyond-split.md) of one Gram-tile column recorded by
/// `record_column`: pairs (i[a], j), a < n, skip[a] = 0, pair by pair (O(d)
/// each). Evaluators without `split_pair` evaluate no split.
template <class Evaluator>
void split_column(Evaluator& ev, bucket_eval const& e, index_t const* i, index_t j, unsigned char const* skip, index_t n,
                  cell_acc& acc) {
    if constexpr (requires { ev.split_pair(e, index_t{}, index_t{}, acc); }) {
        if (!e.split.on) return;
        for (index_t a = 0; a < n; ++a)
            if (skip[a] == 0) ev.split_pair(e, i[a], j, acc);
    }
}

/// All pairs of one group of keys (indices `idx`, one example) for one query
/// bucket, exactly. Dense groups use the tiled Gram path.
template <class Evaluator>
void evaluate_group_exact(Evaluator& ev, key_store const& k, bucket_eval const& e,
                                 std::vector<index_t> const& idx, cell_acc& acc, plasticity_options const& o) {
    auto const m = static_cast<index_t>(idx.size());
    if (m < 2) return;
    auto record = [&](index_t a, index_t b, double pp) {
        ev.record(e, idx[static_cast<std::size_t>(a)], idx[static_cast<std::size_t>(b)], pp, acc);
    };
    if (m < o.dense_min_keys) {
        for (index_t a = 0; a < m; ++a)
            for (index_t b = a + 1; b < m; ++b) {
                double pp = 0;
                if (ev.pp_direct(e, idx[static_cast<std::size_t>(a)], idx[static_cast<std::size_t>(b)], pp))
                    record(a, b, pp);
                else
                    ev.skip();
            }
        return;
    }
    // Dense path (method §5 exactness identity): s = K̃ w, B = K̃ V, n_i = (B ⊙ K̃) 1, G = B K̃ᵀ per tile.
    Eigen::MatrixXd K(m, k.d);
    for (index_t a = 0; a < m; ++a) K.row(a) = k.rot.row(idx[static_cast<std::size_t>(a)]);
    dense_group_t<> g(K, e.w, e.var, e.V);
    // The Φ pass reads each Gram tile column by column (contiguous): pair
    // (a, b) of the group with a < b, b in the column's key block. Per column:
    // z into a buffer, PP in one batched (vectorised) call, the rare pairs of
    // (near-)identical keys by the direct path, then the pairs are recorded in
    // the same order as one by one (same sums in the same order).
    auto const T = static_cast<std::size_t>(std::max<index_t>(1, o.tile_keys));
    std::vector<double> zbuf(T), ppbuf(T), tpos(static_cast<std::size_t>(m));
    std::vector<unsigned char> skip(T);
    for (std::size_t a = 0; a < tpos.size(); ++a)
        tpos[a] = static_cast<double>(k.position[static_cast<std::size_t>(idx[a])]);
    bool const empirical = e.emp.active();
    g.for_each_tile(o.tile_keys, [&](index_t a0, index_t na, index_t b0, index_t nb, Eigen::MatrixXd const& G) {
        double const* nrm = g.nrm.data() + a0;
        double const* sa = g.s.data() + a0;
        double* const z = zbuf.data();
        for (index_t b = 0; b < nb; ++b) {
            index_t const ib = b0 + b;
            double const nb_ = g.nrm(ib), sb = g.s(ib);
            double const* col = G.col(b).data();
            index_t const a_end = (b0 == a0) ? b : na;
            if (a_end == 0) continue;
            // z = (s_a − s_b)/√v, v = n_a + n_b − 2 g_ab (v ≤ 0 gives ±inf/NaN: such pairs go direct below).
            sse2::z_column(nrm, nb_, sa, sb, col, a_end, z);
            auto const n = static_cast<std::size_t>(a_end);
            vpp::pairwise_plasticity(std::span<double const>(z, n), std::span<double>(ppbuf.data(), n));
            for (index_t a = 0; a < a_end; ++a) {
                double const v = nrm[a] + nb_ - 2.0 * col[a];
                skip[static_cast<std::size_t>(a)] = 0;
                // method §9.9: rounding must never turn identical keys into a random PP.
                if (!(v > 1e-12 * (nrm[a] + nb_))) {
                    double pp = 0;
                    if (ev.pp_direct(e, idx[static_cast<std::size_t>(a0 + a)], idx[static_cast<std::size_t>(ib)], pp)) {
                        ppbuf[static_cast<std::size_t>(a)] = pp;
                    } else {
                        skip[static_cast<std::size_t>(a)] = 1;
                        ev.skip();
                    }
                }
            }
            if (!empirical) {
                ev.record_column(e, tpos.data() + a0, tpos[static_cast<std::size_t>(ib)], ppbuf.data(), skip.data(),
                                 a_end, acc);
                split_column(ev, e, idx.data() + a0, idx[static_cast<std::size_t>(ib)], skip.data(), a_end, acc);
                continue;
            }
            for (index_t a = 0; a < a_end; ++a)
                if (skip[static_cast<std::size_t>(a)] == 0) record(a0 + a, ib, ppbuf[static_cast<std::size_t>(a)]);
        }
    });
}

/// Seeded sampling of one cell (method §6): a group with probability ∝ its pair
/// count, then two distinct keys uniformly. Draws depend on (o.seed, b, c)
/// only, where o.seed is the head's stream (`head_stream_seed`: the entry
/// points replace the options' seed with it, so heads draw independently).
template <class Evaluator>
void evaluate_cell_sampled(Evaluator& ev, bucket_eval const& e, std::vector<std::vector<index_t> const*> const& groups,
                           cell_acc& acc, plasticity_options const& o, std::int64_t b, std::int64_t c) {
    std::vector<double> cum;
    double total = 0;
    for (auto const* g : groups) {
        auto const m = static_cast<double>(g->size());
        total += m * (m - 1) / 2;
        cum.push_back(total);
    }
    if (!(total > 0)) return;
    std::uint64_t const seed = hash_step(hash_step(splitmix64(o.seed), static_cast<std::uint64_t>(b)),
                                         static_cast<std::uint64_t>(c));
    std::mt19937_64 gen(seed);
    for (std::int64_t s = 0; s < o.samples_per_cell; ++s) {
        double const u = unit_interval(gen()) * total;
        auto gi = static_cast<std::size_t>(std::upper_bound(cum.begin(), cum.end(), u) - cum.begin());
        gi = std::min(gi, groups.size() - 1);
        auto const& g = *groups[gi];
        auto const m = static_cast<std::uint64_t>(g.size());
        auto const a = static_cast<std::size_t>(gen() % m);
        auto bb = static_cast<std::size_t>(gen() % (m - 1));
        if (bb >= a) ++bb;
        double pp = 0;
        if (ev.pp_direct(e, g[a], g[bb], pp)) ev.record(e, g[a], g[bb], pp, acc);
        else ev.skip();
    }
}

}  // namespace qkgeom::detail
