// qkgeom — streaming, mergeable sufficient statistics (method §1).
//
// Every analysis except pair enumeration is a closed form over, per (head,
// kind, bucket):  n, Σt, Σt², Σx, Σx·t, Σxxᵀ.  They are kept *centred*
// (means and co-moments about the means) so that data with a large offset and
// a small spread loses nothing, and they merge exactly in the sense of Chan,
// Golub & LeVeque (1979):
//
//   n    = n_a + n_b,          δx = x̄_b − x̄_a,  δt = t̄_b − t̄_a,  f = n_a n_b / n
//   x̄    = x̄_a + δx · n_b / n  t̄ likewise
//   M2_t = M2_t,a + M2_t,b + f δt²
//   C_xt = C_xt,a + C_xt,b + f δx δt
//   C_xx = C_xx,a + C_xx,b + f δx δxᵀ
//
// Rows are absorbed in blocks of `moments::block_rows`: each block is widened
// to double, centred on its own (two-pass, corrected) mean, its co-moment
// formed as one symmetric rank-k update (SYRK, i.e. GEMM-backed), and the
// block merged with the formulas above.
#pragma once

#include <qkgeom/config.hpp>
#include <qkgeom/errors.hpp>
#include <qkgeom/head.hpp>
#include <qkgeom/tensor.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

namespace qkgeom {

/// \brief Centred sufficient statistics of one group of rows (method §1).
///
/// Invariants: `c_xx` is symmetric (both triangles stored); when `n == 0` all
/// statistics are zero. Sample (n−1) normalisation is applied only by the
/// accessors (`var_t`, `cov_xt`, `cov_x`), method §9.1.
struct moments {
    static constexpr index_t block_rows = 256;  ///< rows per blocked (SYRK) update

    std::int64_t n = 0;     ///< number of rows
    double mean_t = 0;      ///< t̄  (mean position)
    double m2_t = 0;        ///< Σ (t − t̄)²
    double t_min = std::numeric_limits<double>::infinity();   ///< smallest position (exact integer; +∞ when empty)
    double t_max = -std::numeric_limits<double>::infinity();  ///< largest position (−∞ when empty); method §9.12
    Eigen::VectorXd mean_x; ///< x̄  (d)
    Eigen::VectorXd c_xt;   ///< Σ (x − x̄)(t − t̄)  (d)
    Eigen::MatrixXd c_xx;   ///< Σ (x − x̄)(x − x̄)ᵀ  (d × d, symmetric)

    moments() = default;
    explicit moments(index_t d)
        : mean_x(Eigen::VectorXd::Zero(d)), c_xt(Eigen::VectorXd::Zero(d)), c_xx(Eigen::MatrixXd::Zero(d, d)) {}

    [[nodiscard]] index_t dim() const noexcept { return mean_x.size(); }
    [[nodiscard]] bool empty() const noexcept { return n == 0; }

    // --- raw sums, for readers of method §1 (Σt, Σt², Σx, Σx·t, Σxxᵀ) ---
    [[nodiscard]] double sum_t() const noexcept { return static_cast<double>(n) * mean_t; }
    [[nodiscard]] double sum_t2() const noexcept { return m2_t + static_cast<double>(n) * mean_t * mean_t; }
    template <class = void>  // instantiated on use
    [[nodiscard]] Eigen::VectorXd sum_x() const { return static_cast<double>(n) * mean_x; }
    template <class = void>  // instantiated on use
    [[nodiscard]] Eigen::VectorXd sum_xt() const { return c_xt + static_cast<double>(n) * mean_t * mean_x; }
    template <class = void>  // instantiated on use
    [[nodiscard]] Eigen::MatrixXd sum_xx() const {
        return c_xx + static_cast<double>(n) * mean_x * mean_x.transpose();
    }

    // --- sample (n−1) statistics, method §9.1; NaN when n < 2 ---
    [[nodiscard]] double var_t() const noexcept {
        return n < 2 ? std::numeric_limits<double>::quiet_NaN() : m2_t / static_cast<double>(n - 1);
    }
    template <class = void>  // instantiated on use
    [[nodiscard]] Eigen::VectorXd cov_xt() const {
        return n < 2 ? Eigen::VectorXd::Constant(dim(), std::numeric_limits<double>::quiet_NaN())
                     : Eigen::VectorXd(c_xt / static_cast<double>(n - 1));
    }
    template <class = void>  // instantiated on use
    [[nodiscard]] Eigen::MatrixXd cov_x() const {
        return n < 2 ? Eigen::MatrixXd::Constant(dim(), dim(), std::numeric_limits<double>::quiet_NaN())
                     : Eigen::MatrixXd(c_xx / static_cast<double>(n - 1));
    }

    /// \brief Chan et al. pairwise merge: `*this` becomes the statistics of the
    /// union of both row sets. Merging in any order agrees to rounding.
    /// \throws std::invalid_argument when the dimensions differ.
    template <class = void>
    moments& operator+=(moments const& o) {
        if (dim() != 0 && o.dim() != 0 && dim() != o.dim())
            detail::fail_arg("qkgeom::moments::operator+=",
                             "dimension mismatch: this has d = " + std::to_string(dim()) + ", other has d", o.dim());
        if (o.n == 0) return *this;
        if (n == 0) {
            if (dim() != 0 && dim() != o.dim())
                detail::fail_arg("qkgeom::moments::operator+=", "dimension mismatch: this has d = " +
                                                                     std::to_string(dim()) + ", other has d",
                                 o.dim());
            *this = o;
            return *this;
        }
        if (dim() != o.dim())
            detail::fail_arg("qkgeom::moments::operator+=",
                             "dimension mismatch: this has d = " + std::to_string(dim()) + ", other has d", o.dim());
        double const na = static_cast<double>(n), nb = static_cast<double>(o.n), nt = na + nb;
        double const f = na * nb / nt;
        double const dt = o.mean_t - mean_t;
        Eigen::VectorXd const dx = o.mean_x - mean_x;
        m2_t += o.m2_t + f * dt * dt;
        t_min = std::min(t_min, o.t_min);
        t_max = std::max(t_max, o.t_max);
        c_xt += o.c_xt + (f * dt) * dx;
        c_xx += o.c_xx;
        c_xx.noalias() += f * dx * dx.transpose();
        mean_t += dt * (nb / nt);
        mean_x += dx * (nb / nt);
        n += o.n;
        return *this;
    }

    template <class = void>  // instantiated on use
    friend moments operator+(moments a, moments const& b) { return a += b; }

    /// \brief Absorb one block of rows: `x` is nb × d row-major, `t` holds nb
    /// positions. Only the lower triangle of `c_xx` is updated; callers finish
    /// with `symmetrize()`. The building block of every `add`.
    template <class = void>  // instantiated on use
    void add_block(double const* x, double const* t, index_t nb, Eigen::MatrixXd& scratch) {
        if (nb <= 0) return;
        index_t const d = dim();
        using RowMat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
        Eigen::Map<RowMat const> X(x, nb, d);
        Eigen::Map<Eigen::VectorXd const> T(t, nb);
        double const inv = 1.0 / static_cast<double>(nb);
        // Two-pass block means, with the correction term of the second pass.
        Eigen::RowVectorXd bx = X.colwise().sum() * inv;
        double bt = T.sum() * inv;
        scratch.resize(d, nb);  // column-major d × nb = centred block, transposed
        scratch = (X.rowwise() - bx).transpose();
        Eigen::VectorXd const corr = scratch.rowwise().sum() * inv;
        bx += corr.transpose();
        scratch.colwise() -= corr;
        Eigen::VectorXd tc = T.array() - bt;
        double const tcorr = tc.sum() * inv;
        bt += tcorr;
        tc.array() -= tcorr;

        double const na = static_cast<double>(n), nbd = static_cast<double>(nb), nt = na + nbd;
        double const f = na * nbd / nt;
        double const dt = bt - mean_t;
        Eigen::VectorXd const dx = bx.transpose() - mean_x;

        m2_t += tc.squaredNorm() + f * dt * dt;
        t_min = std::min(t_min, T.minCoeff());
        t_max = std::max(t_max, T.maxCoeff());
        c_xt.noalias() += scratch * tc;
        c_xt += (f * dt) * dx;
        c_xx.selfadjointView<Eigen::Lower>().rankUpdate(scratch);
        if (n > 0) c_xx.selfadjointView<Eigen::Lower>().rankUpdate(dx, f);
        mean_t += dt * (nbd / nt);
        mean_x += dx * (nbd / nt);
        n += nb;
    }

    /// Copy the lower triangle of `c_xx` onto the upper one.
    template <class = void>  // instantiated on use
    void symmetrize() { c_xx.triangularView<Eigen::StrictlyUpper>() = c_xx.transpose(); }
};

namespace detail {

/// Validates one batch (rows, positions, buckets) before anything is mutated
/// (strong exception guarantee): shapes, non-negative integers, finite values.
/// `values = false` skips the scan of the values (rows the caller has already
/// checked, e.g. `analyze_head` after its moments pass).
template <MatrixReader R, IndexReader P, IndexReader B>
void check_batch(std::string_view where, index_t d, R const& r, P const& p, B const* b, bool values = true) {
    if (r.rows() <= 0) fail_arg(where, "rows: need at least one row; number of rows", r.rows());
    if (r.cols() != d)
        fail_arg(where, "rows: head dimension mismatch, expected " + std::to_string(d) + " columns, got",
                 r.cols());
    if (p.size() != r.rows())
        fail_arg(where, "positions: length differs from the " + std::to_string(r.rows()) + " rows; length",
                 p.size());
    if (b != nullptr && b->size() != r.rows())
        fail_arg(where, "buckets: length differs from the " + std::to_string(r.rows()) + " rows; length",
                 b->size());
    // Branch-free scans (they vectorise); the first offender is looked up only
    // when a scan finds one, so the messages name the same row and column.
    auto any_negative = [](auto const& idx) {
        std::int64_t acc = 0;  // sign bit set iff some value is negative
        for (index_t i = 0; i < idx.size(); ++i) acc |= idx[i];
        return acc < 0;
    };
    if (any_negative(p))
        for (index_t i = 0; i < p.size(); ++i)
            if (p[i] < 0) fail_arg(where, "positions: negative position at row " + std::to_string(i), p[i]);
    if (b != nullptr && any_negative(*b))
        for (index_t i = 0; i < b->size(); ++i)
            if ((*b)[i] < 0) fail_arg(where, "buckets: negative bucket at row " + std::to_string(i), (*b)[i]);
    if (!values) return;
    std::vector<double> row(static_cast<std::size_t>(d));
    for (index_t i = 0; i < r.rows(); ++i) {
        r.read_row(i, row.data());
        // (bits & exponent) + 2^52 carries into the sign bit iff the exponent is
        // all ones (±inf, NaN); OR over the row: integer SSE2 operations only.
        std::uint64_t acc = 0;
        for (double v : row) acc |= (std::bit_cast<std::uint64_t>(v) & 0x7ff0000000000000u) + 0x0010000000000000u;
        if ((acc >> 63) == 0) continue;
        for (index_t j = 0; j < d; ++j)
            if (!std::isfinite(row[static_cast<std::size_t>(j)]))
                fail_arg(where,
                         "rows: non-finite " + std::string(r.dtype()) + " value at row " + std::to_string(i) +
                             ", column " + std::to_string(j),
                         row[static_cast<std::size_t>(j)]);
    }
}

/// Streams the rows listed in `idx` through `m.add_block` in blocks.
template <MatrixReader R, IndexReader P>
void absorb_rows(moments& m, R const& r, P const& p, std::span<index_t const> idx) {
    index_t const d = m.dim();
    index_t const B = moments::block_rows;
    std::vector<double> xb(static_cast<std::size_t>(B * d));
    std::vector<double> tb(static_cast<std::size_t>(B));
    Eigen::MatrixXd scratch;
    auto const total = static_cast<index_t>(idx.size());
    for (index_t s = 0; s < total; s += B) {
        index_t const nb = std::min(B, total - s);
        for (index_t i = 0; i < nb; ++i) {
            index_t const row = idx[static_cast<std::size_t>(s + i)];
            r.read_row(row, xb.data() + i * d);
            tb[static_cast<std::size_t>(i)] = static_cast<double>(p[row]);
        }
        m.add_block(xb.data(), tb.data(), nb, scratch);
    }
    m.symmetrize();
}

}  // namespace detail

/// \brief Add rows that all belong to one group to `m` (method §1).
/// \param rows       any RowMatrix (n × d, d == m.dim())
/// \param positions  any IndexVector of n non-negative token positions
/// \throws std::invalid_argument on shape mismatch, zero rows, negative
///         positions, NaN/Inf values; `m` is unchanged when it throws.
template <RowMatrix X, IndexVector P>
void add_rows(moments& m, X const& rows, P const& positions) {
    auto const r = as_matrix(rows);
    auto const p = as_indices(positions);
    detail::check_batch<decltype(r), decltype(p), decltype(p)>("qkgeom::add_rows", m.dim(), r, p, nullptr);
    std::vector<index_t> idx(static_cast<std::size_t>(r.rows()));
    std::iota(idx.begin(), idx.end(), index_t{0});
    detail::absorb_rows(m, r, p, idx);
}

/// \brief The statistics of one kind (queries or keys) of one head, per
/// position bucket (method §1). Buckets are kept sorted; a bucket exists only
/// once it holds at least one row.
struct bucketed_moments {
    index_t d = 0;                             ///< head dimension
    std::map<std::int64_t, moments> buckets;   ///< bucket id -> statistics

    bucketed_moments() = default;
    explicit bucketed_moments(index_t dim) : d(dim) {}

    /// Total number of rows over all buckets.
    [[nodiscard]] std::int64_t count() const noexcept {
        std::int64_t s = 0;
        for (auto const& [b, m] : buckets) s += m.n;
        return s;
    }

    /// The statistics of all rows of this kind (buckets merged in ascending order).
    template <class = void>  // instantiated on use
    [[nodiscard]] moments pooled() const {
        moments out(d);
        for (auto const& [b, m] : buckets) out += m;
        return out;
    }

    /// \brief Add a batch of rows with their positions and bucket ids.
    /// \throws std::invalid_argument (shapes, zero rows, negative ids, NaN/Inf);
    ///         strong guarantee: nothing is added when it throws.
    template <RowMatrix X, IndexVector P, IndexVector B>
    void add(X const& rows, P const& positions, B const& bucket_ids) {
        auto const r = as_matrix(rows);
        auto const p = as_indices(positions);
        auto const b = as_indices(bucket_ids);
        if (d <= 0) detail::fail_arg("qkgeom::bucketed_moments::add", "head dimension d must be >= 1", d);
        detail::check_batch("qkgeom::bucketed_moments::add", d, r, p, &b);
        // Group row indices by bucket (stable: rows keep their input order).
        std::vector<index_t> idx(static_cast<std::size_t>(r.rows()));
        std::iota(idx.begin(), idx.end(), index_t{0});
        std::stable_sort(idx.begin(), idx.end(), [&](index_t a, index_t c) { return b[a] < b[c]; });
        std::size_t s = 0;
        while (s < idx.size()) {
            std::int64_t const bucket = b[idx[s]];
            std::size_t e = s;
            while (e < idx.size() && b[idx[e]] == bucket) ++e;
            auto [it, inserted] = buckets.try_emplace(bucket, d);
            detail::absorb_rows(it->second, r, p, std::span<index_t const>(idx.data() + s, e - s));
            s = e;
        }
    }

    /// \brief Merge another shard of the same kind (bucket by bucket).
    /// \throws std::invalid_argument when the head dimensions differ.
    template <class = void>  // instantiated on use
    bucketed_moments& operator+=(bucketed_moments const& o) {
        if (o.buckets.empty()) {
            if (d == 0) d = o.d;
            return *this;
        }
        if (d != 0 && o.d != d)
            detail::fail_arg("qkgeom::bucketed_moments::operator+=",
                             "head dimension mismatch: this has d = " + std::to_string(d) + ", other has d", o.d);
        d = o.d;
        for (auto const& [bucket, m] : o.buckets) {
            auto [it, inserted] = buckets.try_emplace(bucket, d);
            it->second += m;
        }
        return *this;
    }
};

/// \brief Sufficient statistics of one head: queries and keys per bucket.
/// The unit that shards are reduced to, merged and serialised (moments_io.hpp).
struct head_moments {
    head_id id;           ///< which head (checked on merge)
    index_t d = 0;        ///< head dimension
    bucketed_moments q;   ///< query statistics per bucket
    bucketed_moments k;   ///< key statistics per bucket

    head_moments() = default;
    explicit head_moments(index_t dim, head_id hid = {}) : id(hid), d(dim), q(dim), k(dim) {
        if (dim <= 0) detail::fail_arg("qkgeom::head_moments", "head dimension d must be >= 1", dim);
    }

    [[nodiscard]] bucketed_moments& operator[](kind w) noexcept { return w == kind::query ? q : k; }
    [[nodiscard]] bucketed_moments const& operator[](kind w) const noexcept { return w == kind::query ? q : k; }

    /// Add a batch of query or key rows (see bucketed_moments::add).
    template <RowMatrix X, IndexVector P, IndexVector B>
    void add(kind w, X const& rows, P const& positions, B const& bucket_ids) {
        (*this)[w].add(rows, positions, bucket_ids);
    }

    /// \brief Add the rows of one kind of a head (`head_capture::queries` or
    /// `::keys`): their vectors, positions and buckets.
    /// \throws std::invalid_argument as bucketed_moments::add.
    template <RowMatrix X>
    void add(kind w, token_rows<X> const& rows) {
        (*this)[w].add(rows.vectors, rows.position, rows.bucket);
    }

    /// Pooled Q+K statistics about the pooled mean (method §2, §9.3).
    template <class = void>  // instantiated on use
    [[nodiscard]] moments pooled() const {
        moments out = q.pooled();
        out += k.pooled();
        return out;
    }

    /// \brief Merge a shard of the same head.
    /// \throws std::invalid_argument naming the field (layer, q_head, k_head, d)
    ///         whose values differ.
    template <class = void>  // instantiated on use
    head_moments& operator+=(head_moments const& o) {
        constexpr std::string_view fn = "qkgeom::head_moments::operator+=";
        if (d == 0 && q.buckets.empty() && k.buckets.empty()) {  // default-constructed: adopt
            *this = o;
            return *this;
        }
        if (o.id.layer != id.layer)
            detail::fail_arg(fn, "layer mismatch: this has " + std::to_string(id.layer) + ", other has", o.id.layer);
        if (o.id.q_head != id.q_head)
            detail::fail_arg(fn, "q_head mismatch: this has " + std::to_string(id.q_head) + ", other has",
                             o.id.q_head);
        if (o.id.k_head != id.k_head)
            detail::fail_arg(fn, "k_head mismatch: this has " + std::to_string(id.k_head) + ", other has",
                             o.id.k_head);
        if (o.d != d) detail::fail_arg(fn, "d mismatch: this has " + std::to_string(d) + ", other has", o.d);
        q += o.q;
        k += o.k;
        return *this;
    }
};

}  // namespace qkgeom
