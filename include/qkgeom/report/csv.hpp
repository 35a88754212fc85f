// qkgeom — the CSV outputs of method §7: head_metrics.csv,
// head_bucket_plasticity.csv, head_component_weights.csv, qk_pca.csv,
// model_report.csv (and layer_report.csv, head_profile.csv). Column names are part of the API
// and are documented in docs/outputs.md.
//
// Format: RFC 4180 style, comma separated, '\n' line ends, one header row then
// one row per record. Doubles are written in the shortest form that reads back
// to the same double (std::to_chars), NaN as `nan` (never `-nan`), infinities
// as `inf` / `-inf`; integers as integers. Only free text (the model name) is
// ever quoted: when it contains a comma, a double quote, CR or LF, or has
// leading/trailing blanks, it is enclosed in double quotes with each inner
// quote doubled.
#pragma once

#include <qkgeom/analysis/analyze.hpp>
#include <qkgeom/analysis/gqa.hpp>
#include <qkgeom/analysis/model.hpp>
#include <qkgeom/core/errors.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace qkgeom::report {

// ---------------------------------------------------------------------------
// File names (what write_reports writes)
// ---------------------------------------------------------------------------
inline constexpr std::string_view head_metrics_file = "head_metrics.csv";
inline constexpr std::string_view head_bucket_plasticity_file = "head_bucket_plasticity.csv";
inline constexpr std::string_view head_profile_file = "head_profile.csv";
inline constexpr std::string_view head_component_weights_file = "head_component_weights.csv";
inline constexpr std::string_view qk_pca_file = "qk_pca.csv";
inline constexpr std::string_view model_report_file = "model_report.csv";
inline constexpr std::string_view layer_report_file = "layer_report.csv";
inline constexpr std::string_view head_rope_bands_file = "head_rope_bands.csv";
inline constexpr std::string_view head_rope_bucket_bands_file = "head_rope_bucket_bands.csv";

/// \brief The six head classes in column order of the taxonomy counts.
inline constexpr std::array<head_class, 6> taxonomy_classes{head_class::position_dominated, head_class::q_positional,
                                                            head_class::k_positional,       head_class::content_focused,
                                                            head_class::mixed,              head_class::undefined};

// ---------------------------------------------------------------------------
// Field formatting
// ---------------------------------------------------------------------------

/// \brief A double as written in every numeric column: shortest round-trip
/// form (`std::to_chars`), `nan` for any NaN, `inf` / `-inf` for infinities.
/// \param[in] x the value.
/// \returns its text (locale-independent).
inline std::string format_double(double x) {
    if (std::isnan(x)) return "nan";
    if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
    std::array<char, 64> buf{};
    auto const r = std::to_chars(buf.data(), buf.data() + buf.size(), x);
    return std::string(buf.data(), r.ptr);
}

/// \brief An integer as written in integer columns.
/// \param[in] x the value.
/// \returns its decimal text.
inline std::string format_int(std::int64_t x) {
    std::array<char, 32> buf{};
    auto const r = std::to_chars(buf.data(), buf.data() + buf.size(), x);
    return std::string(buf.data(), r.ptr);
}

/// \brief A free-text field, quoted when needed (comma, double quote, CR, LF,
/// leading or trailing space/tab): `a,"b` becomes `"a,""b"`.
/// \param[in] s the text.
/// \returns `s` unchanged, or quoted with inner quotes doubled.
inline std::string csv_quote(std::string_view s) {
    bool need = s.find_first_of(",\"\r\n") != std::string_view::npos;
    if (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.back() == ' ' || s.back() == '\t')) need = true;
    if (!need) return std::string(s);
    std::string out;
    out.reserve(s.size() + 2);
    out += '"';
    for (char c : s) {
        if (c == '"') out += '"';
        out += c;
    }
    out += '"';
    return out;
}

// ---------------------------------------------------------------------------
// Column names
// ---------------------------------------------------------------------------

/// \brief Columns of head_metrics.csv: layer, q_head, k_head, every
/// `head_metrics` (registry) name in order, taxonomy, flags, rope_status.
/// \returns the column names, in file order (docs/outputs.md).
inline std::vector<std::string> head_metrics_columns() {
    std::vector<std::string> c{"layer", "q_head", "k_head"};
    for (auto n : head_metric_names) c.emplace_back(n);
    c.emplace_back("taxonomy");
    c.emplace_back("flags");
    c.emplace_back("rope_status");
    return c;
}

/// \brief Columns of head_bucket_plasticity.csv.
/// \returns the column names, in file order (docs/outputs.md).
inline std::vector<std::string> head_bucket_plasticity_columns() {
    return {"layer", "q_head", "k_head", "q_bucket", "k_bucket", "plasticity", "n_pairs", "std_error", "empirical"};
}

/// \brief Columns of head_profile.csv (one row per query bucket of a head's
/// plasticity profile, `plasticity_bucket`).
/// \returns the column names, in file order (docs/outputs.md).
inline std::vector<std::string> head_profile_columns() {
    std::vector<std::string> c{"layer",      "q_head",    "k_head",    "q_bucket", "tau",   "n_queries",
                               "plasticity", "std_error", "empirical", "quintile", "decile"};
    for (auto n : profile_beyond_names) c.emplace_back(n);
    return c;
}

/// \brief Columns of head_rope_bands.csv (one row per frequency band of every
/// head the RoPE analysis ran on, docs/beyond-rope.md).
/// \returns the column names, in file order.
inline std::vector<std::string> head_rope_bands_columns() {
    return {"layer",         "q_head",        "k_head",            "rope_status",          "band",
            "rotary",        "first_pair",    "n_pairs",           "n_coords",             "freq_lo",
            "freq_hi",       "wavelength_lo", "wavelength_hi",     "content_var_share",    "content_var_share_se",
            "v_share_first_20pct", "v_share_last_20pct"};
}

/// \brief Columns of head_rope_bucket_bands.csv (one row per query bucket and
/// band: the band's share of the score-difference variance v).
/// \returns the column names, in file order.
inline std::vector<std::string> head_rope_bucket_bands_columns() {
    return {"layer", "q_head", "k_head", "q_bucket", "tau", "quintile", "n_queries", "n_pairs", "band", "v_share"};
}

/// \brief Columns of head_component_weights.csv.
/// \returns the column names, in file order (docs/outputs.md).
inline std::vector<std::string> head_component_weights_columns() {
    return {"layer", "q_head", "k_head", "component", "component_r2", "component_weight"};
}

/// \brief Columns of qk_pca.csv.
/// \returns the column names, in file order (docs/outputs.md).
inline std::vector<std::string> qk_pca_columns() {
    return {"layer", "q_head", "k_head", "component", "explained_variance_ratio", "r_q", "r_k"};
}

namespace detail {

inline std::vector<std::string> summary_columns(std::string_view key) {
    std::vector<std::string> c{std::string(key), "n_heads"};
    for (auto n : head_metric_names) c.push_back("mean_" + std::string(n));
    for (int i = 0; i < 5; ++i) c.push_back("ap_quintile_" + std::to_string(i));
    for (int i = 0; i < 10; ++i) c.push_back("ap_decile_" + std::to_string(i));
    for (auto k : taxonomy_classes) c.push_back("n_" + std::string(to_string(k)));
    return c;
}

}  // namespace detail

/// \brief Columns of model_report.csv: model, n_heads, mean_<metric>…,
/// ap_quintile_0..4, ap_decile_0..9, n_<class> for the six classes.
/// \returns the column names, in file order (docs/outputs.md).
inline std::vector<std::string> model_report_columns() { return detail::summary_columns("model"); }

/// \brief Columns of layer_report.csv: as model_report.csv with `layer` first.
/// \returns the column names, in file order (docs/outputs.md).
inline std::vector<std::string> layer_report_columns() { return detail::summary_columns("layer"); }

// ---------------------------------------------------------------------------
// Writers
// ---------------------------------------------------------------------------

/// \brief One row of model_report.csv.
struct model_entry {
    std::string model;         ///< the model's name (quoted on output when needed)
    head_set_summary summary;  ///< e.g. `summarise_model(heads).all`
};

namespace detail {

class row_writer {
public:
    explicit row_writer(std::ostream& os) : os_(os) {}
    row_writer& raw(std::string_view s) {
        if (!first_) line_ += ',';
        first_ = false;
        line_ += s;
        return *this;
    }
    row_writer& num(double x) { return raw(format_double(x)); }
    row_writer& integer(std::int64_t x) { return raw(format_int(x)); }
    row_writer& id(head_id const& h) { return integer(h.layer).integer(h.q_head).integer(h.k_head); }
    void end() {
        line_ += '\n';
        os_.write(line_.data(), static_cast<std::streamsize>(line_.size()));
        line_.clear();
        first_ = true;
    }

private:
    std::ostream& os_;
    std::string line_;
    bool first_ = true;
};

inline void header(std::ostream& os, std::vector<std::string> const& cols) {
    row_writer w(os);
    for (auto const& c : cols) w.raw(c);
    w.end();
}

inline void check_stream(std::ostream& os, std::string_view fn) {
    if (!os) throw std::runtime_error(std::string(fn) + ": writing to the output stream failed");
}

inline void summary_row(row_writer& w, head_set_summary const& s) {
    w.integer(s.n_heads);
    for (double m : s.mean) w.num(m);
    for (double q : s.ap_quintile) w.num(q);
    for (double q : s.ap_decile) w.num(q);
    for (auto k : taxonomy_classes) {
        auto const it = s.taxonomy_counts.find(k);
        w.integer(it == s.taxonomy_counts.end() ? 0 : it->second);
    }
}

/// The OS's reason for the last failed call ("No space left on device"),
/// or a plain phrase when errno says nothing.
inline std::string os_reason(int err) {
    return err != 0 ? std::string(std::strerror(err)) : std::string("the stream failed");
}

/// Open `path` for writing, call `body(stream)`, and throw qkgeom::io_error
/// naming the path and the OS's reason (ENOSPC: "No space left on device")
/// when it cannot be opened or written.
template <class F>
void to_file(std::filesystem::path const& path, std::string_view fn, F&& body) {
    errno = 0;
    std::ofstream f(path, std::ios::out | std::ios::trunc | std::ios::binary);
    if (!f)
        throw io_error(path.string(), std::string(fn) + ": cannot open '" + path.string() + "' for writing: " +
                                          os_reason(errno));
    errno = 0;
    auto const failed = [&] {
        int const err = errno;
        return io_error(path.string(), std::string(fn) + ": writing '" + path.string() + "' failed: " + os_reason(err));
    };
    try {
        body(f);
        f.flush();
    } catch (std::exception const&) {
        if (!f) throw failed();  // a failed write: name the file, not only the stream
        throw;
    }
    if (!f) throw failed();
}

}  // namespace detail

/// \brief head_metrics.csv: one row per head.
/// \param[out] os the stream; a header row, then the rows, are appended.
/// \param[in] heads the analysed heads, written in the given order.
/// \throws std::runtime_error when the stream is in a failed state afterwards.
inline void write_head_metrics(std::ostream& os, std::span<head_analysis const> heads) {
    detail::header(os, head_metrics_columns());
    detail::row_writer w(os);
    for (auto const& h : heads) {
        w.id(h.id);
        auto const v = head_metric_values(h);
        // Counts are integers: write them as such (exact below 2^53, the
        // double holds the integer field unchanged).
        for (std::size_t i = 0; i < v.size(); ++i) {
            if (head_metrics[i].kind == metric_kind::count) w.integer(static_cast<std::int64_t>(v[i]));
            else w.num(v[i]);
        }
        w.raw(to_string(h.pca.taxonomy));
        w.raw(head_flags_text(h));  // names of [a-z0-9_] joined by ';': never needs quoting
        w.raw(rope_status_name(h.rope.status));
        w.end();
    }
    detail::check_stream(os, "qkgeom::report::write_head_metrics");
}

/// \brief head_bucket_plasticity.csv: one row per plasticity cell of every head
/// (empty cells included, with plasticity `nan` and n_pairs 0).
/// \param[out] os the stream; a header row, then the rows, are appended.
/// \param[in] heads the analysed heads, written in the given order.
/// \throws std::runtime_error when the stream is in a failed state afterwards.
inline void write_head_bucket_plasticity(std::ostream& os, std::span<head_analysis const> heads) {
    detail::header(os, head_bucket_plasticity_columns());
    detail::row_writer w(os);
    for (auto const& h : heads)
        for (auto const& c : h.plasticity.cells) {
            w.id(h.id).integer(c.q_bucket).integer(c.k_bucket).num(c.plasticity).integer(c.n_pairs);
            w.num(c.std_error).num(c.empirical).end();
        }
    detail::check_stream(os, "qkgeom::report::write_head_bucket_plasticity");
}

/// \brief head_profile.csv: one row per query bucket of every head's
/// plasticity profile (`h.plasticity.profile`, ascending q_bucket; skipped
/// buckets included, with plasticity `nan`).
/// \param[out] os the stream; a header row, then the rows, are appended.
/// \param[in] heads the analysed heads, written in the given order.
/// \throws std::runtime_error when the stream is in a failed state afterwards.
inline void write_head_profile(std::ostream& os, std::span<head_analysis const> heads) {
    detail::header(os, head_profile_columns());
    detail::row_writer w(os);
    for (auto const& h : heads)
        for (auto const& b : h.plasticity.profile) {
            w.id(h.id).integer(b.q_bucket).num(b.tau).integer(b.n_queries).num(b.ap).num(b.std_error);
            w.num(b.ap_empirical).integer(b.quintile).integer(b.decile);
            for (double x : profile_beyond_values(h, std::size_t(&b - h.plasticity.profile.data()))) w.num(x);
            w.end();
        }
    detail::check_stream(os, "qkgeom::report::write_head_profile");
}

/// \brief head_rope_bands.csv: one row per band of `h.rope.bands` of every
/// head (heads whose RoPE analysis did not run have no bands: no rows).
/// \param[out] os the stream; a header row, then the rows, are appended.
/// \param[in] heads the analysed heads, written in the given order.
/// \throws std::runtime_error when the stream is in a failed state afterwards.
inline void write_head_rope_bands(std::ostream& os, std::span<head_analysis const> heads) {
    detail::header(os, head_rope_bands_columns());
    detail::row_writer w(os);
    for (auto const& h : heads)
        for (std::size_t k = 0; k < h.rope.bands.size(); ++k) {
            auto const& b = h.rope.bands[k];
            w.id(h.id).raw(rope_status_name(h.rope.status)).integer(std::int64_t(k)).integer(b.rotary ? 1 : 0);
            w.integer(b.first_pair).integer(b.n_pairs).integer(b.n_coords).num(b.freq_lo).num(b.freq_hi);
            w.num(b.wavelength_lo).num(b.wavelength_hi).num(b.content_var_share).num(b.content_var_share_se);
            w.num(b.v_share_first_20pct).num(b.v_share_last_20pct).end();
        }
    detail::check_stream(os, "qkgeom::report::write_head_rope_bands");
}

/// \brief head_rope_bucket_bands.csv: per head, query bucket and band the
/// band's share of v (`h.rope.buckets[i].v_share[band]`).
/// \param[out] os the stream; a header row, then the rows, are appended.
/// \param[in] heads the analysed heads, written in the given order.
/// \throws std::runtime_error when the stream is in a failed state afterwards.
inline void write_head_rope_bucket_bands(std::ostream& os, std::span<head_analysis const> heads) {
    detail::header(os, head_rope_bucket_bands_columns());
    detail::row_writer w(os);
    for (auto const& h : heads)
        for (auto const& b : h.rope.buckets)
            for (std::size_t k = 0; k < b.v_share.size(); ++k) {
                w.id(h.id).integer(b.bucket).num(b.tau).integer(b.quintile).integer(b.n_queries).integer(b.n_pairs);
                w.integer(std::int64_t(k)).num(b.v_share[k]).end();
            }
    detail::check_stream(os, "qkgeom::report::write_head_rope_bucket_bands");
}

/// \brief head_component_weights.csv: one row per query coordinate of every head
/// (max of the two vectors' lengths; a missing entry is written `nan`).
/// \param[out] os the stream; a header row, then the rows, are appended.
/// \param[in] heads the analysed heads, written in the given order.
/// \throws std::runtime_error when the stream is in a failed state afterwards.
inline void write_head_component_weights(std::ostream& os, std::span<head_analysis const> heads) {
    detail::header(os, head_component_weights_columns());
    detail::row_writer w(os);
    for (auto const& h : heads) {
        auto const& r2 = h.householder.component_r2;
        auto const& wt = h.householder.component_weight;
        index_t const n = std::max(r2.size(), wt.size());
        for (index_t j = 0; j < n; ++j) {
            w.id(h.id).integer(static_cast<std::int64_t>(j));
            w.num(j < r2.size() ? r2(j) : qkgeom::detail::nan).num(j < wt.size() ? wt(j) : qkgeom::detail::nan);
            w.end();
        }
    }
    detail::check_stream(os, "qkgeom::report::write_head_component_weights");
}

/// \brief qk_pca.csv: one row per reported PCA component of every head.
/// \param[out] os the stream; a header row, then the rows, are appended.
/// \param[in] heads the analysed heads, written in the given order.
/// \throws std::runtime_error when the stream is in a failed state afterwards.
inline void write_qk_pca(std::ostream& os, std::span<head_analysis const> heads) {
    detail::header(os, qk_pca_columns());
    detail::row_writer w(os);
    for (auto const& h : heads)
        for (auto const& c : h.pca.components) {
            w.id(h.id).integer(static_cast<std::int64_t>(c.component));
            w.num(c.explained_variance_ratio).num(c.r_q).num(c.r_k).end();
        }
    detail::check_stream(os, "qkgeom::report::write_qk_pca");
}

/// \brief model_report.csv: one row per model.
/// \param[out] os the stream; a header row, then the rows, are appended.
/// \param[in] models the rows, in order.
/// \throws std::runtime_error when the stream is in a failed state afterwards.
inline void write_model_report(std::ostream& os, std::span<model_entry const> models) {
    detail::header(os, model_report_columns());
    detail::row_writer w(os);
    for (auto const& m : models) {
        w.raw(csv_quote(m.model));
        detail::summary_row(w, m.summary);
        w.end();
    }
    detail::check_stream(os, "qkgeom::report::write_model_report");
}

/// \brief model_report.csv with the one row of `summary`.
/// \param[out] os the stream.
/// \param[in] model_name the `model` column (quoted when needed).
/// \param[in] summary the row's values.
/// \throws std::runtime_error when the stream is in a failed state afterwards.
inline void write_model_report(std::ostream& os, std::string_view model_name, head_set_summary const& summary) {
    model_entry const e{std::string(model_name), summary};
    write_model_report(os, std::span<model_entry const>(&e, 1));
}

/// \brief model_report.csv with one row: `summarise_model(heads).all`.
/// \param[out] os the stream.
/// \param[in] model_name the `model` column (quoted when needed).
/// \param[in] heads the analysed heads of the model.
/// \throws std::runtime_error when the stream is in a failed state afterwards.
inline void write_model_report(std::ostream& os, std::string_view model_name, std::span<head_analysis const> heads) {
    write_model_report(os, model_name, summarise_model(heads).all);
}

/// \brief layer_report.csv: one row per layer of `m.per_layer`, ascending.
/// \param[out] os the stream.
/// \param[in] m the model summary.
/// \throws std::runtime_error when the stream is in a failed state afterwards.
inline void write_layer_report(std::ostream& os, model_summary const& m) {
    detail::header(os, layer_report_columns());
    detail::row_writer w(os);
    for (auto const& [layer, s] : m.per_layer) {
        w.integer(layer);
        detail::summary_row(w, s);
        w.end();
    }
    detail::check_stream(os, "qkgeom::report::write_layer_report");
}

/// \brief layer_report.csv of `summarise_model(heads)`.
/// \param[out] os the stream.
/// \param[in] heads the analysed heads of the model.
/// \throws std::runtime_error when the stream is in a failed state afterwards.
inline void write_layer_report(std::ostream& os, std::span<head_analysis const> heads) {
    write_layer_report(os, summarise_model(heads));
}

// --- path overloads: create/truncate the file; std::runtime_error naming the
// --- path when it cannot be opened or written.

/// \brief head_metrics.csv, written to a file.
/// \param[in] path the file, created or truncated.
/// \param[in] heads the analysed heads.
/// \throws std::runtime_error naming the path when it cannot be opened or written.
inline void write_head_metrics(std::filesystem::path const& path, std::span<head_analysis const> heads) {
    detail::to_file(path, "qkgeom::report::write_head_metrics", [&](std::ostream& os) { write_head_metrics(os, heads); });
}
/// \brief head_bucket_plasticity.csv, written to a file.
/// \param[in] path the file, created or truncated.
/// \param[in] heads the analysed heads.
/// \throws std::runtime_error naming the path when it cannot be opened or written.
inline void write_head_bucket_plasticity(std::filesystem::path const& path, std::span<head_analysis const> heads) {
    detail::to_file(path, "qkgeom::report::write_head_bucket_plasticity",
                    [&](std::ostream& os) { write_head_bucket_plasticity(os, heads); });
}
/// \brief head_profile.csv, written to a file.
/// \param[in] path the file, created or truncated.
/// \param[in] heads the analysed heads.
/// \throws std::runtime_error naming the path when it cannot be opened or written.
inline void write_head_profile(std::filesystem::path const& path, std::span<head_analysis const> heads) {
    detail::to_file(path, "qkgeom::report::write_head_profile",
                    [&](std::ostream& os) { write_head_profile(os, heads); });
}
/// \brief head_rope_bands.csv, written to a file.
/// \param[in] path the file, created or truncated.
/// \param[in] heads the analysed heads.
/// \throws std::runtime_error naming the path when it cannot be opened or written.
inline void write_head_rope_bands(std::filesystem::path const& path, std::span<head_analysis const> heads) {
    detail::to_file(path, "qkgeom::report::write_head_rope_bands",
                    [&](std::ostream& os) { write_head_rope_bands(os, heads); });
}
/// \brief head_rope_bucket_bands.csv, written to a file.
/// \param[in] path the file, created or truncated.
/// \param[in] heads the analysed heads.
/// \throws std::runtime_error naming the path when it cannot be opened or written.
inline void write_head_rope_bucket_bands(std::filesystem::path const& path, std::span<head_analysis const> heads) {
    detail::to_file(path, "qkgeom::report::write_head_rope_bucket_bands",
                    [&](std::ostream& os) { write_head_rope_bucket_bands(os, heads); });
}
/// \brief head_component_weights.csv, written to a file.
/// \param[in] path the file, created or truncated.
/// \param[in] heads the analysed heads.
/// \throws std::runtime_error naming the path when it cannot be opened or written.
inline void write_head_component_weights(std::filesystem::path const& path, std::span<head_analysis const> heads) {
    detail::to_file(path, "qkgeom::report::write_head_component_weights",
                    [&](std::ostream& os) { write_head_component_weights(os, heads); });
}
/// \brief qk_pca.csv, written to a file.
/// \param[in] path the file, created or truncated.
/// \param[in] heads the analysed heads.
/// \throws std::runtime_error naming the path when it cannot be opened or written.
inline void write_qk_pca(std::filesystem::path const& path, std::span<head_analysis const> heads) {
    detail::to_file(path, "qkgeom::report::write_qk_pca", [&](std::ostream& os) { write_qk_pca(os, heads); });
}
/// \brief model_report.csv, one row per model, written to a file.
/// \param[in] path the file, created or truncated.
/// \param[in] models the rows, in order.
/// \throws std::runtime_error naming the path when it cannot be opened or written.
inline void write_model_report(std::filesystem::path const& path, std::span<model_entry const> models) {
    detail::to_file(path, "qkgeom::report::write_model_report",
                    [&](std::ostream& os) { write_model_report(os, models); });
}
/// \brief model_report.csv with the one row of `summary`, written to a file.
/// \param[in] path the file, created or truncated.
/// \param[in] model_name the `model` column.
/// \param[in] summary the row's values.
/// \throws std::runtime_error naming the path when it cannot be opened or written.
inline void write_model_report(std::filesystem::path const& path, std::string_view model_name,
                               head_set_summary const& summary) {
    detail::to_file(path, "qkgeom::report::write_model_report",
                    [&](std::ostream& os) { write_model_report(os, model_name, summary); });
}
/// \brief model_report.csv with one row: `summarise_model(heads).all`, written to a file.
/// \param[in] path the file, created or truncated.
/// \param[in] model_name the `model` column.
/// \param[in] heads the analysed heads.
/// \throws std::runtime_error naming the path when it cannot be opened or written.
inline void write_model_report(std::filesystem::path const& path, std::string_view model_name,
                               std::span<head_analysis const> heads) {
    detail::to_file(path, "qkgeom::report::write_model_report",
                    [&](std::ostream& os) { write_model_report(os, model_name, heads); });
}
/// \brief layer_report.csv of `m`, written to a file.
/// \param[in] path the file, created or truncated.
/// \param[in] m the model summary.
/// \throws std::runtime_error naming the path when it cannot be opened or written.
inline void write_layer_report(std::filesystem::path const& path, model_summary const& m) {
    detail::to_file(path, "qkgeom::report::write_layer_report", [&](std::ostream& os) { write_layer_report(os, m); });
}
/// \brief layer_report.csv of `summarise_model(heads)`, written to a file.
/// \param[in] path the file, created or truncated.
/// \param[in] heads the analysed heads.
/// \throws std::runtime_error naming the path when it cannot be opened or written.
inline void write_layer_report(std::filesystem::path const& path, std::span<head_analysis const> heads) {
    detail::to_file(path, "qkgeom::report::write_layer_report",
                    [&](std::ostream& os) { write_layer_report(os, heads); });
}

// --- GQA groups (docs/beyond-gqa.md) -------------------------------------
/// \brief The file name of the GQA group table.
inline constexpr std::string_view gqa_groups_file = "gqa_groups.csv";

/// \brief Columns of gqa_groups.csv (the fields of `gqa_metric_row`, in order).
/// \returns the column names, in file order (docs/beyond-gqa.md).
inline std::vector<std::string> gqa_groups_columns() {
    return {"layer",     "metric",     "n_groups",   "n_shared_groups", "n_heads", "n_excluded", "df_within",
            "df_between", "within_var", "between_var", "ratio",          "p_value", "status"};
}

/// \brief gqa_groups.csv: one row per `gqa_metric_row` (layer −1 = model),
/// numbers formatted as every qkgeom CSV (`format_double`: shortest
/// round-trip, `nan`, `inf`).
/// \param[out] os the stream; a header row, then the rows, are appended.
/// \param[in] rows e.g. `gqa_groups(heads)`, written in the given order.
/// \throws std::runtime_error when the stream is in a failed state afterwards.
inline void write_gqa_groups(std::ostream& os, std::span<gqa_metric_row const> rows) {
    detail::header(os, gqa_groups_columns());
    detail::row_writer w(os);
    for (auto const& r : rows) {
        w.integer(r.layer).raw(csv_quote(r.metric)).integer(r.n_groups).integer(r.n_shared_groups);
        w.integer(r.n_heads).integer(r.n_excluded).integer(r.df_within).integer(r.df_between);
        w.num(r.within_var).num(r.between_var).num(r.ratio).num(r.p_value).raw(csv_quote(r.status)).end();
    }
    detail::check_stream(os, "qkgeom::report::write_gqa_groups");
}

/// \brief gqa_groups.csv, written to a file.
/// \param[in] path the file, created or truncated.
/// \param[in] rows the rows.
/// \throws std::runtime_error naming the path when it cannot be opened or written.
inline void write_gqa_groups(std::filesystem::path const& path, std::span<gqa_metric_row const> rows) {
    detail::to_file(path, "qkgeom::report::write_gqa_groups", [&](std::ostream& os) { write_gqa_groups(os, rows); });
}

/// \brief Create `out_dir` (and its parents) and write every file into it:
/// head_metrics.csv, head_bucket_plasticity.csv, head_profile.csv,
/// head_component_weights.csv, qk_pca.csv, model_report.csv (one row named
/// `model_name`), layer_report.csv, head_rope_bands.csv,
/// head_rope_bucket_bands.csv and, when every head has a recorded
/// identity (layer, q_head, k_head ≥ 0, as every capture records),
/// gqa_groups.csv (`gqa_groups`). Existing files of those names are
/// overwritten.
/// \param[in] out_dir the output directory.
/// \param[in] model_name the `model` column of model_report.csv.
/// \param[in] heads the analysed heads of the model.
/// \returns the paths written, in that order.
/// \throws std::runtime_error naming the directory or file that could not be
/// created or written (files written before the failure are left in place).
inline std::vector<std::filesystem::path> write_reports(std::filesystem::path const& out_dir,
                                                        std::string const& model_name,
                                                        std::span<head_analysis const> heads) {
    std::error_code ec;
    std::filesystem::create_directories(out_dir, ec);
    if (ec || !std::filesystem::is_directory(out_dir))
        throw std::runtime_error("qkgeom::report::write_reports: cannot create directory '" + out_dir.string() +
                                 "'" + (ec ? ": " + ec.message() : std::string()));
    model_summary const m = summarise_model(heads);
    std::vector<std::filesystem::path> out;
    auto const p = [&](std::string_view name) { return out.emplace_back(out_dir / std::string(name)); };
    write_head_metrics(p(head_metrics_file), heads);
    write_head_bucket_plasticity(p(head_bucket_plasticity_file), heads);
    write_head_profile(p(head_profile_file), heads);
    write_head_component_weights(p(head_component_weights_file), heads);
    write_qk_pca(p(qk_pca_file), heads);
    write_model_report(p(model_report_file), model_name, m.all);
    write_layer_report(p(layer_report_file), m);
    write_head_rope_bands(p(head_rope_bands_file), heads);
    write_head_rope_bucket_bands(p(head_rope_bucket_bands_file), heads);
    if (gqa_ids_recorded(heads)) write_gqa_groups(p(gqa_groups_file), gqa_groups(heads));
    return out;
}

}  // namespace qkgeom::report
