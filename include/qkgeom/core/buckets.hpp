// qkgeom — position buckets and deterministic capture sampling (method §0.1).
//
// Three bucket schemes:
//
//   uniform  bucket = ⌊t / B⌋                                keep p = min(1, rate / B)
//   log      bucket = max(i_min, ⌊log2(t + 1)⌋),             keep p = min(1, rate / 2^bucket)
//            i_min  = ⌈log2(B_min)⌉
//   all      bucket = ⌊t / B⌋                                keep p = 1
//
// The keep decision of a token is a pure function of (seed, example_id,
// layer, kind, position): a 64-bit hash of those five values (splitmix64
// chained, documented byte-exactly in docs/buckets.md and at `keep_hash`) is
// turned into u ∈ [0, 1) with 53 bits and the token is kept iff u < p. The
// head is *not* an input, so every head of one (layer, kind) keeps the same
// positions (method §0.1).
//
// All logarithms are computed exactly with integer bit operations: no
// floating-point log2, so bucket boundaries never depend on rounding.
#pragma once

#include <qkgeom/core/config.hpp>
#include <qkgeom/core/errors.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string_view>
#include <vector>

namespace qkgeom {

/// \brief How positions are grouped into buckets and sampled (method §0.1).
enum class bucket_scheme : std::uint8_t {
    uniform = 0,  ///< width-B buckets, keep probability min(1, rate/B)
    log = 1,      ///< power-of-two buckets from i_min = ⌈log2 B_min⌉, keep probability min(1, rate/2^bucket)
    all = 2,      ///< width-B buckets, every token kept
};

/// \brief Short name of a bucket scheme.
/// \param[in] s the scheme.
/// \returns `"uniform"`, `"log"` or `"all"` (a static string); `"unknown"` for
///          a value outside the enumeration.
constexpr const char* bucket_scheme_name(bucket_scheme s) noexcept {
    switch (s) {
        case bucket_scheme::uniform: return "uniform";
        case bucket_scheme::log: return "log";
        case bucket_scheme::all: return "all";
    }
    return "unknown";
}

/// \brief A bucket scheme with its parameters (method §0.1).
///
/// `width` is B for `uniform` and `all` and B_min for `log`; it must be >= 1.
/// `rate` is the expected number of kept tokens per bucket per sequence (for
/// buckets with at least `rate` tokens); it must be finite and > 0. It is
/// ignored by `all` (but still validated: every checked function below
/// rejects a bad rate whatever the scheme).
struct bucket_spec {
    bucket_scheme scheme = bucket_scheme::uniform;  ///< the scheme
    std::int64_t width = 128;                       ///< B (uniform, all) or B_min (log); >= 1
    double rate = 1.0;                              ///< keep rate (uniform, log); finite, > 0
    /// \returns true when scheme, width and rate are all equal.
    friend bool operator==(bucket_spec const&, bucket_spec const&) = default;
};

namespace detail {

/// The splitmix64 output function applied to one input word (Steele, Lea &
/// Flood 2014; Vigna's reference `splitmix64.c` with state x):
///   z = x + 0x9E3779B97F4A7C15 (mod 2^64)
///   z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
///   z = (z ^ (z >> 27)) * 0x94D049BB133111EB
///   return z ^ (z >> 31)
/// A bijection of 64-bit words with full avalanche. `splitmix64(0)` is
/// 0xE220A8397B1DCDAF, the first output of the reference generator seeded 0.
constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
    std::uint64_t z = x + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/// One chaining step: absorb the word `v` into the running hash `h`.
constexpr std::uint64_t hash_step(std::uint64_t h, std::uint64_t v) noexcept { return splitmix64(h ^ v); }

/// The top 53 bits of `h` as a double in [0, 1): (h >> 11) · 2^-53 (exact).
constexpr double unit_interval(std::uint64_t h) noexcept {
    return static_cast<double>(h >> 11) * 0x1.0p-53;
}

/// ⌈log2 x⌉ for x >= 1, exactly (0 for x = 1).
constexpr std::int64_t ceil_log2(std::uint64_t x) noexcept {
    return x <= 1 ? 0 : static_cast<std::int64_t>(std::bit_width(x - 1));
}

/// ⌊log2 x⌋ for x >= 1, exactly.
constexpr std::int64_t floor_log2(std::uint64_t x) noexcept {
    return static_cast<std::int64_t>(std::bit_width(x)) - 1;
}

/// Checks a bucket_spec: width >= 1, rate finite and > 0, a known scheme.
inline void check_bucket_spec(std::string_view where, bucket_spec const& s) {
    if (s.scheme != bucket_scheme::uniform && s.scheme != bucket_scheme::log && s.scheme != bucket_scheme::all)
        fail_arg(where, "bucket_spec.scheme: unknown bucket scheme", static_cast<int>(s.scheme));
    if (s.width < 1) fail_arg(where, "bucket_spec.width: bucket width must be >= 1", s.width);
    if (!(std::isfinite(s.rate) && s.rate > 0.0))
        fail_arg(where, "bucket_spec.rate: keep rate must be finite and > 0", s.rate);
}

inline void check_position(std::string_view where, std::int64_t position) {
    if (position < 0) fail_arg(where, "position: must be >= 0", position);
}

/// bucket_of without validation (the caller has checked spec and position).
inline std::int64_t bucket_of_unchecked(bucket_spec const& s, std::int64_t position) noexcept {
    if (s.scheme == bucket_scheme::log) {
        std::int64_t const i_min = ceil_log2(static_cast<std::uint64_t>(s.width));
        // position + 1 in unsigned arithmetic: no overflow even at INT64_MAX.
        std::int64_t const i = floor_log2(static_cast<std::uint64_t>(position) + 1U);
        return std::max(i_min, i);
    }
    return position / s.width;
}

/// keep_probability without validation.
inline double keep_probability_unchecked(bucket_spec const& s, std::int64_t position) noexcept {
    switch (s.scheme) {
        case bucket_scheme::uniform: return std::min(1.0, s.rate / static_cast<double>(s.width));
        case bucket_scheme::log: {
            // rate · 2^-bucket, exact scaling by a power of two.
            auto const b = bucket_of_unchecked(s, position);
            return std::min(1.0, std::ldexp(s.rate, -static_cast<int>(b)));
        }
        case bucket_scheme::all: return 1.0;
    }
    return 1.0;
}

}  // namespace detail

/// \brief The smallest log bucket, i_min = ⌈log2(B_min)⌉, computed exactly
/// (method §0.1). For non-log schemes the smallest bucket is 0.
/// \param[in] spec the bucket scheme.
/// \returns ⌈log2 width⌉ for `log`, else 0.
/// \throws std::invalid_argument for an invalid spec (unknown scheme, width < 1,
///         rate not finite and > 0).
inline std::int64_t min_bucket(bucket_spec const& spec) {
    detail::check_bucket_spec("qkgeom::min_bucket", spec);
    return spec.scheme == bucket_scheme::log ? detail::ceil_log2(static_cast<std::uint64_t>(spec.width)) : 0;
}

/// \brief The bucket of a token position (method §0.1).
///
/// uniform / all: ⌊position / B⌋; log: max(i_min, ⌊log2(position + 1)⌋) with
/// i_min = ⌈log2(B_min)⌉. Both logarithms are exact integer bit operations.
/// \param[in] spec the bucket scheme.
/// \param[in] position the token position t, ≥ 0.
/// \returns the bucket index (≥ min_bucket(spec)).
/// \throws std::invalid_argument when the scheme is unknown, width < 1, rate
///         is not finite and > 0, or position < 0 (the message names the value).
inline std::int64_t bucket_of(bucket_spec const& spec, std::int64_t position) {
    constexpr std::string_view fn = "qkgeom::bucket_of";
    detail::check_bucket_spec(fn, spec);
    detail::check_position(fn, position);
    return detail::bucket_of_unchecked(spec, position);
}

/// \brief The probability that a token at `position` is kept (method §0.1).
///
/// uniform: min(1, rate/B); log: min(1, rate/2^bucket_of(position)); all: 1.
/// \param[in] spec the bucket scheme.
/// \param[in] position the token position t, ≥ 0.
/// \returns the keep probability p ∈ (0, 1].
/// \throws std::invalid_argument as bucket_of.
inline double keep_probability(bucket_spec const& spec, std::int64_t position) {
    constexpr std::string_view fn = "qkgeom::keep_probability";
    detail::check_bucket_spec(fn, spec);
    detail::check_position(fn, position);
    return detail::keep_probability_unchecked(spec, position);
}

/// \brief The 64-bit keep hash of one token (method §0.1 determinism contract).
///
/// With `splitmix64` as documented in `detail::splitmix64` and every integer
/// converted to its 64-bit two's-complement bit pattern:
///
///     h = splitmix64(seed)
///     h = splitmix64(h ^ example_id)
///     h = splitmix64(h ^ layer)
///     h = splitmix64(h ^ kind)        // query = 0, key = 1
///     h = splitmix64(h ^ position)
///
/// The head index is deliberately not an input.
/// \param[in] seed the capture seed.
/// \param[in] example_id the example (sequence) id.
/// \param[in] layer the layer index.
/// \param[in] k query or key.
/// \param[in] position the token position (not checked; any value hashes).
/// \returns the hash h.
constexpr std::uint64_t keep_hash(std::uint64_t seed, std::int64_t example_id, std::int64_t layer, kind k,
                                  std::int64_t position) noexcept {
    std::uint64_t h = detail::splitmix64(seed);
    h = detail::hash_step(h, static_cast<std::uint64_t>(example_id));
    h = detail::hash_step(h, static_cast<std::uint64_t>(layer));
    h = detail::hash_step(h, static_cast<std::uint64_t>(k));
    h = detail::hash_step(h, static_cast<std::uint64_t>(position));
    return h;
}

/// \brief The uniform variate of one token: u = (keep_hash >> 11) · 2^-53 ∈ [0, 1).
/// \param[in] seed the capture seed.
/// \param[in] example_id the example (sequence) id.
/// \param[in] layer the layer index.
/// \param[in] k query or key.
/// \param[in] position the token position (not checked).
/// \returns u, exact (53 bits).
/// \sa keep_hash, keep_token
constexpr double keep_uniform(std::uint64_t seed, std::int64_t example_id, std::int64_t layer, kind k,
                              std::int64_t position) noexcept {
    return detail::unit_interval(keep_hash(seed, example_id, layer, k, position));
}

/// \brief Whether the token (example_id, layer, kind, position) is captured
/// (method §0.1): `keep_uniform(...) < keep_probability(spec, position)`.
///
/// A pure function of its arguments: the same positions are kept for every
/// head of one (layer, kind), on every platform. With p = 1 (scheme `all`, or
/// rate >= bucket size) every token is kept, since u < 1 always.
/// \param[in] spec the bucket scheme.
/// \param[in] seed the capture seed.
/// \param[in] example_id the example (sequence) id.
/// \param[in] layer the layer index.
/// \param[in] k query or key.
/// \param[in] position the token position, ≥ 0.
/// \returns true when the token is kept.
/// \throws std::invalid_argument when the scheme is unknown, width < 1, rate
///         is not finite and > 0, or position < 0.
inline bool keep_token(bucket_spec const& spec, std::uint64_t seed, std::int64_t example_id, std::int64_t layer,
                       kind k, std::int64_t position) {
    constexpr std::string_view fn = "qkgeom::keep_token";
    detail::check_bucket_spec(fn, spec);
    detail::check_position(fn, position);
    double const p = detail::keep_probability_unchecked(spec, position);
    if (p >= 1.0) return true;
    return keep_uniform(seed, example_id, layer, k, position) < p;
}

/// \brief The kept positions 0 <= t < length of one (example, layer, kind),
/// ascending: every t with `keep_token(spec, seed, example_id, layer, k, t)`.
/// \param[in] spec the bucket scheme.
/// \param[in] seed the capture seed.
/// \param[in] example_id the example (sequence) id.
/// \param[in] layer the layer index.
/// \param[in] k query or key.
/// \param[in] length the sequence length, ≥ 0.
/// \returns the kept positions, ascending.
/// \throws std::invalid_argument for an invalid spec or length < 0.
/// \throws std::bad_alloc if the result cannot be allocated.
inline std::vector<std::int64_t> kept_positions(bucket_spec const& spec, std::uint64_t seed, std::int64_t example_id,
                                                std::int64_t layer, kind k, std::int64_t length) {
    constexpr std::string_view fn = "qkgeom::kept_positions";
    detail::check_bucket_spec(fn, spec);
    if (length < 0) detail::fail_arg(fn, "length: sequence length must be >= 0", length);
    std::vector<std::int64_t> out;
    for (std::int64_t t = 0; t < length; ++t) {
        double const p = detail::keep_probability_unchecked(spec, t);
        if (p >= 1.0 || keep_uniform(seed, example_id, layer, k, t) < p) out.push_back(t);
    }
    return out;
}

}  // namespace qkgeom
