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

#include <qkgeom/core/config.hpp>
#include <qkgeom/core/errors.hpp>
#include <qkgeom/core/head.hpp>
#include <qkgeom/core/tensor.hpp>
#include <qkgeom/simd/dispatch.hpp>
#include <qkgeom/simd/moment_kernels.hpp>

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
#include <type_traits>
#include <utility>
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

    /// \brief Empty statistics of dimension 0 (adopts the dimension of the
    /// first non-empty `moments` merged into it with `+=`).
    moments() = default;
    /// \brief Empty statistics of dimension d: zero means and co-moments,
    /// `n == 0`, `t_min == +∞`, `t_max == −∞`.
    /// \param[in] d the row dimension, ≥ 0.
    /// \throws std::invalid_argument if d < 0.
    /// \throws std::bad_alloc if the d × d co-moment cannot be allocated.
    explicit moments(index_t d)
        : mean_x(Eigen::VectorXd::Zero(checked_dim(d))), c_xt(Eigen::VectorXd::Zero(d)),
          c_xx(Eigen::MatrixXd::Zero(d, d)) {}

    /// \brief d, checked to be ≥ 0 (the constructor's first step).
    static index_t checked_dim(index_t d) {
        if (d < 0) detail::fail_arg("qkgeom::moments", "row dimension d must be >= 0", d);
        return d;
    }

    /// \brief The row dimension d.
    /// \returns `mean_x.size()`; 0 for a default-constructed `moments`.
    [[nodiscard]] index_t dim() const noexcept { return mean_x.size(); }
    /// \brief Whether no row has been added.
    /// \returns `n == 0`.
    [[nodiscard]] bool empty() const noexcept { return n == 0; }

    // --- raw sums, for readers of method §1 (Σt, Σt², Σx, Σx·t, Σxxᵀ) ---
    /// \brief Σt, recovered from the centred form (method §1).
    /// \returns n·t̄; 0 when empty.
    [[nodiscard]] double sum_t() const noexcept { return static_cast<double>(n) * mean_t; }
    /// \brief Σt², recovered from the centred form (method §1).
    /// \returns M2_t + n·t̄²; 0 when empty.
    [[nodiscard]] double sum_t2() const noexcept { return m2_t + static_cast<double>(n) * mean_t * mean_t; }
    /// \brief Σx, recovered from the centred form (method §1).
    /// \returns n·x̄ (d); zeros when empty.
    /// \throws std::bad_alloc if the result cannot be allocated.
    template <class V = void>  // instantiated on use
    [[nodiscard]] Eigen::VectorXd sum_x() const {
        auto const& s = detail::dep_ref<V>(*this);
        return static_cast<double>(s.n) * s.mean_x;
    }
    /// \brief Σx·t, recovered from the centred form (method §1).
    /// \returns C_xt + n·t̄·x̄ (d); zeros when empty.
    /// \throws std::bad_alloc if the result cannot be allocated.
    template <class V = void>  // instantiated on use
    [[nodiscard]] Eigen::VectorXd sum_xt() const {
        auto const& s = detail::dep_ref<V>(*this);
        return s.c_xt + static_cast<double>(s.n) * s.mean_t * s.mean_x;
    }
    /// \brief Σxxᵀ, recovered from the centred form (method §1).
    /// \returns C_xx + n·x̄x̄ᵀ (d × d, symmetric); zeros when empty.
    /// \throws std::bad_alloc if the result cannot be allocated.
    template <class V = void>  // instantiated on use
    [[nodiscard]] Eigen::MatrixXd sum_xx() const {
        auto const& s = detail::dep_ref<V>(*this);
        return s.c_xx + static_cast<double>(s.n) * s.mean_x * s.mean_x.transpose();
    }

    // --- sample (n−1) statistics, method §9.1; NaN when n < 2 ---
    /// \brief Sample variance of the positions, M2_t / (n − 1) (method §9.1).
    /// \returns the variance; NaN when n < 2.
    [[nodiscard]] double var_t() const noexcept {
        return n < 2 ? std::numeric_limits<double>::quiet_NaN() : m2_t / static_cast<double>(n - 1);
    }
    /// \brief Sample covariance of the rows with the position, C_xt / (n − 1)
    /// (method §9.1).
    /// \returns the covariance (d); all NaN when n < 2.
    /// \throws std::bad_alloc if the result cannot be allocated.
    template <class V = void>  // instantiated on use
    [[nodiscard]] Eigen::VectorXd cov_xt() const {
        using VecX = detail::dep_t<Eigen::VectorXd, V>;
        auto const& s = detail::dep_ref<V>(*this);
        return n < 2 ? VecX::Constant(dim(), std::numeric_limits<double>::quiet_NaN())
                     : VecX(s.c_xt / static_cast<double>(n - 1));
    }
    /// \brief Sample covariance matrix of the rows, C_xx / (n − 1) (method §9.1).
    /// \returns the covariance (d × d, symmetric); all NaN when n < 2.
    /// \throws std::bad_alloc if the result cannot be allocated.
    template <class V = void>  // instantiated on use
    [[nodiscard]] Eigen::MatrixXd cov_x() const {
        using MatX = detail::dep_t<Eigen::MatrixXd, V>;
        auto const& s = detail::dep_ref<V>(*this);
        return n < 2 ? MatX::Constant(dim(), dim(), std::numeric_limits<double>::quiet_NaN())
                     : MatX(s.c_xx / static_cast<double>(n - 1));
    }

    /// \brief Chan et al. pairwise merge: `*this` becomes the statistics of the
    /// union of both row sets. Merging in any order agrees to rounding.
    ///
    /// An empty `o` changes nothing; an empty `*this` becomes a copy of `o`
    /// (so a default-constructed, dimension-0 `moments` adopts o's dimension).
    /// \param[in] o the statistics of the other row set.
    /// \returns `*this`.
    /// \throws std::invalid_argument when both dimensions are non-zero and
    ///         differ; `*this` is unchanged when it throws.
    /// \throws std::bad_alloc if a temporary cannot be allocated.
    template <class V = void>
    moments& operator+=(moments const& other) {
        auto& s = detail::dep_ref<V>(*this);
        auto const& o = detail::dep_ref<V>(other);
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
        detail::dep_t<Eigen::VectorXd, V> const dx = o.mean_x - s.mean_x;
        m2_t += o.m2_t + f * dt * dt;
        t_min = std::min(t_min, o.t_min);
        t_max = std::max(t_max, o.t_max);
        s.c_xt += o.c_xt + (f * dt) * dx;
        s.c_xx += o.c_xx;
        s.c_xx.noalias() += f * dx * dx.transpose();
        mean_t += dt * (nb / nt);
        s.mean_x += dx * (nb / nt);
        n += o.n;
        return *this;
    }

    /// \brief The statistics of the union of two row sets (Chan merge, as `+=`).
    /// \param[in] a the statistics of the first row set (taken by value).
    /// \param[in] b the statistics of the second row set.
    /// \returns `a += b`.
    /// \throws std::invalid_argument when both dimensions are non-zero and differ.
    /// \throws std::bad_alloc if a copy or temporary cannot be allocated.
    template <class = void>  // instantiated on use
    friend moments operator+(moments a, moments const& b) { return a += b; }

    /// \brief Absorb one block of rows: `x` is nb × d row-major, `t` holds nb
    /// positions. Only the lower triangle of `c_xx` is updated; callers finish
    /// with `symmetrize()`. The building block of every `add`.
    ///
    /// Nothing is validated here: use `add_rows` or `bucketed_moments::add`
    /// for checked input.
    /// \param[in] x nb × d doubles, row-major (d = `dim()`).
    /// \param[in] t nb positions (finite; exact integers by convention).
    /// \param[in] nb the number of rows; nb ≤ 0 does nothing.
    /// \param[out] scratch work space, resized to d × nb (reuse it across calls).
    /// \pre `x` and `t` point to nb·d and nb finite doubles; `dim()` is the
    ///      row dimension (a default-constructed `moments` has d = 0).
    /// \throws std::bad_alloc if a temporary cannot be allocated (the
    ///         statistics may then be partly updated).
    template <class V = void>  // instantiated on use
    void add_block(double const* x, double const* t, index_t nb, Eigen::MatrixXd& scratch) {
        detail::dep_ref<V>(*this).add_block_rows(x, dim(), nullptr, t, nb, scratch);
    }

    /// \brief `add_block` for rows where they are: row k of the block is
    /// x + rows[k]·ld, or x + k·ld when `rows` is null; S is double or float
    /// (f32 rows are widened exactly on load, no widened copy is made at the
    /// avx2 / avx512 levels). Nothing is validated.
    /// \param[in] x the first value of row 0 (rows == null) or of the indexed rows.
    /// \param[in] ld values from one row to the next (≥ d).
    /// \param[in] rows nb row indices, or null.
    /// \param[in] t nb positions (finite).
    /// \param[in] nb the number of rows; nb ≤ 0 does nothing.
    /// \param[out] scratch work space (reuse it across calls).
    /// \throws std::bad_alloc if a temporary cannot be allocated.
    template <class S>
    void add_block_rows(S const* x, index_t ld, index_t const* rows, double const* t, index_t nb,
                        Eigen::MatrixXd& scratch) {
        if (nb <= 0) return;
        using VecX = detail::dep_t<Eigen::VectorXd, S>;
        auto& s = detail::dep_ref<S>(*this);
        index_t const d = dim();
        Eigen::Map<VecX const> T(t, nb);
        double const inv = 1.0 / static_cast<double>(nb);
        // Two-pass block means, with the correction term of the second pass.
        double bt = T.sum() * inv;
        VecX tc = T.array() - bt;
        double const tcorr = tc.sum() * inv;
        bt += tcorr;
        tc.array() -= tcorr;
        VecX bx(d), bxt(d);  // block mean x̄_B and C_xt,B = R τ
        s.block_x(x, ld, rows, tc.data(), nb, bx, bxt, scratch);  // also c_xx (lower) += R Rᵀ

        double const na = static_cast<double>(n), nbd = static_cast<double>(nb), nt = na + nbd;
        double const f = na * nbd / nt;
        double const dt = bt - mean_t;
        VecX const dx = bx - s.mean_x;

        m2_t += tc.squaredNorm() + f * dt * dt;
        t_min = std::min(t_min, T.minCoeff());
        t_max = std::max(t_max, T.maxCoeff());
        s.c_xt += bxt;
        s.c_xt += (f * dt) * dx;
        if (n > 0) s.c_xx.template selfadjointView<Eigen::Lower>().rankUpdate(dx, f);
        mean_t += dt * (nbd / nt);
        s.mean_x += dx * (nbd / nt);
        n += nb;
    }

    /// \brief The row part of `add_block_rows`: the corrected block mean `bx`,
    /// the block's C_xt,B = R τ (`tc`: the nb centred positions) into `bxt`,
    /// and R Rᵀ added to the lower triangle of `c_xx`, R the centred block.
    ///
    /// At `simd::active()` = avx2 or avx512 the two-pass centring and the
    /// register-blocked rank-k update of simd/moment_kernels.hpp run on the
    /// rows where they are, the correction ε of the block mean entering as
    /// R Rᵀ = Σ rᵢ rᵢᵀ − nb ε εᵀ (rᵢ = xᵢ − x̃); at the generic level, Eigen
    /// (GEMV and `rankUpdate`) on a double copy of the block. The levels
    /// agree to rounding (docs/moments.md, "The kernels").
    /// \param[in] x, ld, rows the block's rows (as `add_block_rows`).
    /// \param[in] tc nb centred positions.
    /// \param[in] nb the number of rows, ≥ 1.
    /// \param[out] bx the block mean (d).
    /// \param[out] bxt Σ rᵢ τᵢ (d).
    /// \param[out] scratch work space (reuse it across calls).
    /// \throws std::bad_alloc if the work space cannot be allocated.
    template <class S>
    void block_x(S const* x, index_t ld, index_t const* rows, double const* tc, index_t nb, Eigen::VectorXd& bx,
                 Eigen::VectorXd& bxt, Eigen::MatrixXd& scratch) {
        using VecX = detail::dep_t<Eigen::VectorXd, S>;
        auto& s = detail::dep_ref<S>(*this);
        index_t const d = dim();
        simd::isa const level = d > 0 ? simd::active() : simd::isa::generic;
        if (level != simd::isa::generic) {
            index_t const w = detail::mom::panel_width(level), dp = (d + w - 1) / w * w;
            index_t const need = detail::mom::work_size(level, d, nb);
            if (scratch.size() < need) scratch.resize(need, 1);
            double* pk = detail::mom::align64(scratch.data());
            double* mb = pk + dp * nb;
            detail::mom::centre_pack(level, x, ld, rows, tc, nb, d, pk, mb, mb + dp, mb + 2 * dp);
            detail::mom::syrk_packed(level, pk, nb, d, c_xx.data(), d);
            double const* eps = mb + 2 * dp;  // lower triangle −= nb ε εᵀ
            for (index_t j = 0; j < d; ++j) {
                double const f = static_cast<double>(nb) * eps[j];
                double* col = c_xx.data() + j * d;
                for (index_t i = j; i < d; ++i) col[i] -= f * eps[i];
            }
            bx = Eigen::Map<VecX const>(mb, d);
            bxt = Eigen::Map<VecX const>(mb + dp, d);
            return;
        }
        using RowMat = detail::dep_t<Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, S>;
        RowMat copy;
        double const* xd = nullptr;
        if constexpr (std::is_same_v<S, double>)
            if (rows == nullptr && ld == d) xd = x;
        if (xd == nullptr) {  // a double copy of the block
            copy.resize(nb, d);
            for (index_t k = 0; k < nb; ++k) {
                S const* src = x + (rows != nullptr ? rows[k] : k) * ld;
                for (index_t j = 0; j < d; ++j) copy(k, j) = static_cast<double>(src[j]);
            }
            xd = copy.data();
        }
        Eigen::Map<RowMat const> X(xd, nb, d);
        double const inv = 1.0 / static_cast<double>(nb);
        auto& work = detail::dep_ref<S>(scratch);
        detail::dep_t<Eigen::RowVectorXd, S> mx = X.colwise().sum() * inv;
        work.resize(d, nb);  // column-major d × nb = centred block, transposed
        work = (X.rowwise() - mx).transpose();
        VecX const corr = work.rowwise().sum() * inv;
        bx = mx.transpose() + corr;
        work.colwise() -= corr;
        bxt.noalias() = work * Eigen::Map<VecX const>(tc, nb);
        s.c_xx.template selfadjointView<Eigen::Lower>().rankUpdate(work);
    }

    /// \brief Copy the lower triangle of `c_xx` onto the upper one (restores
    /// the symmetry invariant after `add_block`).
    template <class V = void>  // instantiated on use
    void symmetrize() {
        auto& m = detail::dep_ref<V>(c_xx);
        m.template triangularView<Eigen::StrictlyUpper>() = m.transpose();
    }
};

namespace detail {

/// Whether some value of x[0..n) is NaN, ±inf or |x| ≥ input_limit (2¹²⁸).
/// (bits & exponent) + 0x381·2⁵² carries into the sign bit iff the biased
/// exponent is ≥ 0x47F = 1023 + 128, i.e. |x| ≥ 2¹²⁸ (±inf and NaN have the
/// all-ones exponent 0x7FF); OR over the values: integer SSE2 operations only.
inline bool any_out_of_range(double const* x, index_t n) noexcept {
    static_assert(input_limit == 0x1p128, "the added constant encodes the exponent of input_limit");
    std::uint64_t acc = 0;
    for (index_t j = 0; j < n; ++j)
        acc |= (std::bit_cast<std::uint64_t>(x[j]) & 0x7ff0000000000000u) + 0x3810000000000000u;
    return (acc >> 63) != 0;
}

/// Throws for the first value of a row that `any_out_of_range` flagged,
/// naming the row, the column, the value and the limit (method §9.18).
[[noreturn]] inline void fail_out_of_range(std::string_view where, std::string_view dtype, index_t i,
                                           double const* row, index_t d) {
    for (index_t j = 0; j < d; ++j) {
        double const v = row[j];
        std::string at(" ");  // appended piece by piece: GCC 12 -O3 -Wrestrict misfires on "literal" + string
        at.append(dtype).append(" value at row ").append(std::to_string(i));
        at.append(", column ").append(std::to_string(j));
        if (!std::isfinite(v)) fail_arg(where, "rows: non-finite" + at, v);
        if (!(std::abs(v) < input_limit))
            fail_arg(where, "rows:" + at + " is outside the input limit |x| < 2^128 = 3.4028236692093846e+38", v);
    }
    fail_arg(where, "rows: value out of range at row", i);  // not reached: some value was flagged
}

/// The f32 storage of a reader whose rows are contiguous f32 values
/// (`matrix_view<float>` with column stride 1) and its row stride, else
/// {nullptr, 0}: the paths that
/// scan and widen such rows with the dispatched kernels.
template <class R>
[[nodiscard]] std::pair<float const*, index_t> contiguous_f32(R const& r) noexcept {
    if constexpr (std::is_same_v<R, matrix_view<float>>) {
        if (r.col_stride() == 1) return {r.data(), r.row_stride()};
    } else {
        (void)r;
    }
    return {nullptr, 0};
}

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
    if (auto const [f, ld] = contiguous_f32(r); f != nullptr) {  // f32: finite ⇔ |x| < 2^128; scan the floats
        simd::isa const level = simd::active();
        for (index_t i = 0; i < r.rows(); ++i)
            if (mom::any_nonfinite_f32(level, f + i * ld, d)) {
                r.read_row(i, row.data());
                fail_out_of_range(where, r.dtype(), i, row.data(), d);
            }
        return;
    }
    for (index_t i = 0; i < r.rows(); ++i) {
        r.read_row(i, row.data());
        if (any_out_of_range(row.data(), d)) fail_out_of_range(where, r.dtype(), i, row.data(), d);
    }
}

/// Work space of `absorb_rows`, reused across the groups of one `add`.
struct absorb_work {
    std::vector<double> xb, tb;
    Eigen::MatrixXd scratch;
};

/// Streams the rows listed in `idx` through `m.add_block_rows` in blocks:
/// contiguous f32 rows are read in place by the dispatched kernels, other
/// rows are read (widened) into a double block first.
template <MatrixReader R, IndexReader P>
void absorb_rows(moments& m, R const& r, P const& p, std::span<index_t const> idx, absorb_work& w) {
    index_t const d = m.dim();
    index_t const B = moments::block_rows;
    w.tb.resize(static_cast<std::size_t>(B));
    auto const [f32, ld] = contiguous_f32(r);
    bool const in_place = f32 != nullptr && simd::active() != simd::isa::generic;
    if (!in_place) w.xb.resize(static_cast<std::size_t>(B * d));
    simd::isa const level = simd::active();
    auto const total = static_cast<index_t>(idx.size());
    for (index_t s = 0; s < total; s += B) {
        index_t const nb = std::min(B, total - s);
        index_t const* rows = idx.data() + s;
        for (index_t i = 0; i < nb; ++i) w.tb[static_cast<std::size_t>(i)] = static_cast<double>(p[rows[i]]);
        if (in_place) {
            m.add_block_rows(f32, ld, rows, w.tb.data(), nb, w.scratch);
            continue;
        }
        for (index_t i = 0; i < nb; ++i) {
            if (f32 != nullptr) mom::widen_f32(level, f32 + rows[i] * ld, w.xb.data() + i * d, d);
            else r.read_row(rows[i], w.xb.data() + i * d);
        }
        m.add_block(w.xb.data(), w.tb.data(), nb, w.scratch);
    }
    m.symmetrize();
}

/// The row indices 0 … n − 1 grouped by bucket, stable (rows keep their input
/// order within a bucket): as they are when the buckets are already in
/// order, by counting when their range is at most 4n + 64, else by a stable
/// sort.
template <IndexReader B>
[[nodiscard]] std::vector<index_t> group_by_bucket(B const& b) {
    index_t const n = b.size();
    std::vector<index_t> idx(static_cast<std::size_t>(n));
    std::iota(idx.begin(), idx.end(), index_t{0});
    if (n == 0) return idx;
    bool sorted = true;
    std::int64_t lo = b[0], hi = b[0];
    for (index_t i = 1; i < n; ++i) {
        sorted = sorted && b[i - 1] <= b[i];
        lo = std::min<std::int64_t>(lo, b[i]);
        hi = std::max<std::int64_t>(hi, b[i]);
    }
    if (sorted) return idx;
    // hi − lo cannot overflow: the buckets are non-negative (check_batch).
    if (static_cast<std::uint64_t>(hi - lo) <= static_cast<std::uint64_t>(4 * n + 64)) {
        std::vector<index_t> start(static_cast<std::size_t>(hi - lo + 2), 0);
        for (index_t i = 0; i < n; ++i) ++start[static_cast<std::size_t>(b[i] - lo + 1)];
        std::partial_sum(start.begin(), start.end(), start.begin());
        for (index_t i = 0; i < n; ++i) idx[static_cast<std::size_t>(start[static_cast<std::size_t>(b[i] - lo)]++)] = i;
        return idx;
    }
    std::stable_sort(idx.begin(), idx.end(), [&](index_t a, index_t c) { return b[a] < b[c]; });
    return idx;
}

}  // namespace detail

/// \brief Add rows that all belong to one group to `m` (method §1).
/// \tparam X any RowMatrix (Eigen, xtensor, torch adapters, `matrix_view`…).
/// \tparam P any IndexVector.
/// \param[in,out] m the statistics to update; its dimension must already be
///                d (a default-constructed `moments` has d = 0 and rejects
///                every row).
/// \param[in] rows       n × d rows, n ≥ 1, d == m.dim(), all finite.
/// \param[in] positions  n non-negative token positions.
/// \throws std::invalid_argument on zero rows, a column count other than
///         m.dim(), a positions length other than n, negative positions,
///         NaN/Inf values or values outside the input limit |x| < 2^128 (`input_limit`); `m` is unchanged when it throws.
/// \throws std::bad_alloc if a work buffer cannot be allocated.
/// \sa bucketed_moments::add
template <RowMatrix X, IndexVector P>
void add_rows(moments& m, X const& rows, P const& positions) {
    auto const r = as_matrix(rows);
    auto const p = as_indices(positions);
    detail::check_batch<decltype(r), decltype(p), decltype(p)>("qkgeom::add_rows", m.dim(), r, p, nullptr);
    std::vector<index_t> idx(static_cast<std::size_t>(r.rows()));
    std::iota(idx.begin(), idx.end(), index_t{0});
    detail::absorb_work w;
    detail::absorb_rows(m, r, p, idx, w);
}

/// \brief The statistics of one kind (queries or keys) of one head, per
/// position bucket (method §1). Buckets are kept sorted; a bucket exists only
/// once it holds at least one row.
struct bucketed_moments {
    index_t d = 0;                             ///< head dimension
    std::map<std::int64_t, moments> buckets;   ///< bucket id -> statistics

    /// \brief No buckets, d = 0 (adopts the dimension of the first shard
    /// merged into it with `+=`; `add` rejects rows until then).
    bucketed_moments() = default;
    /// \brief No buckets, head dimension `dim`.
    /// \param[in] dim the head dimension (checked by `add`, not here).
    explicit bucketed_moments(index_t dim) : d(dim) {}

    /// \brief Total number of rows over all buckets.
    /// \returns Σ n over the buckets; 0 when there are none.
    [[nodiscard]] std::int64_t count() const noexcept {
        std::int64_t s = 0;
        for (auto const& [b, m] : buckets) s += m.n;
        return s;
    }

    /// \brief The statistics of all rows of this kind (buckets merged in
    /// ascending order).
    /// \returns the pooled statistics, dimension d; empty when there are no buckets.
    /// \throws std::bad_alloc if the result cannot be allocated.
    template <class = void>  // instantiated on use
    [[nodiscard]] moments pooled() const {
        moments out(d);
        for (auto const& [b, m] : buckets) out += m;
        return out;
    }

    /// \brief Add a batch of rows with their positions and bucket ids.
    ///
    /// Rows are grouped by bucket (stably) and each group is absorbed into
    /// its bucket's `moments`, which is created on first use.
    /// \tparam X any RowMatrix.
    /// \tparam P any IndexVector.
    /// \tparam B any IndexVector.
    /// \param[in] rows       n × d rows, n ≥ 1, all finite.
    /// \param[in] positions  n non-negative token positions.
    /// \param[in] bucket_ids n non-negative bucket ids.
    /// \pre d ≥ 1.
    /// \throws std::invalid_argument when d < 1, on zero rows, a column count
    ///         other than d, a positions or bucket_ids length other than n,
    ///         negative positions or bucket ids, NaN/Inf values or |x| ≥ 2^128; strong
    ///         guarantee: nothing is added when it throws.
    /// \throws std::bad_alloc if a work buffer or bucket cannot be allocated
    ///         (buckets earlier in the batch may then already be updated).
    template <RowMatrix X, IndexVector P, IndexVector B>
    void add(X const& rows, P const& positions, B const& bucket_ids) {
        static_assert(!detail::other_meaning<std::remove_cvref_t<P>, detail::position_tag>,
                      "qkgeom::bucketed_moments::add: the positions argument is a token_buckets or example_ids array");
        static_assert(!detail::other_meaning<std::remove_cvref_t<B>, detail::bucket_tag>,
                      "qkgeom::bucketed_moments::add: the buckets argument is a token_positions or example_ids array");
        auto const r = as_matrix(rows);
        auto const p = as_indices(positions);
        auto const b = as_indices(bucket_ids);
        if (d <= 0) detail::fail_arg("qkgeom::bucketed_moments::add", "head dimension d must be >= 1", d);
        detail::check_batch("qkgeom::bucketed_moments::add", d, r, p, &b);
        std::vector<index_t> const idx = detail::group_by_bucket(b);  // stable: input order within a bucket
        detail::absorb_work w;
        std::size_t s = 0;
        while (s < idx.size()) {
            std::int64_t const bucket = b[idx[s]];
            std::size_t e = s;
            while (e < idx.size() && b[idx[e]] == bucket) ++e;
            auto [it, inserted] = buckets.try_emplace(bucket, d);
            detail::absorb_rows(it->second, r, p, std::span<index_t const>(idx.data() + s, e - s), w);
            s = e;
        }
    }

    /// \brief Merge another shard of the same kind (bucket by bucket).
    ///
    /// A shard with no buckets changes nothing (but gives a d = 0 `*this`
    /// its d); a d = 0 `*this` adopts o.d.
    /// \param[in] o the other shard.
    /// \returns `*this`.
    /// \throws std::invalid_argument when both head dimensions are non-zero
    ///         and differ, also for an empty shard (`*this` unchanged).
    /// \throws std::bad_alloc if a bucket or temporary cannot be allocated.
    template <class = void>  // instantiated on use
    bucketed_moments& operator+=(bucketed_moments const& o) {
        if (d != 0 && o.d != 0 && o.d != d)
            detail::fail_arg("qkgeom::bucketed_moments::operator+=",
                             "head dimension mismatch: this has d = " + std::to_string(d) + ", other has d", o.d);
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
/// The unit that shards are reduced to, merged and serialised (io/moments_io.hpp).
struct head_moments {
    head_id id;           ///< which head (checked on merge)
    index_t d = 0;        ///< head dimension
    bucketed_moments q;   ///< query statistics per bucket
    bucketed_moments k;   ///< key statistics per bucket

    /// \brief Empty, d = 0: adopts the first shard merged into it with `+=`.
    head_moments() = default;
    /// \brief Empty statistics of one head.
    /// \param[in] dim the head dimension, ≥ 1.
    /// \param[in] hid which head (compared by `+=`).
    /// \throws std::invalid_argument if dim < 1.
    explicit head_moments(index_t dim, head_id hid = {}) : id(hid), d(dim), q(dim), k(dim) {
        if (dim <= 0) detail::fail_arg("qkgeom::head_moments", "head dimension d must be >= 1", dim);
    }

    /// \brief The statistics of one kind.
    /// \param[in] w `kind::query` or `kind::key`.
    /// \returns `q` for queries, `k` otherwise.
    [[nodiscard]] bucketed_moments& operator[](kind w) noexcept { return w == kind::query ? q : k; }
    /// \brief The statistics of one kind (read-only).
    /// \param[in] w `kind::query` or `kind::key`.
    /// \returns `q` for queries, `k` otherwise.
    [[nodiscard]] bucketed_moments const& operator[](kind w) const noexcept { return w == kind::query ? q : k; }

    /// \brief Add a batch of query or key rows (see bucketed_moments::add).
    /// \param[in] w          which kind the rows are.
    /// \param[in] rows       n × d rows, n ≥ 1, all finite.
    /// \param[in] positions  n non-negative token positions.
    /// \param[in] bucket_ids n non-negative bucket ids.
    /// \throws std::invalid_argument, std::bad_alloc as bucketed_moments::add;
    ///         nothing is added when the input is rejected.
    template <RowMatrix X, IndexVector P, IndexVector B>
    void add(kind w, X const& rows, P const& positions, B const& bucket_ids) {
        (*this)[w].add(rows, positions, bucket_ids);
    }

    /// \brief Add the rows of one kind of a head (`head_capture::queries` or
    /// `::keys`): their vectors, positions and buckets.
    /// \param[in] w    which kind the rows are.
    /// \param[in] rows the rows with their positions and buckets.
    /// \throws std::invalid_argument, std::bad_alloc as bucketed_moments::add.
    template <RowMatrix X>
    void add(kind w, token_rows<X> const& rows) {
        (*this)[w].add(rows.vectors, rows.position, rows.bucket);
    }

    /// \brief Pooled Q+K statistics about the pooled mean (method §2, §9.3).
    /// \returns the merge of `q.pooled()` and `k.pooled()`; empty when no row
    ///          has been added.
    /// \throws std::invalid_argument if q and k have different non-zero
    ///         dimensions (only if they were modified directly).
    /// \throws std::bad_alloc if the result cannot be allocated.
    template <class = void>  // instantiated on use
    [[nodiscard]] moments pooled() const {
        moments out = q.pooled();
        out += k.pooled();
        return out;
    }

    /// \brief Merge a shard of the same head.
    ///
    /// A default-constructed `*this` (d = 0, no buckets) becomes a copy of `o`.
    /// \param[in] o the other shard.
    /// \returns `*this`.
    /// \throws std::invalid_argument naming the field (layer, q_head, k_head, d)
    ///         whose values differ; `*this` is unchanged then.
    /// \throws std::bad_alloc if a bucket or temporary cannot be allocated.
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
