// qkgeom — the Gram-matrix plasticity of method §5 on a LibTorch device (issue 6).
//
// For a query bucket b with rotated-basis mean w_b and variances V_b, and the
// keys k̃ = H k of one group (one example, one key bucket — or one example's
// prefix), every pair (i, j) needs
//   m_ij = s_i − s_j,                 s = K̃ w_b
//   v_ij = n_i + n_j − 2 g_ij,        n_i = k̃_iᵀ V_b k̃_i,  G = K̃ V_b K̃ᵀ
//   PP   = 4 Φ(−|z|)(1 − Φ(−|z|)),   z = m/√v,  Φ(−|z|) = erfc(|z|/√2)/2
// (method §5 exactness identity). m and v are invariant to translating every
// key of the group by the same vector, so the keys are centred on the group
// mean first (in f64): the Gram entries are then of the size of v itself and
// the subtraction loses little even when the GEMM runs in f32.
//
// Work is tiled (`tile_keys` × `tile_keys` Gram blocks): device memory stays
// O(tile² + m·d) per group. The GEMM runs in `gemm_dtype` (f64 for f64 keys,
// f32 otherwise, or as asked); s, n, v, z and PP are f64. A pair whose Gram
// v is at most `fallback_rel`·(n_i + n_j) (cancellation) is recomputed
// directly from δ = k̃_i − k̃_j in f64; identical keys (δ = 0 in the original
// basis) and v ≤ 0 are skipped and counted (method §9.9), as on the CPU.
//
// The result equals the cells of `attention_plasticity` with exact enumeration
// (tested: 1e-12 relative with f64 GEMM, 1e-6 with f32). It carries the cell
// means and pair counts; the heatmap and the empirical cross-check need every
// pair on the host and stay with the CPU path.
#pragma once

#include <qkgeom/adapters/torch.hpp>
#include <qkgeom/geometry/householder.hpp>
#include <qkgeom/plasticity/attention_plasticity.hpp>
#include <qkgeom/stats/gaussian.hpp>  // inv_sqrt2 (not reached through the umbrella with QKGEOM_COMPILED)

#if defined(QKGEOM_HAS_TORCH)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace qkgeom {

/// \brief Options of the device Gram path.
struct torch_plasticity_options {
    std::optional<at::ScalarType> gemm_dtype;  ///< kDouble or kFloat; default: kDouble for f64 keys, else kFloat
    std::int64_t tile_keys = 1024;             ///< Gram tile edge (memory O(tile²))
    double fallback_rel = -1.0;                ///< direct recomputation below this v/(n_i+n_j); < 0: 1e-12 (f64), 1e-3 (f32)
};

/// \brief Cells of the plasticity of one head computed on the device: the
/// same cells, in the same order, as `attention_plasticity(...).cells` with
/// exact enumeration (`std_error` 0; `empirical` NaN).
struct torch_plasticity_result {
    std::vector<plasticity_cell> cells;
    std::int64_t n_pairs = 0;                  ///< evaluated pairs
    std::int64_t n_pairs_skipped = 0;          ///< identical keys / v ≤ 0 (method §9.9)
    std::int64_t n_query_buckets_skipped = 0;  ///< no earlier key bucket, or no bucket model
};

namespace detail {

inline at::Tensor torch_vector(Eigen::VectorXd const& v, at::Device dev) {
    at::Tensor t = at::empty({v.size()}, at::TensorOptions().dtype(at::kDouble));
    std::copy(v.data(), v.data() + v.size(), t.data_ptr<double>());
    return dev.is_cpu() ? t : t.to(dev);
}

inline at::Tensor torch_matrix_of(Eigen::MatrixXd const& m, at::Device dev) {
    at::Tensor t = at::empty({m.rows(), m.cols()}, at::TensorOptions().dtype(at::kDouble));
    Eigen::Map<Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(t.data_ptr<double>(), m.rows(),
                                                                                       m.cols()) = m;
    return dev.is_cpu() ? t : t.to(dev);
}

/// PP(z) = 4 Φ(−|z|)(1 − Φ(−|z|)) element-wise, Φ(−|z|) by erfc (no cancellation).
inline at::Tensor torch_pp(at::Tensor const& z) {
    at::Tensor const t = at::erfc(z.abs() * inv_sqrt2) * 0.5;
    return t * (1.0 - t) * 4.0;
}

/// The rotated mean and variances of one query bucket on the device.
struct torch_bucket_eval {
    at::Tensor w;    ///< (d)
    at::Tensor var;  ///< (d) diagonal variances, or undefined
    at::Tensor V;    ///< (d × d) blockdiag(σ²_pos, Σ_b) for `full`, or undefined
};

/// Accumulates the PP sum (on the device) and the counts (on the host) of one cell.
struct torch_cell_acc {
    at::Tensor sum;  ///< f64 scalar on the device
    std::int64_t n = 0;
};

/// Every pair of one group of keys `idx` for one query bucket, tiled.
inline void torch_group_pairs(at::Tensor const& K, at::Tensor const& Krot, torch_bucket_eval const& e,
                              std::vector<index_t> const& idx, at::ScalarType gemm, std::int64_t tile, double rel,
                              torch_cell_acc& acc, std::int64_t& skipped) {
    auto const m = static_cast<std::int64_t>(idx.size());
    if (m < 2) return;
    at::Tensor I = at::empty({m}, at::TensorOptions().dtype(at::kLong));
    std::copy(idx.begin(), idx.end(), I.data_ptr<std::int64_t>());
    if (!K.device().is_cpu()) I = I.to(K.device());
    at::Tensor const Ko = K.index_select(0, I);     // original basis (identical-key test)
    at::Tensor const Kr = Krot.index_select(0, I);  // rotated
    at::Tensor const Kc = Kr - Kr.mean(0, /*keepdim=*/true);
    at::Tensor const s = at::mv(Kc, e.w);
    at::Tensor const Bm = e.V.defined() ? at::mm(Kc, e.V) : Kc * e.var.unsqueeze(0);
    at::Tensor const nrm = (Bm * Kc).sum(1);
    at::Tensor const Bg = Bm.to(gemm), Kg = Kc.to(gemm);
    for (std::int64_t a0 = 0; a0 < m; a0 += tile) {
        std::int64_t const na = std::min(tile, m - a0);
        for (std::int64_t b0 = a0; b0 < m; b0 += tile) {
            std::int64_t const nb = std::min(tile, m - b0);
            at::Tensor const G = at::mm(Bg.narrow(0, a0, na), Kg.narrow(0, b0, nb).t()).to(at::kDouble);
            at::Tensor const na_ = nrm.narrow(0, a0, na).unsqueeze(1), nb_ = nrm.narrow(0, b0, nb).unsqueeze(0);
            at::Tensor const v = na_ + nb_ - G * 2.0;
            at::Tensor valid = at::ones({na, nb}, G.options().dtype(at::kBool));
            if (a0 == b0) valid = at::triu(valid, 1);
            at::Tensor const fb = at::logical_and(valid, at::logical_not(at::gt(v, (na_ + nb_) * rel)));
            at::Tensor const ok = at::logical_and(valid, at::logical_not(fb));
            at::Tensor const z = (s.narrow(0, a0, na).unsqueeze(1) - s.narrow(0, b0, nb).unsqueeze(0)) / at::sqrt(v);
            at::Tensor const tile_sum = torch_pp(z).masked_fill(at::logical_not(ok), 0.0).sum();
            acc.sum = acc.sum.defined() ? acc.sum + tile_sum : tile_sum;
            std::int64_t const n_valid = a0 == b0 ? na * (na - 1) / 2 : na * nb;
            auto const n_fb = fb.sum().item<std::int64_t>();  // one host synchronisation per tile
            acc.n += n_valid - n_fb;
            if (n_fb == 0) continue;
            // Direct recomputation (method §9.9): δ in f64, identical keys skipped.
            at::Tensor const pr = fb.nonzero();
            at::Tensor const ia = pr.select(1, 0) + a0, ib = pr.select(1, 1) + b0;
            at::Tensor const same = at::eq(Ko.index_select(0, ia), Ko.index_select(0, ib)).all(1);
            at::Tensor const dr = Kr.index_select(0, ia) - Kr.index_select(0, ib);
            at::Tensor const mm_ = at::mv(dr, e.w);
            at::Tensor const vd = e.V.defined() ? (at::mm(dr, e.V) * dr).sum(1) : (dr * dr * e.var.unsqueeze(0)).sum(1);
            at::Tensor const good = at::logical_and(at::logical_not(same), at::gt(vd, 0.0));
            at::Tensor const pd = torch_pp(mm_ / at::sqrt(vd)).masked_fill(at::logical_not(good), 0.0).sum();
            acc.sum = acc.sum + pd;
            auto const n_good = good.sum().item<std::int64_t>();
            acc.n += n_good;
            skipped += n_fb - n_good;
        }
    }
}

}  // namespace detail

/// \brief The plasticity cells of one head (method §5–6) with every pair's
/// Gram entries computed on the keys' device. The same pair plan
/// (`detail::plan_pairs`: key groups, admissible cells, window) and the same
/// validation of the key annotations as `attention_plasticity`; the
/// enumeration is always exact.
///
/// \param[in] model  householder(...) of the head's queries
/// \param[in] keys   the key rows: vectors a [n_k, d] floating tensor
///                   (f32/f64/f16/bf16) on any device, with positions,
///                   buckets and example ids
/// \param[in] facts  the capture facts (bucket scheme, sliding window)
/// \param[in] opt    pair policy (the enumeration must not be `sampled`)
/// \param[in] topt   GEMM dtype, tile size, fallback threshold
/// \returns the cells, in the order of `attention_plasticity(...).cells`
/// \throws std::invalid_argument on mismatched shapes or lengths, NaN/Inf in a
///         key or a key value outside |x| < 2^128 (`input_limit`), negative positions or buckets, buckets that do not match the
///         positions (when `facts.buckets` is given), `enumeration_policy::sampled`,
///         or bad options.
inline torch_plasticity_result torch_attention_plasticity(householder_result const& model,
                                                          token_rows<at::Tensor> const& keys,
                                                          capture_facts const& facts,
                                                          plasticity_options const& opt = {},
                                                          torch_plasticity_options const& topt = {}) {
    constexpr std::string_view fn = "qkgeom::torch_attention_plasticity";
    index_t const d = model.beta.size();
    if (d < 1) detail::fail_arg(fn, "the Householder model is empty (d)", d);
    if (opt.enumeration == enumeration_policy::sampled)
        detail::fail_arg(fn, "the device path enumerates every pair; enumeration must be exact or automatic, is",
                         "sampled");
    detail::check_facts(fn, facts);
    if (topt.tile_keys < 1) detail::fail_arg(fn, "tile_keys must be >= 1", topt.tile_keys);
    at::Tensor const& kt = keys.vectors;
    detail::check_torch_strided(kt, fn, "keys");
    detail::check_torch_rank(kt, 2, fn, "keys", " [n_keys, head_dim]");
    (void)detail::torch_element_of(kt, fn, "keys");
    if (kt.size(1) != d)
        detail::fail_arg(fn, "keys: head dimension differs from the queries' model: model has d = " +
                                 std::to_string(d) + ", keys have",
                         kt.size(1));
    at::ScalarType const gemm =
        topt.gemm_dtype.value_or(kt.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
    if (gemm != at::kDouble && gemm != at::kFloat)
        detail::fail_arg(fn, "gemm_dtype must be Double or Float; dtype", detail::torch_dtype_name(gemm));
    double const rel = topt.fallback_rel >= 0 ? topt.fallback_rel : (gemm == at::kDouble ? 1e-12 : 1e-3);

    index_t const nk = kt.size(0);
    detail::check_annotations(fn, "keys", nk, keys.position, keys.bucket, keys.example_id, true, facts);

    at::Device const dev = kt.device();
    at::Tensor const K = kt.detach().to(at::kDouble);
    // NaN, ±inf and |x| ≥ 2^128 all fail |x| < input_limit (method §9.18).
    at::Tensor const in_range = K.abs() < input_limit;
    if (!in_range.all().item<bool>()) {
        at::Tensor const at_ = at::nonzero(in_range.logical_not())[0].to(at::kCPU);
        auto const i = at_[0].item<std::int64_t>(), j = at_[1].item<std::int64_t>();
        double const v = K[i][j].item<double>();
        detail::fail_arg(fn,
                         "keys: value at row " + std::to_string(i) + ", column " + std::to_string(j) +
                             (std::isfinite(v) ? " is outside the input limit |x| < 2^128 = 3.4028236692093846e+38"
                                               : " is not finite"),
                         v);
    }
    at::Tensor Krot = K;
    if (!model.H.is_identity()) {  // k̃ = k − γ u (u·k), never forming H
        at::Tensor const u = detail::torch_vector(model.H.u, dev);
        Krot = K - at::mv(K, u).unsqueeze(1) * u.unsqueeze(0) * model.H.gamma;
    }

    // The pair plan shared with attention_plasticity (same groups, cells, order).
    std::vector<std::pair<std::int64_t, bool>> models;
    for (auto const& sb : model.buckets) models.emplace_back(sb.bucket, sb.used);
    plasticity_options popt = opt;
    popt.enumeration = enumeration_policy::exact;
    detail::pair_plan const plan = detail::plan_pairs(keys.bucket.values(), keys.example_id.values(), models, facts, popt);

    torch_plasticity_result res;
    std::vector<detail::torch_cell_acc> accs;
    for (std::size_t bi = 0; bi < model.buckets.size(); ++bi) {
        auto const& sb = model.buckets[bi];
        auto const& qp = plan.queries[bi];
        if (!qp.evaluated) {  // method §6: no earlier key bucket; §9.8: no bucket model
            ++res.n_query_buckets_skipped;
            continue;
        }
        detail::torch_bucket_eval e;
        e.w = detail::torch_vector(sb.mean, dev);
        if (sb.cov.size() != 0) {
            e.V = detail::torch_matrix_of(detail::full_bucket_covariance(sb, d), dev);
        } else {
            e.var = detail::torch_vector(sb.var, dev);
        }
        auto run = [&](std::vector<detail::key_group> const& gs, std::int64_t c) {
            detail::torch_cell_acc acc;
            for (auto const& g : gs)
                detail::torch_group_pairs(K, Krot, e, g.keys, gemm, topt.tile_keys, rel, acc, res.n_pairs_skipped);
            plasticity_cell cell;
            cell.q_bucket = sb.bucket;
            cell.k_bucket = c;
            cell.n_pairs = acc.n;
            res.n_pairs += acc.n;
            res.cells.push_back(cell);
            accs.push_back(std::move(acc));
        };
        if (opt.pairs == pair_policy::same_bucket) {
            for (auto c : qp.cells) run(plan.groups_of(c), c);
        } else {
            run(plan.prefix_groups(qp.cells), -1);
        }
    }
    // One device → host copy of every cell's sum.
    std::vector<at::Tensor> sums;
    for (auto const& a : accs)
        sums.push_back(a.sum.defined() ? a.sum : at::zeros({}, K.options()));
    if (!sums.empty()) {
        at::Tensor const host = at::stack(sums).to(at::kCPU).contiguous();
        auto const* p = host.data_ptr<double>();
        for (std::size_t i = 0; i < res.cells.size(); ++i)
            if (res.cells[i].n_pairs > 0) res.cells[i].plasticity = p[i] / static_cast<double>(res.cells[i].n_pairs);
    }
    return res;
}

}  // namespace qkgeom

#endif
