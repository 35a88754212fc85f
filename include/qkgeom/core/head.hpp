// qkgeom — a head as one value: its identity, its capture facts and its rows
// (method §0). Every analysis that needs rows takes a `head_capture`; every
// producer (io::read_capture, synthetic::generate_head, capture_store, the
// LibTorch capture) makes one.
//
// The three integer annotations of a row are distinct types
// (`token_positions`, `token_buckets`, `example_ids`), so a position array
// cannot be passed, assigned or aggregate-initialised where a bucket array
// belongs: the mistake does not compile (tests/compile_fail). A mislabelled
// array (positions wrapped as buckets) is caught at run time when the capture
// facts name the bucket scheme: every bucket must equal bucket_of(position).
#pragma once

#include <qkgeom/core/buckets.hpp>
#include <qkgeom/core/config.hpp>
#include <qkgeom/core/errors.hpp>
#include <qkgeom/core/tensor.hpp>

#include <Eigen/Core>

#include <compare>
#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace qkgeom {

/// \brief Identity of a head pair (method §0): layer, query head and the key
/// head it reads (GQA: k_head = ⌊q_head / (n_q / n_kv)⌋). −1 = not recorded.
/// The one spelling of the triple in the library, the program and the files.
struct head_id {
    std::int64_t layer = -1;   ///< layer index
    std::int64_t q_head = -1;  ///< query head
    std::int64_t k_head = -1;  ///< key/value head
    friend bool operator==(head_id const&, head_id const&) = default;
    friend auto operator<=>(head_id const&, head_id const&) = default;
};

/// \brief How RoPE pairs the coordinates of a head (recorded, never guessed).
enum class rope_pairing : std::uint8_t {
    rotate_half = 0,  ///< pairs (i, i + d_rot/2): Llama / GPT-NeoX / HF `rotate_half`
    interleaved = 1,  ///< pairs (2i, 2i + 1): GPT-J / Meta's original Llama code
};

/// \brief Name of a pairing (`rotate_half`, `interleaved`).
/// \param[in] p the pairing.
/// \returns a static string; "rotate_half" for any value but `interleaved`.
constexpr const char* rope_pairing_name(rope_pairing p) noexcept {
    return p == rope_pairing::interleaved ? "interleaved" : "rotate_half";
}

/// \brief The rotary embedding a capture was taken under. Recorded so that
/// captures are only merged with captures taken the same way
/// (io::check_compatible), and carried in `capture_facts::rope` for the RoPE
/// band analysis (docs/beyond-rope.md), which undoes it.
struct rope_spec {
    rope_pairing pairing = rope_pairing::rotate_half;  ///< coordinate pairing
    std::int64_t rotary_dim = 0;                       ///< rotated coordinates; 0 = the whole head
    double theta = 10000.0;                            ///< base frequency
    std::string scaling = "none";                      ///< "none", "linear", "dynamic", "yarn", "llama3", ...
    double scaling_factor = 1.0;                       ///< the scaling's factor (1 when none)
    friend bool operator==(rope_spec const&, rope_spec const&) = default;
};

/// \brief What the capture knows about a head beyond its rows (method §0, §6).
struct capture_facts {
    /// The capture's bucket scheme and width. When set, every bucket is
    /// checked against its position (a mislabelled array fails with both
    /// named) and a sliding window is converted to buckets (method §6).
    std::optional<bucket_spec> buckets;
    std::int64_t sliding_window = 0;  ///< the layer's attention span in tokens; 0 = full attention
    std::int64_t context_length = 0;  ///< L; 0 = max position over queries and keys + 1 (method §9.12)
    /// The RoPE the rows were captured after (post-RoPE rows); none = not
    /// recorded, or the rows were captured before RoPE / the layer has none.
    std::optional<rope_spec> rope;
    friend bool operator==(capture_facts const&, capture_facts const&) = default;
};

namespace detail {
struct position_tag {
    static constexpr std::string_view name = "positions";
};
struct bucket_tag {
    static constexpr std::string_view name = "buckets";
};
struct example_tag {
    static constexpr std::string_view name = "example ids";
};
}  // namespace detail

/// \brief One integer per row, of one meaning (`Tag`): an owning array that
/// converts from any IndexVector only explicitly, and never from another
/// meaning. It is itself an IndexVector (a contiguous range of int64).
template <class Tag>
class token_indices {
public:
    using value_type = std::int64_t;
    static constexpr std::string_view name = Tag::name;

    /// \brief No values.
    token_indices() = default;
    /// \brief Takes the values (no copy).
    /// \param[in] v the values (moved from); not validated.
    explicit token_indices(std::vector<std::int64_t> v) noexcept : v_(std::move(v)) {}
    /// \brief From a list of values.
    /// \param[in] v the values; not validated.
    /// \throws std::bad_alloc if the values cannot be stored.
    token_indices(std::initializer_list<std::int64_t> v) : v_(v) {}
    /// \brief Copies any IndexVector (Eigen integer vectors, spans, ranges,
    /// LibTorch integer tensors ...), widened to int64.
    /// \tparam V any IndexVector other than std::vector<int64> (taken by the
    ///         moving constructor) and other than another token_indices.
    /// \param[in] v the values; not validated (the analyses check them).
    /// \throws whatever `as_indices(v)` throws for an unreadable input.
    /// \throws std::bad_alloc if the values cannot be stored.
    template <IndexVector V>
        requires(!std::same_as<std::remove_cvref_t<V>, std::vector<std::int64_t>> &&
                 !requires { std::remove_cvref_t<V>::name; })
    explicit token_indices(V const& v) {
        auto const r = as_indices(v);
        v_.resize(static_cast<std::size_t>(r.size()));
        for (index_t i = 0; i < r.size(); ++i) v_[static_cast<std::size_t>(i)] = r[i];
    }

    /// \brief Number of values.
    /// \returns the count n.
    [[nodiscard]] index_t size() const noexcept { return static_cast<index_t>(v_.size()); }
    /// \brief Whether there are no values.
    /// \returns size() == 0.
    [[nodiscard]] bool empty() const noexcept { return v_.empty(); }
    /// \brief The contiguous values.
    /// \returns a pointer to the first of size() values (may be null when empty).
    [[nodiscard]] std::int64_t const* data() const noexcept { return v_.data(); }
    /// \brief Start of the values.
    /// \returns a const iterator to the first value.
    [[nodiscard]] auto begin() const noexcept { return v_.begin(); }
    /// \brief End of the values.
    /// \returns a const iterator past the last value.
    [[nodiscard]] auto end() const noexcept { return v_.end(); }
    /// \brief Value i.
    /// \param[in] i the row.
    /// \pre 0 ≤ i < size() (not checked).
    /// \returns the value of row i.
    [[nodiscard]] std::int64_t operator[](index_t i) const noexcept { return v_[static_cast<std::size_t>(i)]; }
    /// \brief The values.
    /// \returns the underlying vector.
    [[nodiscard]] std::vector<std::int64_t> const& values() const noexcept { return v_; }
    /// \brief The values, for appending while capturing.
    /// \returns the underlying vector (modifiable).
    [[nodiscard]] std::vector<std::int64_t>& values() noexcept { return v_; }
    friend bool operator==(token_indices const&, token_indices const&) = default;

private:
    std::vector<std::int64_t> v_;
};

using token_positions = token_indices<detail::position_tag>;  ///< token index in its sequence (≥ 0)
using token_buckets = token_indices<detail::bucket_tag>;      ///< position bucket (≥ 0, method §0.1)
using example_ids = token_indices<detail::example_tag>;       ///< input sequence of the token

namespace detail {
/// Whether T is a token_indices array of another meaning than `Tag` (a
/// bucket or example-id array passed where positions belong, ...).
template <class T, class Tag>
inline constexpr bool other_meaning = false;
template <class Other, class Tag>
inline constexpr bool other_meaning<token_indices<Other>, Tag> = !std::is_same_v<Other, Tag>;
}  // namespace detail

/// \brief The rows of one kind (queries or keys) of a head: vectors and, per
/// row, position, bucket and example id. `Matrix` is any RowMatrix (Eigen,
/// xtensor, `matrix_view`, spans with extents, LibTorch tensors ...).
/// Query example ids may be left empty (no analysis needs them).
template <class Matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>
struct token_rows {
    Matrix vectors;              ///< n × d
    token_positions position;    ///< n positions
    token_buckets bucket;        ///< n buckets
    example_ids example_id;      ///< n example ids (keys), or empty (queries)
};

/// \brief The owning row type of the readers and the program: row-major
/// doubles (f16/bf16/f32 captures widen exactly).
using row_matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// \brief One head as one value (method §0): identity, capture facts, and the
/// query and key rows. The input of `analyze_head` and `attention_plasticity`.
template <class QMatrix = row_matrix, class KMatrix = QMatrix>
struct head_capture {
    head_id id;                   ///< which head pair
    capture_facts facts;          ///< bucket scheme, sliding window, context length
    token_rows<QMatrix> queries;  ///< the query rows of q_head
    token_rows<KMatrix> keys;     ///< the key rows of k_head
};

namespace detail {

/// Checks the annotations of `rows` (n vectors): lengths, non-negative
/// positions and buckets, example ids (when `need_examples` or present),
/// and, when the facts name the bucket scheme, bucket = bucket_of(position).
/// The message names the function, the kind and both arrays.
inline void check_annotations(std::string_view fn, std::string_view kind_name, index_t n,
                              token_positions const& pos, token_buckets const& bucket, example_ids const& example,
                              bool need_examples, capture_facts const& facts) {
    auto const where = std::string(kind_name) + ": ";
    auto length = [&](std::string_view field, index_t len) {
        if (len != n)
            fail_arg(fn, where + std::string(field) + ": length differs from the " + std::to_string(n) +
                             " rows; length",
                     len);
    };
    length(token_positions::name, pos.size());
    length(token_buckets::name, bucket.size());
    if (need_examples || !example.empty()) length(example_ids::name, example.size());
    for (index_t i = 0; i < n; ++i) {
        if (pos[i] < 0) fail_arg(fn, where + "positions: negative position at row " + std::to_string(i), pos[i]);
        if (bucket[i] < 0) fail_arg(fn, where + "buckets: negative bucket at row " + std::to_string(i), bucket[i]);
    }
    if (!facts.buckets) return;
    bucket_spec const& s = *facts.buckets;
    check_bucket_spec(fn, s);  // once; the positions are non-negative (above)
    for (index_t i = 0; i < n; ++i) {
        std::int64_t const expect = bucket_of_unchecked(s, pos[i]);
        if (bucket[i] != expect)
            fail_arg(fn, where + "bucket does not match position " + std::to_string(pos[i]) + " at row " +
                             std::to_string(i) + " (scheme " + std::string(bucket_scheme_name(s.scheme)) +
                             ", width " + std::to_string(s.width) + " gives " + std::to_string(expect) +
                             "): are the positions and buckets arrays swapped or mislabelled? bucket",
                     bucket[i]);
    }
}

/// Checks the capture facts (window ≥ 0, a window needs the bucket scheme,
/// a valid scheme, context length ≥ 0).
inline void check_facts(std::string_view fn, capture_facts const& f) {
    if (f.sliding_window < 0) fail_arg(fn, "facts.sliding_window must be >= 0 tokens", f.sliding_window);
    if (f.sliding_window > 0 && !f.buckets)
        fail_arg(fn, "a sliding window needs the bucket scheme (facts.buckets); sliding_window", f.sliding_window);
    if (f.context_length < 0) fail_arg(fn, "facts.context_length must be >= 0 (0 = from the rows)", f.context_length);
    if (f.buckets) check_bucket_spec(fn, *f.buckets);
}

}  // namespace detail

}  // namespace qkgeom
