// qkgeom — one validation for every front end (issue 31, class 7): the
// documented ranges of the analysis options, the head-dimension limit, and
// the checks of a head's inputs that the program, study files and the Python
// package share (docs/cli.md, docs/python.md). A front end reads a value its
// own way (a command-line word, a JSON number, a Python object) and reports a
// problem in its own terms (exit 2, a study-file field, a ValueError), but
// the ranges and the checks are these.
#pragma once

#include <qkgeom/core/config.hpp>
#include <qkgeom/core/errors.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qkgeom {

/// \brief The largest head dimension d of every analysis entry point and of
/// the shard files (io::moments_max_dim): a d × d work matrix is 128 MiB at
/// d = 4096; larger d is refused before anything is allocated.
inline constexpr std::int64_t max_head_dim = 4096;

/// \brief The documented range [lo, hi] of an integer option: its name in
/// study files and Python (`Options.name`), its command-line flag.
struct option_range {
    std::string_view name;  ///< "rank_sets" (study files, Python)
    std::string_view flag;  ///< "--rank-sets" (the program)
    std::int64_t lo;        ///< smallest value accepted
    std::int64_t hi;        ///< largest value accepted

    /// \returns whether lo <= v <= hi.
    [[nodiscard]] constexpr bool contains(std::int64_t v) const noexcept { return v >= lo && v <= hi; }
    /// \returns "lo..hi" in decimal.
    [[nodiscard]] std::string text() const { return std::to_string(lo) + ".." + std::to_string(hi); }
};

/// \brief The ranges of the integer options (docs/cli.md "Options"): work is
/// bounded by them (10^12 rank sets or samples are refused, not run).
namespace option_ranges {
inline constexpr std::int64_t two_62 = std::int64_t{1} << 62;
inline constexpr std::int64_t int64_max = std::numeric_limits<std::int64_t>::max();
inline constexpr option_range jobs{"jobs", "--jobs", 1, 4096};
inline constexpr option_range components{"components", "--components", 1, max_head_dim};
inline constexpr option_range max_exact_pairs{"max_exact_pairs", "--max-exact-pairs", 0, two_62};
inline constexpr option_range samples{"samples", "--samples", 1, 1'000'000'000};
inline constexpr option_range seed{"seed", "--seed", 0, int64_max};
inline constexpr option_range empirical_budget{"empirical_budget", "--empirical-budget", 4, 1'000'000'000};
inline constexpr option_range empirical_max_exact{"empirical_max_exact", "--empirical-max-exact", 0, two_62};
inline constexpr option_range empirical_pairs{"empirical_pairs", "--empirical-pairs", 0, 1'000'000};
inline constexpr option_range rank_keys{"rank_keys", "--rank-keys", 2, 64};
inline constexpr option_range rank_sets{"rank_sets", "--rank-sets", 1, 1'000'000};
inline constexpr option_range rope_bands{"rope_bands", "--rope-bands", 1, 2048};
inline constexpr option_range window{"window", "--window", 0, two_62};
inline constexpr option_range context{"context", "--context", 0, two_62};
}  // namespace option_ranges

/// \brief What is wrong with an option value: which option (its study/Python
/// name; "low, high" for the pair), the value as text, what is expected.
struct option_problem {
    std::string option;    ///< e.g. "rank_sets"
    std::string value;     ///< e.g. "1000000000000"
    std::string expected;  ///< e.g. "an integer in 1..1000000"
};

/// \brief A double in its shortest round-trip form ("0.9", "nan", "inf").
inline std::string number_text(double x) {
    if (std::isnan(x)) return "nan";
    std::array<char, 64> buf{};
    auto const r = std::to_chars(buf.data(), buf.data() + buf.size(), x);
    return std::string(buf.data(), r.ptr);
}

/// \brief The taxonomy thresholds: 0 <= low <= high <= 1 (NaN refused).
/// \returns the problem, or none.
inline std::optional<option_problem> thresholds_problem(double low, double high) {
    if (low >= 0 && low <= high && high <= 1) return std::nullopt;
    return option_problem{"low, high", number_text(low) + ", " + number_text(high), "0 <= low <= high <= 1"};
}

/// \brief The level of sem_frac_ks_reject: 0 < alpha < 1 (NaN refused).
/// \returns the problem, or none.
inline std::optional<option_problem> ks_alpha_problem(double alpha) {
    if (alpha > 0 && alpha < 1) return std::nullopt;
    return option_problem{"ks_alpha", number_text(alpha), "0 < ks_alpha < 1"};
}

/// \brief An integer option against its range.
/// \returns the problem, or none.
inline std::optional<option_problem> range_problem(option_range const& r, std::int64_t v) {
    if (r.contains(v)) return std::nullopt;
    return option_problem{std::string(r.name), std::to_string(v), "an integer in " + r.text()};
}

/// \brief Every option of an `analysis_options` (a template so that this
/// header needs no analysis header; instantiated where the type is complete):
/// each integer in its range, the seed below 2^63, the thresholds and the
/// KS level. The first problem found, or none.
template <class Options>
std::optional<option_problem> options_problem(Options const& o) {
    namespace r = option_ranges;
    auto const& p = o.plasticity;
    for (auto const& [range, v] :
         {std::pair{r::components, static_cast<std::int64_t>(o.pca.n_components)},
          std::pair{r::max_exact_pairs, static_cast<std::int64_t>(p.max_exact_pairs)},
          std::pair{r::samples, static_cast<std::int64_t>(p.samples_per_cell)},
          std::pair{r::empirical_budget, static_cast<std::int64_t>(p.empirical_budget)},
          std::pair{r::empirical_max_exact, static_cast<std::int64_t>(p.empirical_max_exact)},
          std::pair{r::empirical_pairs, static_cast<std::int64_t>(p.empirical_pairs)},
          std::pair{r::rank_keys, static_cast<std::int64_t>(o.ranks.keys_per_set)},
          std::pair{r::rank_sets, static_cast<std::int64_t>(o.ranks.sets_per_bucket)},
          std::pair{r::rope_bands, static_cast<std::int64_t>(o.rope.n_bands)}})
        if (auto q = range_problem(range, v)) return q;
    if (p.seed > static_cast<std::uint64_t>(r::int64_max))
        return option_problem{"seed", std::to_string(p.seed), "an integer in " + r::seed.text()};
    if (auto q = thresholds_problem(o.pca.thresholds.low, o.pca.thresholds.high)) return q;
    return ks_alpha_problem(o.ks_alpha);
}

/// \brief The head dimension of an analysis input: 1 <= d <= max_head_dim.
/// \param[in] where the function or argument named in the message.
/// \param[in] d the head dimension.
/// \throws std::invalid_argument "where: head dimension d = D is outside
///         1..4096 (the limit of every analysis and shard file)".
inline void check_head_dim(std::string_view where, std::int64_t d) {
    if (d >= 1 && d <= max_head_dim) return;
    throw std::invalid_argument(std::string(where) + ": head dimension d = " + std::to_string(d) + " is outside 1.." +
                                std::to_string(max_head_dim) + " (the limit of every analysis and shard file)");
}

/// \brief The largest position of some rows against the context length
/// (method §9.12): with L > 0, every position must lie below L; a context
/// shorter than the capture is a contradiction, never a silent clip (the
/// program's `--context` and the manifest's context_length, the Python
/// `context_length`). Returns the offending largest position, or none.
/// \tparam Positions any range of integers.
template <class Positions>
std::optional<std::int64_t> position_beyond_context(Positions const& positions, std::int64_t L) {
    if (L <= 0) return std::nullopt;
    std::optional<std::int64_t> top;
    for (auto t : positions)
        if (!top || static_cast<std::int64_t>(t) > *top) top = static_cast<std::int64_t>(t);
    if (top && *top >= L) return top;
    return std::nullopt;
}

/// \brief Whether key rows are the rows some key moments were reduced from
/// (`analyze_head(head_moments, keys, ...)`: the closed forms come from the
/// moments, the plasticity from the rows, so rows of another head, batch or
/// capture would mix two heads silently). Compared per bucket: the row
/// count, the smallest and largest position exactly, the mean position and
/// each column's mean within 1e-6 of its scale (|mean| + standard
/// deviation; the same rows reduced in other batches or precision agree far
/// closer). A template (this header needs no statistics header): `km` has
/// `buckets` (a map bucket -> moments with n, t_min, t_max, mean_t, mean_x,
/// c_xx), `rows` is a MatrixReader.
/// \returns what differs ("bucket 3: 120 key rows, the key moments hold
/// 118"), or none when the rows agree.
template <class KeyMoments, class Rows, class Positions, class Buckets>
std::optional<std::string> keys_moments_mismatch(KeyMoments const& km, Rows const& rows, Positions const& positions,
                                                 Buckets const& buckets) {
    struct acc {
        std::int64_t n = 0;
        double sum_t = 0, t_min = 0, t_max = 0;
        std::vector<double> sum_x;
    };
    index_t const n = rows.rows(), d = rows.cols();
    std::map<std::int64_t, acc> got;
    std::vector<double> row(static_cast<std::size_t>(d));
    for (index_t i = 0; i < n; ++i) {
        auto& a = got[static_cast<std::int64_t>(buckets[i])];
        auto const t = static_cast<double>(positions[i]);
        if (a.n == 0) a.sum_x.assign(static_cast<std::size_t>(d), 0.0), a.t_min = a.t_max = t;
        ++a.n;
        a.sum_t += t;
        a.t_min = std::min(a.t_min, t);
        a.t_max = std::max(a.t_max, t);
        rows.read_row(i, row.data());
        for (index_t j = 0; j < d; ++j) a.sum_x[static_cast<std::size_t>(j)] += row[static_cast<std::size_t>(j)];
    }
    auto const not_same = std::string(": these are not the rows the key moments were reduced from");
    for (auto const& [b, m] : km.buckets)
        if (m.n > 0 && !got.contains(b))
            return "bucket " + std::to_string(b) + ": no key row, the key moments hold " + std::to_string(m.n) + not_same;
    for (auto const& [b, a] : got) {
        auto const it = km.buckets.find(b);
        std::int64_t const mn = it == km.buckets.end() ? 0 : static_cast<std::int64_t>(it->second.n);
        std::string const where = "bucket " + std::to_string(b) + ": ";
        if (mn != a.n)
            return where + std::to_string(a.n) + " key rows, the key moments hold " + std::to_string(mn) + not_same;
        auto const& m = it->second;
        if (m.t_min != a.t_min || m.t_max != a.t_max)
            return where + "positions " + number_text(a.t_min) + ".." + number_text(a.t_max) +
                   ", the key moments' " + number_text(m.t_min) + ".." + number_text(m.t_max) + not_same;
        double const nn = static_cast<double>(a.n);
        if (std::abs(a.sum_t / nn - m.mean_t) > 1e-9 * std::max(1.0, std::abs(m.mean_t)))
            return where + "mean position " + number_text(a.sum_t / nn) + ", the key moments' " +
                   number_text(m.mean_t) + not_same;
        for (index_t j = 0; j < d; ++j) {
            double const mean = a.sum_x[static_cast<std::size_t>(j)] / nn, ref = m.mean_x(j);
            double const sd = std::sqrt(std::max(0.0, static_cast<double>(m.c_xx(j, j))) / nn);
            if (!(std::abs(mean - ref) <= 1e-6 * (std::abs(ref) + sd)))
                return where + "mean of column " + std::to_string(j) + " " + number_text(mean) +
                       ", the key moments' " + number_text(ref) + not_same;
        }
    }
    return std::nullopt;
}

}  // namespace qkgeom
