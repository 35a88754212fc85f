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
// IWYU pragma: private, include <qkgeom/plasticity/attention_plasticity.hpp>
#pragma once

#include <qkgeom/core/buckets.hpp>
#include <qkgeom/core/config.hpp>
#include <qkgeom/plasticity/aggregate.hpp>
#include <qkgeom/plasticity/empirical.hpp>
#include <qkgeom/plasticity/options.hpp>
#include <qkgeom/plasticity/rows.hpp>
#include <qkgeom/plasticity/split.hpp>
#include <qkgeom/simd/dispatch.hpp>
#include <qkgeom/simd/sse2.hpp>
#include <qkgeom/stats/gaussian.hpp>

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

/// PP of a counterfactual (m, v) with v ≤ 0 (the counterfactual variance
/// vanishes along δ): the limit PP = 0 for m ≠ 0 and PP = 1 (a tie) for
/// m = 0, counted in `degenerate`. (v > 0: the closed form.)
template <class = void>  // instantiated on use
double split_degenerate_pp(double m, std::int64_t& degenerate) noexcept {
    ++degenerate;
    return m == 0 ? 1.0 : 0.0;
}

/// The split pass's pending pairs (docs/beyond-split.md): per pair δ₁, the
/// content sums c = (m_con, v_con, m_con,frozen, v_con,frozen) and the main
/// PP ('act', not evaluated again). `flush` evaluates the counterfactual PPs
/// of all of them in one batched (vectorised) call and adds the pairs to the
/// sums in the order they were pushed.
struct split_buffer {
    std::vector<double> d1, mc, vc, mf, vf, act, z;
    std::size_t n = 0;

    /// Room for `cap` pairs (never shrinks).
    void reserve(std::size_t cap) {
        if (d1.size() >= cap) return;
        for (auto* v : {&d1, &mc, &vc, &mf, &vf, &act}) v->resize(cap);
        z.resize(3 * cap);
    }
    void push(double delta1, double const c[4], double pp) noexcept {
        d1[n] = delta1, mc[n] = c[0], vc[n] = c[1], mf[n] = c[2], vf[n] = c[3], act[n] = pp;
        ++n;
    }
    void flush(split_model const& sm, double w0, double s0, bool same, split_acc& acc);
};

/// Adds the pending pairs to `acc` (w0 = w_b[0], s0 = σ²_pos; `same`: the
/// frozen model is the actual one, fr = act and ne = nd) and empties the buffer.
inline void split_buffer::flush(split_model const& sm, double w0, double s0, bool same, split_acc& acc) {
    std::size_t const k = n;
    if (k == 0) return;
    n = 0;
    bool const fro = sm.frozen && !same;
    double const al = sm.alpha_pos;
    double* const zn = z.data();
    double* const zf = zn + k;
    double* const ze = zf + k;
    // v ≤ 0 gives ±inf or NaN here, replaced below
    sse2::split_z(simd::active(), {d1.data(), mc.data(), vc.data(), fro ? mf.data() : nullptr, vf.data(), al, w0, s0, k,
                                   zn, zf, ze});
    vpp::batch(zn, zn, fro ? 3 * k : k);
    for (std::size_t i = 0; i < k; ++i) {
        double const t = d1[i];
        double const mpos = w0 * t, vpos = s0 * (t * t), mnd = al * t;
        double const v = vpos + vc[i];
        double const nd = v > 0 ? zn[i] : split_degenerate_pp(mnd + mc[i], acc.degenerate);
        acc.act += act[i];
        acc.nd += nd;
        if (fro) {
            bool const ok = vpos + vf[i] > 0;
            acc.fr += ok ? zf[i] : split_degenerate_pp(mpos + mf[i], acc.degenerate);
            acc.ne += ok ? ze[i] : split_degenerate_pp(mnd + mf[i], acc.degenerate);
        } else if (sm.frozen) {
            acc.fr += act[i];
            acc.ne += v > 0 ? nd : split_degenerate_pp(mnd + mc[i], acc.degenerate);
        }
        acc.mpos2 += mpos * mpos;
        acc.mcon2 += mc[i] * mc[i];
        acc.vpos += vpos;
        acc.vcon += vc[i];
        ++acc.n;
    }
}

/// The split bucket of query bucket `b`: `pooled` the sums over its pairs,
/// `cell_sum` the sums over its `n_cells` non-empty cells of the four
/// profiles' cell means (AP_b = their mean, method §9.10–9.11); the
/// frozen-content fields stay NaN unless `frozen`.
template <class = void>  // instantiated on use
split_bucket finish_split_bucket(std::int64_t b, split_acc const& pooled, double const cell_sum[4],
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

    /// σ²_pos, the positional variance.
    [[nodiscard]] double s0() const { return V.size() != 0 ? V(0, 0) : var(0); }
};

/// Whether the split's frozen content model of `e` is its actual one
/// (global_linear; or equal values): then fr = act and ne = nd exactly, and
/// neither is evaluated again. Computed once per bucket (split_model::same_state).
template <class = void>  // instantiated on use
bool split_same(bucket_eval const& e) {
    split_model const& sm = e.split;
    if (sm.same_state < 0) {
        index_t const d = e.w.size();
        bool same = sm.frozen && sm.pref == nullptr && sm.wf.size() == d && sm.wf == e.w;
        if (same && e.V.size() != 0)
            same = sm.covf.rows() == d - 1 && sm.covf.cols() == d - 1 && sm.covf == e.V.bottomRightCorner(d - 1, d - 1);
        else if (same)
            same = sm.covf.size() == 0 && sm.varf.size() == d && sm.varf == e.var;
        sm.same_state = same ? 1 : 0;
    }
    return sm.same_state == 1;
}

/// Evaluates and records the pairs of one head: the closed form of a pair,
/// its cell accumulators, its heatmap bin and its empirical count. (A class
/// template, instantiated on use.)
template <class Dep = void>
class pair_evaluator_t {
    using VecX = detail::dep_t<Eigen::VectorXd, Dep>;
    using EmpCheck = detail::dep_t<empirical_check, Dep>;
    using KeyStore = detail::dep_t<key_store, Dep>;
public:
    pair_evaluator_t(KeyStore const& keys, plasticity_heatmap& hm, std::int64_t& skipped, EmpCheck& emp)
        : k_(keys), hm_(hm), skipped_(skipped), emp_(emp), dist_(hm.distance_edges), offs_(hm.offset_edges) {}

    /// The closed form of one pair, direct path. Returns false (and counts it)
    /// when the keys are identical (v ≤ 0).
    /// Identical keys give v = 0 and are skipped by the same test as v < 0.
    /// With the split on, the pass also keeps the pair's content sums for `record`.
    bool pp_direct(bucket_eval const& e, index_t i, index_t j, double& pp) {
        double m = 0, v = 0;
        bool const sp = e.split.on;
        if (e.V.size() != 0) {
            auto& delta = delta_;  // member scratch: no allocation per pair
            delta = (k_.rot.row(i) - k_.rot.row(j)).transpose();
            m = e.w.dot(delta);
            vdelta_.noalias() = e.V * delta;
            v = delta.dot(vdelta_);
            if (sp) full_content(e, i, j, st_c_);
        } else if (sp) {
            // m, v as diag_pair_moments (bit for bit) and the content sums, one pass
            diag_split(e, i, j, m, v, st_c_);
        } else {
            // m = w·δ and v = Σ var_l δ_l² in one pass, δ never stored
            sse2::diag_pair_moments(k_.rot.row(i).data(), k_.rot.row(j).data(), e.w.data(), e.var.data(), k_.d, m, v);
        }
        if (sp) st_i_ = i, st_j_ = j, st_e_ = &e;
        if (!(v > 0)) return false;
        pp = pairwise_plasticity(m / std::sqrt(v));
        return true;
    }

    /// Record an evaluated pair: cell accumulators, heatmap, empirical value.
    void record(bucket_eval const& e, index_t i, index_t j, double pp, cell_acc& acc) {
        acc.sum += pp;
        acc.sumsq += pp * pp;
        ++acc.n;
        if (e.split.on) split_push(e, i, j, pp, acc.split);
        double const ti = static_cast<double>(k_.position[static_cast<std::size_t>(i)]);
        double const tj = static_cast<double>(k_.position[static_cast<std::size_t>(j)]);
        bin(std::abs(ti - tj), e.tau - 0.5 * (ti + tj), pp);
        if (!e.emp.active()) return;
        if (acc.emp != emp_pass::count) {  // the sampled check draws after the pass
            if (acc.emp == emp_pass::keep) acc.kept.push_back({i, j});
            return;
        }
        // method §9.14: the fraction of the bucket's queries whose score for key i
        // is strictly larger than for key j (original basis).
        std::int64_t const wins = emp_.wins(e.emp, i, j);
        double const p = static_cast<double>(wins) / static_cast<double>(e.emp.nq);
        acc.emp_sum += 4.0 * p * (1.0 - p) * e.emp.emp_scale;
        ++acc.emp_n;
    }

    void skip() { ++skipped_; }

    /// The pairs skipped so far (v ≤ 0, method §9.9), all cells of the head.
    [[nodiscard]] std::int64_t skipped() const noexcept { return skipped_; }

    /// Whether the closed form evaluates pair (i, j) for bucket `e`: the
    /// direct path's test v > 0 (`pp_direct`, the same v bit for bit, without
    /// the split pass). The sampled empirical check redraws a pair it skips.
    bool evaluates(bucket_eval const& e, index_t i, index_t j) {
        double pp = 0;
        return closed_pp(e, i, j, pp);
    }

    /// The closed form's PP of pair (i, j) for bucket `e` by the direct
    /// path (`pp_direct`'s m and v, without the split pass); false when it
    /// skips the pair (v ≤ 0).
    bool closed_pp(bucket_eval const& e, index_t i, index_t j, double& pp) {
        double m = 0, v = 0;
        if (e.V.size() != 0) {
            delta_ = (k_.rot.row(i) - k_.rot.row(j)).transpose();
            m = e.w.dot(delta_);
            vdelta_.noalias() = e.V * delta_;
            v = delta_.dot(vdelta_);
        } else {
            sse2::diag_pair_moments(k_.rot.row(i).data(), k_.rot.row(j).data(), e.w.data(), e.var.data(), k_.d, m, v);
        }
        if (!(v > 0)) return false;
        pp = pairwise_plasticity(m / std::sqrt(v));
        return true;
    }

    /// The split's content sums of pair (i, j) directly (O(d); full: O(d²)):
    /// c = (m_con, v_con, m_con,frozen, v_con,frozen), docs/beyond-split.md.
    void split_content(bucket_eval const& e, index_t i, index_t j, double c[4]) {
        if (e.V.size() != 0) {
            delta_ = (k_.rot.row(i) - k_.rot.row(j)).transpose();
            vdelta_.noalias() = e.V * delta_;
            full_content(e, i, j, c);
            return;
        }
        double m = 0, v = 0;
        diag_split(e, i, j, m, v, c);
    }

    /// m, v and the content sums c of pair (i, j), diagonal models, in one
    /// pass at the dispatched level (the same bits at every level); the
    /// frozen sums only where the flush reads them (a frozen model other than
    /// the actual one), else c[2] = c[0], c[3] = c[1].
    void diag_split(bucket_eval const& e, index_t i, index_t j, double& m, double& v, double c[4]) {
        bool const f = e.split.frozen && !split_same(e);
        sse2::diag_pair_moments_split(isa_, k_.rot.row(i).data(), k_.rot.row(j).data(), e.w.data(), e.var.data(),
                                      f ? e.split.wf.data() : nullptr, f ? e.split.varf.data() : nullptr, k_.d, m, v,
                                      c);
    }

    /// The split pass of one evaluated pair (PP `pp`) into `acc`: its content
    /// sums (kept by `pp_direct`, else computed) join the pending pairs.
    void split_push(bucket_eval const& e, index_t i, index_t j, double pp, split_acc& acc) {
        if (sbuf_.n != 0 && (sacc_ != &acc || se_ != &e)) flush_split();
        double c[4];
        if (st_e_ == &e && st_i_ == i && st_j_ == j) std::copy(st_c_, st_c_ + 4, c);
        else split_content(e, i, j, c);
        st_e_ = nullptr;
        sbuf_.reserve(split_batch);
        sacc_ = &acc;
        se_ = &e;
        sbuf_.push(k_.rot(i, 0) - k_.rot(j, 0), c, pp);
        if (sbuf_.n >= split_batch) flush_split();
    }

    /// Evaluates and adds the pending split pairs (call before reading a
    /// cell's split sums; the group and cell loops do).
    void flush_split() {
        st_e_ = nullptr;
        if (sbuf_.n == 0) return;
        sbuf_.flush(se_->split, se_->w(0), se_->s0(), split_same(*se_), *sacc_);
    }

    /// The split pass of one Gram-tile column (dense path, after
    /// `record_column`): pairs (a0 + a, ib) of group `idx`, a < n, skip[a] = 0,
    /// main PP pp[a], tile column `col` (and the frozen Gram column `gf`).
    template <class Group>
    void split_column(bucket_eval const& e, Group const& g, std::vector<index_t> const& idx, index_t a0, index_t ib,
                      double const* col, double const* gf, double const* pp, unsigned char const* skip, index_t n,
                      split_acc& acc) {
        flush_split();
        sbuf_.reserve(static_cast<std::size_t>(n));
        split_model const& sm = e.split;
        bool const same = split_same(e), fro = sm.frozen && !same;
        double const s0 = e.s0();
        double const* K0 = g.K.col(0).data();
        double const kb = K0[ib], nb = g.nrm(ib), scb = g.sc(ib), ncb = g.nc(ib);
        double const scfb = fro ? g.scf(ib) : 0.0, nfb = fro ? g.nf(ib) : 0.0;
        for (index_t a = 0; a < n; ++a) {
            if (skip[a] != 0) continue;
            index_t const ia = a0 + a;
            double const t = K0[ia] - kb, ka = K0[ia];
            double c[4];
            // method §5 on the content coordinates: m_con = s'_a − s'_b, v_con = n'_a + n'_b − 2 g'_ab
            c[0] = g.sc(ia) - scb;
            c[1] = g.nc(ia) + ncb - 2.0 * (col[a] - s0 * ka * kb);
            c[2] = fro ? g.scf(ia) - scfb : c[0];
            c[3] = fro ? g.nf(ia) + nfb - 2.0 * gf[a] : c[1];
            // pairs whose v (or frozen v) is not clear of rounding: the direct sums (as the main pass)
            bool direct = !(g.nrm(ia) + nb - 2.0 * col[a] > 1e-12 * (g.nrm(ia) + nb));
            if (fro) direct = direct || !(s0 * (t * t) + c[3] > 1e-12 * (s0 * (ka * ka + kb * kb) + g.nf(ia) + nfb));
            if (direct) split_content(e, idx[static_cast<std::size_t>(ia)], idx[static_cast<std::size_t>(ib)], c);
            sbuf_.push(t, c, pp[a]);
        }
        sbuf_.flush(sm, e.w(0), s0, same, acc);
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

    /// Content sums of the full model from delta_ and vdelta_ = V delta_
    /// (pair i, j): V is blockdiag(σ²_pos, Σ_b), so (V δ)₂:d = Σ_b δ₂:d.
    void full_content(bucket_eval const& e, index_t i, index_t j, double c[4]) {
        split_model const& sm = e.split;
        index_t const d = k_.d;
        auto const t = delta_.tail(d - 1);
        c[0] = e.w.tail(d - 1).dot(t);
        c[1] = t.dot(vdelta_.tail(d - 1));
        c[2] = c[0], c[3] = c[1];
        if (!sm.frozen) return;
        c[2] = sm.wf.tail(d - 1).dot(t);
        if (sm.pref != nullptr) {  // Σ_ref δ₂:d = P_i − P_j
            double const* pi = sm.pref + i * (d - 1);
            double const* pj = sm.pref + j * (d - 1);
            double s = 0;
            for (index_t l = 0; l < d - 1; ++l) s += t(l) * (pi[l] - pj[l]);
            c[3] = s;
        } else if (!split_same(e)) {
            vfd_.noalias() = sm.covf * t;
            c[3] = t.dot(vfd_);
        }
    }

    static constexpr std::size_t split_batch = 256;  ///< pending split pairs per batched PP call

    KeyStore const& k_;
    plasticity_heatmap& hm_;
    std::int64_t& skipped_;
    EmpCheck& emp_;
    grid dist_, offs_;
    VecX delta_, vdelta_, vfd_;
    simd::isa isa_ = simd::active();     ///< the level of the split pass's direct kernel
    split_buffer sbuf_;                  ///< the split's pending pairs
    split_acc* sacc_ = nullptr;          ///< their sums
    bucket_eval const* se_ = nullptr;    ///< their bucket
    bucket_eval const* st_e_ = nullptr;  ///< pp_direct's content sums st_c_ of pair (st_i_, st_j_), or none
    index_t st_i_ = -1, st_j_ = -1;
    double st_c_[4] = {0, 0, 0, 0};
};

using pair_evaluator = pair_evaluator_t<>;

/// The weighted Gram matrix of one dense group of rotated keys K̃ (m × d) for
/// one query bucket (method §5): s = K̃ w, B = K̃ V, n_i = (B ⊙ K̃) 1, and
/// G = B K̃ᵀ formed tile by tile (GEMM), so memory stays O(tile² + m·d).
template <class Dep = void>
struct dense_group_t {
    using MatX = detail::dep_t<Eigen::MatrixXd, Dep>;
    using VecX = detail::dep_t<Eigen::VectorXd, Dep>;
    MatX const& K;
    VecX s, nrm;
    MatX B, G;
    /// The split pass (`prepare_split`): content parts s' = K̃[:, 1:] w[1:],
    /// n' = (B ⊙ K̃)[:, 1:] 1; frozen: s'_f, n'_f and Bf = K̃[:, 1:] Σ_f, whose
    /// Gram tile Gf = Bf K̃[:, 1:]ᵀ is formed with G (`fgram`).
    VecX sc, nc, scf, nf;
    MatX Bf, Gf;
    bool fgram = false;

    /// `V` non-empty: full model (d × d); otherwise the diagonal `var`.
    dense_group_t(MatX const& keys, VecX const& w, VecX const& var,
                MatX const& V)
        : K(keys) {
        s.noalias() = K * w;
        if (V.size() != 0) B.noalias() = K * V;
        else B = K * var.asDiagonal();
        nrm = (B.array() * K.array()).rowwise().sum();
    }

    /// The split's per-key content parts (docs/beyond-split.md) for the
    /// bucket's mean `w` and split model `sm`; `same`: the frozen model is the
    /// actual one (no frozen Gram).
    void prepare_split(VecX const& w, split_model const& sm, bool same) {
        index_t const c = K.cols() - 1;
        auto const Kc = K.rightCols(c);
        sc.noalias() = Kc * w.tail(c);
        nc = (B.rightCols(c).array() * Kc.array()).rowwise().sum();
        fgram = sm.frozen && !same;
        if (!fgram) return;
        scf.noalias() = Kc * sm.wf.tail(c);
        if (sm.covf.size() != 0) Bf.noalias() = Kc * sm.covf;
        else Bf = Kc * sm.varf.tail(c).asDiagonal();
        nf = (Bf.array() * Kc.array()).rowwise().sum();
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
                if (fgram) Gf.noalias() = Bf.middleRows(a0, na) * K.block(b0, 1, nb, K.cols() - 1).transpose();
                f(a0, na, b0, nb, static_cast<MatX const&>(G));
            }
        }
    }
};

/// Whether `ev` runs the split pass on the dense group `g` of bucket `e`
/// (evaluators without one evaluate no split); prepares `g` for it.
template <class Evaluator, class Group>
bool dense_split_prepare(Evaluator& ev, bucket_eval const& e, Group& g) {
    if constexpr (requires { ev.flush_split(); }) {
        if (!e.split.on) return false;
        g.prepare_split(e.w, e.split, split_same(e));
        return true;
    }
    return false;
}

/// Adds `ev`'s pending split pairs to their sums (no-op without a split pass).
template <class Evaluator>
void split_flush(Evaluator& ev) {
    if constexpr (requires { ev.flush_split(); }) ev.flush_split();
}

/// All pairs of one group of keys (indices `idx`, one example) for one query
/// bucket, exactly. Dense groups use the tiled Gram path.
template <class Evaluator>
void evaluate_group_exact(Evaluator& ev, key_store const& k, bucket_eval const& e,
                                 std::vector<index_t> const& idx, cell_acc& acc, plasticity_options const& o) {
    using MatX = detail::dep_t<Eigen::MatrixXd, Evaluator>;
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
        split_flush(ev);
        return;
    }
    // Dense path (method §5 exactness identity): s = K̃ w, B = K̃ V, n_i = (B ⊙ K̃) 1, G = B K̃ᵀ per tile.
    MatX K(m, k.d);
    for (index_t a = 0; a < m; ++a) K.row(a) = k.rot.row(idx[static_cast<std::size_t>(a)]);
    dense_group_t<detail::dep_t<void, Evaluator>> g(K, e.w, e.var, e.V);
    [[maybe_unused]] bool const split = dense_split_prepare(ev, e, g);
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
    g.for_each_tile(o.tile_keys, [&](index_t a0, index_t na, index_t b0, index_t nb, MatX const& G) {
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
                if constexpr (requires { ev.flush_split(); })
                    if (split)
                        ev.split_column(e, g, idx, a0, ib, col, g.fgram ? g.Gf.col(b).data() : nullptr, ppbuf.data(),
                                        skip.data(), a_end, acc.split);
                continue;
            }
            for (index_t a = 0; a < a_end; ++a)
                if (skip[static_cast<std::size_t>(a)] == 0) record(a0 + a, ib, ppbuf[static_cast<std::size_t>(a)]);
        }
    });
    split_flush(ev);
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
    split_flush(ev);
}

}  // namespace qkgeom::detail
