// qkgeom — studies: reading an analysis folder back (docs/study.md, the CSV
// files of docs/outputs.md). read_csv is a strict RFC 4180 reader that keeps
// every field as text with its line; read_analysis turns head_metrics.csv,
// head_profile.csv (or model_report.csv's quantile means) into a run_heads.
// Columns are found by name, never by position. Every problem is an
// input_error naming the file, the field (column or line) and the value.
#pragma once

#include <qkgeom/core/errors.hpp>
#include <qkgeom/report/csv.hpp>
#include <qkgeom/study/metrics.hpp>  // IWYU pragma: export (head_quintiles, head_deciles, token_range_profile)
#include <qkgeom/study/types.hpp>

#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace qkgeom {
namespace study {

/// \brief A CSV file held as text: its header and rows, each field as written
/// (quotes removed, doubled quotes undone), with the line each row starts on.
struct csv_table {
    std::filesystem::path file;                  ///< where it was read (messages)
    std::vector<std::string> columns;            ///< the header row
    std::vector<std::vector<std::string>> rows;  ///< every row has columns.size() fields
    std::vector<std::int64_t> lines;             ///< 1-based line on which each row starts

    /// \brief The index of a column.
    /// \param[in] name the column name.
    /// \returns its 0-based index.
    /// \throws input_error naming the file and the column when there is no such column.
    [[nodiscard]] std::size_t column(std::string_view name) const {
        if (auto const c = find(name)) return *c;
        qkgeom::detail::fail_input(file.string(), name, std::string(name), "no such column");
    }

    /// \brief The index of a column, if present.
    /// \param[in] name the column name.
    /// \returns its 0-based index, or nullopt.
    [[nodiscard]] std::optional<std::size_t> find(std::string_view name) const {
        for (std::size_t i = 0; i < columns.size(); ++i)
            if (columns[i] == name) return i;
        return std::nullopt;
    }

    /// \brief A field read as a double: the shortest round-trip text that
    /// report::format_double writes, or exactly `nan`, `inf`, `-inf`.
    /// \param[in] row the row index (< rows.size()).
    /// \param[in] col the column index (< columns.size()).
    /// \returns the value.
    /// \throws input_error naming the file, the column, the line and the text
    /// when the field is empty, not a number, has trailing characters or overflows.
    [[nodiscard]] double number(std::size_t row, std::size_t col) const {
        std::string const& s = rows.at(row).at(col);
        if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
        if (s == "inf") return std::numeric_limits<double>::infinity();
        if (s == "-inf") return -std::numeric_limits<double>::infinity();
        // from_chars also takes "NaN", "infinity", "-nan": only digits may start a number here.
        std::size_t const lead = !s.empty() && s[0] == '-' ? 1 : 0;
        bool const starts = s.size() > lead && ((s[lead] >= '0' && s[lead] <= '9') || s[lead] == '.');
        double x = 0;
        auto const r = std::from_chars(s.data(), s.data() + s.size(), x);
        if (!starts || r.ec != std::errc{} || r.ptr != s.data() + s.size())
            bad_field(row, col, r.ec == std::errc::result_out_of_range ? "number out of range" : "not a number");
        return x;
    }

    /// \brief A field read as a 64-bit integer (decimal, optional '-').
    /// \param[in] row the row index (< rows.size()).
    /// \param[in] col the column index (< columns.size()).
    /// \returns the value.
    /// \throws input_error naming the file, the column, the line and the text
    /// when the field is empty, not an integer, has trailing characters or overflows.
    [[nodiscard]] std::int64_t integer(std::size_t row, std::size_t col) const {
        std::string const& s = rows.at(row).at(col);
        std::int64_t x = 0;
        auto const r = std::from_chars(s.data(), s.data() + s.size(), x);
        if (s.empty() || r.ec != std::errc{} || r.ptr != s.data() + s.size())
            bad_field(row, col, r.ec == std::errc::result_out_of_range ? "integer out of range" : "not an integer");
        return x;
    }

    /// \brief Throws the input_error of a bad field: source the file, field the
    /// column name, value the field's text; the message names the line.
    /// \param[in] row the row index.
    /// \param[in] col the column index.
    /// \param[in] problem what is wrong.
    /// \throws input_error always.
    [[noreturn]] void bad_field(std::size_t row, std::size_t col, std::string_view problem) const {
        qkgeom::detail::fail_input(file.string(), columns.at(col), rows.at(row).at(col),
                                   "line " + std::to_string(lines.at(row)) + ": " + std::string(problem));
    }
};

namespace detail {

[[noreturn]] inline void fail_line(std::filesystem::path const& file, std::int64_t line, std::string const& value,
                                   std::string_view problem) {
    qkgeom::detail::fail_input(file.string(), "line " + std::to_string(line), value, problem);
}

/// At most the first 64 bytes of a field, for messages.
inline std::string excerpt(std::string const& s) { return s.size() <= 64 ? s : s.substr(0, 64) + "..."; }

/// A quoted field from its opening quote at `i`: appends its text (doubled
/// quotes undone) to `field`, counts its line ends, returns the closing quote's index.
inline std::size_t quoted_field(std::string_view text, std::size_t i, std::filesystem::path const& file,
                                std::int64_t& line, std::string& field) {
    std::int64_t const opened = line;
    for (std::size_t j = i + 1;; ++j) {
        if (j >= text.size()) fail_line(file, opened, excerpt(field), "quoted field never closed");
        if (text[j] == '"') {
            if (j + 1 >= text.size() || text[j + 1] != '"') return j;
            ++j;  // a doubled quote stands for one
        }
        line += text[j] == '\n';
        field += text[j];
    }
}

/// The RFC 4180 state machine: the records of `text`, each handed to
/// `end_record(fields, first_line)`; the last line end is optional. A record
/// with more than `max_fields` fields (0: no limit) fails as soon as it has
/// one too many, so that a ragged file never holds more than one such row.
template <class F>
void split_csv(std::string_view text, std::filesystem::path const& file, std::size_t const& max_fields,
               F&& end_record) {
    std::vector<std::string> fields;
    std::string field;
    std::int64_t line = 1, start = 1;
    bool at_start = true, pending = false;  // at a field's first character; a record is open
    auto const end_field = [&] {
        if (max_fields != 0 && fields.size() == max_fields)
            fail_line(file, start, "more than " + std::to_string(max_fields),
                      "field count differs from the header's " + std::to_string(max_fields));
        fields.push_back(std::move(field));
        field.clear();
    };
    for (std::size_t i = 0; i < text.size(); ++i) {
        char const c = text[i];
        pending = true;
        if (c == '"' && at_start) {
            i = quoted_field(text, i, file, line, field);
            at_start = false;
            if (i + 1 < text.size() && text[i + 1] != ',' && text[i + 1] != '\n' && text[i + 1] != '\r')
                fail_line(file, line, std::string(1, text[i + 1]), "text after a closing quote");
            continue;
        }
        at_start = c == ',';
        if (c == ',') {
            end_field();
        } else if (c == '\n' || c == '\r') {
            if (c == '\r' && (i + 1 >= text.size() || text[i + 1] != '\n'))
                fail_line(file, line, "\r", "CR not followed by LF");
            i += c == '\r';
            end_field();
            end_record(fields, start);
            fields.clear();
            start = ++line;
            at_start = true;
            pending = false;
        } else if (c == '"') {
            fail_line(file, line, excerpt(field + '"'), "double quote inside an unquoted field");
        } else {
            field += c;
        }
    }
    if (pending) {
        end_field();
        end_record(fields, start);
    }
}

/// The whole file as bytes: input_error naming it and the OS reason when it
/// cannot be read, or its size when over `max_bytes` (checked before reading).
inline std::string slurp(std::filesystem::path const& file, std::uintmax_t max_bytes) {
    std::error_code ec;
    std::uintmax_t const size = std::filesystem::file_size(file, ec);
    if (ec) qkgeom::detail::fail_input(file.string(), "file", file.string(), "cannot read: " + ec.message());
    auto const too_big = [&](std::uintmax_t n) {
        qkgeom::detail::fail_input(file.string(), "file size", n,
                                   "larger than the limit of " + std::to_string(max_bytes) + " bytes");
    };
    if (size > max_bytes) too_big(size);
    errno = 0;
    std::ifstream f(file, std::ios::in | std::ios::binary);
    if (!f) {
        int const err = errno;
        qkgeom::detail::fail_input(file.string(), "file", file.string(),
                                   "cannot open" + (err ? ": " + std::generic_category().message(err) : std::string()));
    }
    std::string out(static_cast<std::size_t>(size), '\0');
    f.read(out.data(), static_cast<std::streamsize>(out.size()));
    auto const n = static_cast<std::size_t>(f.gcount());
    if (n != out.size() || f.bad())
        qkgeom::detail::fail_input(file.string(), "file", file.string(),
                                   "read " + std::to_string(n) + " of " + std::to_string(size) + " bytes");
    if (f.peek() != std::char_traits<char>::eof()) too_big(size + 1);  // grew since file_size
    return out;
}

}  // namespace detail

/// \brief Parse CSV text (RFC 4180: comma separated, fields optionally in
/// double quotes with inner quotes doubled, quoted fields may hold commas and
/// line ends, CRLF or LF line ends, the last line end optional).
/// \param[in] text the bytes.
/// \param[in] file the name used in messages (csv_table::file).
/// \returns the header and the rows.
/// \throws input_error naming the file, the line and the value for: no header
/// row, a duplicated header name, a row whose field count differs from the
/// header's, an unclosed quote, a quote inside an unquoted field or text after
/// a closing quote, a CR not followed by LF.
inline csv_table parse_csv(std::string_view text, std::filesystem::path const& file) {
    csv_table t;
    t.file = file;
    if (text.starts_with("\xEF\xBB\xBF"))
        detail::fail_line(file, 1, "byte 0",
                          "starts with a UTF-8 byte-order mark (BOM); save the file without BOM (e.g. \"CSV UTF-8\" "
                          "is the form with a BOM, plain \"CSV\" is without)");
    bool header = true;
    std::size_t max_fields = 0;  // the header's count, once read
    detail::split_csv(text, file, max_fields, [&](std::vector<std::string>& fields, std::int64_t line) {
        if (header) {
            std::set<std::string_view> seen;
            for (auto const& c : fields)
                if (!seen.insert(c).second) detail::fail_line(file, line, c, "duplicated column name");
            t.columns = std::move(fields);
            max_fields = t.columns.size();
            header = false;
            return;
        }
        if (fields.size() != t.columns.size())
            detail::fail_line(file, line, std::to_string(fields.size()),
                              "field count differs from the header's " + std::to_string(t.columns.size()));
        t.rows.push_back(std::move(fields));
        t.lines.push_back(line);
    });
    if (header) detail::fail_line(file, 1, "", "empty file: no header row");
    return t;
}

/// \brief Read a CSV file (RFC 4180, see parse_csv). Memory is bounded by the
/// file's size: its bytes, then the fields (one std::string each, so at most
/// a few dozen bytes per byte of a file of empty fields).
/// \param[in] file the file.
/// \param[in] max_bytes files larger than this are rejected before reading (default 4 GiB).
/// \returns the header and the rows.
/// \throws input_error naming the file and the OS reason when it cannot be
/// read; naming its size when over `max_bytes`; and as parse_csv.
inline csv_table read_csv(std::filesystem::path const& file, std::uintmax_t max_bytes = std::uintmax_t(1) << 32) {
    std::string const text = detail::slurp(file, max_bytes);
    return parse_csv(text, file);
}

namespace detail {

inline head_class parse_class(csv_table const& t, std::size_t row, std::size_t col) {
    for (auto c : report::taxonomy_classes)
        if (t.rows[row][col] == to_string(c)) return c;
    t.bad_field(row, col, "not a head class");
}

inline head_id read_id(csv_table const& t, std::size_t row, std::array<std::size_t, 3> const& col) {
    std::array<std::int64_t, 3> v{};
    for (std::size_t k = 0; k < 3; ++k)
        if ((v[k] = t.integer(row, col[k])) < 0) t.bad_field(row, col[k], "negative head index");
    return {v[0], v[1], v[2]};
}

inline std::array<std::size_t, 3> id_columns(csv_table const& t) {
    return {t.column("layer"), t.column("q_head"), t.column("k_head")};
}

/// head_metrics.csv → heads, in file order; `index` maps each id to its head.
inline void read_head_metrics(csv_table const& t, run_heads& out, std::map<head_id, std::size_t>& index) {
    auto const id_col = id_columns(t);
    // The 39 metrics of the thesis are required; the columns beyond it
    // (issue 17, from "ap_drop_bias" on) are read when present and NaN in
    // analysis folders written before them.
    constexpr std::size_t n_required = 39;
    static_assert(head_metric_names[n_required] == "ap_drop_bias");
    std::array<std::optional<std::size_t>, head_metric_names.size()> mcol{};
    for (std::size_t m = 0; m < mcol.size(); ++m)
        mcol[m] = m < n_required ? std::optional<std::size_t>(t.column(head_metric_names[m])) : t.find(head_metric_names[m]);
    std::size_t const tax = t.column("taxonomy");
    for (std::size_t r = 0; r < t.rows.size(); ++r) {
        head_row h;
        h.id = read_id(t, r, id_col);
        for (std::size_t m = 0; m < mcol.size(); ++m) {
            h.metrics[m] = mcol[m] ? t.number(r, *mcol[m]) : std::numeric_limits<double>::quiet_NaN();
            if (auto const problem = metric_value_problem(head_metric_names[m], h.metrics[m]);
                mcol[m] && !problem.empty())
                t.bad_field(r, *mcol[m], problem + "; docs/study.md#metrics");
        }
        h.taxonomy = parse_class(t, r, tax);
        if (!index.emplace(h.id, out.heads.size()).second)
            fail_line(t.file, t.lines[r],
                      std::to_string(h.id.layer) + "," + std::to_string(h.id.q_head) + "," + std::to_string(h.id.k_head),
                      "head (layer, q_head, k_head) listed twice");
        out.n_layers = std::max(out.n_layers, h.id.layer + 1);
        out.heads.push_back(std::move(h));
    }
}

/// An integer column's value, checked to lie in [lo, hi].
inline std::int64_t ranged(csv_table const& t, std::size_t r, std::size_t c, std::int64_t lo, std::int64_t hi) {
    std::int64_t const v = t.integer(r, c);
    if (v < lo || v > hi)
        t.bad_field(r, c, "outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return v;
}

/// head_profile.csv → each head's profile (rows in file order, q_bucket ascending per head).
inline void read_head_profile(csv_table const& t, run_heads& out, std::map<head_id, std::size_t> const& index) {
    auto const id_col = id_columns(t);
    std::size_t const qb = t.column("q_bucket"), tau = t.column("tau"), nq = t.column("n_queries"),
                      ap = t.column("plasticity"), qu = t.column("quintile"), de = t.column("decile");
    for (std::size_t r = 0; r < t.rows.size(); ++r) {
        head_id const id = read_id(t, r, id_col);
        auto const it = index.find(id);
        if (it == index.end())
            fail_line(t.file, t.lines[r],
                      std::to_string(id.layer) + "," + std::to_string(id.q_head) + "," + std::to_string(id.k_head),
                      "head (layer, q_head, k_head) not in head_metrics.csv");
        profile_point p;
        p.q_bucket = t.integer(r, qb);
        p.tau = t.number(r, tau);
        if (p.tau < 0 || std::isinf(p.tau)) t.bad_field(r, tau, "a mean query position must be >= 0 and finite (or nan)");
        p.n_queries = ranged(t, r, nq, 0, std::numeric_limits<std::int64_t>::max());
        p.ap = t.number(r, ap);
        if (!std::isnan(p.ap) && !(p.ap >= -metric_range_slack && p.ap <= 1 + metric_range_slack))
            t.bad_field(r, ap, "a bucket's plasticity must lie in [0, 1] (or be nan)");
        p.quintile = static_cast<int>(ranged(t, r, qu, 0, 4));
        p.decile = static_cast<int>(ranged(t, r, de, 0, 9));
        auto& prof = out.heads[it->second].profile;
        if (!prof.empty() && p.q_bucket <= prof.back().q_bucket)
            t.bad_field(r, qb, "q_bucket not ascending within its head (duplicated or out of order)");
        prof.push_back(p);
    }
}

/// model_report.csv (one row) → report_quintile / report_decile.
inline void read_model_quantiles(csv_table const& t, run_heads& out) {
    if (t.rows.size() != 1)
        qkgeom::detail::fail_input(t.file.string(), "rows", t.rows.size(), "expected exactly one model row");
    auto const plasticity = [&](std::string const& name) {
        auto const c = t.column(name);
        double const x = t.number(0, c);
        if (!std::isnan(x) && !(x >= -metric_range_slack && x <= 1 + metric_range_slack))
            t.bad_field(0, c, "a plasticity mean must lie in [0, 1] (or be nan)");
        return x;
    };
    for (std::size_t i = 0; i < out.report_quintile.size(); ++i)
        out.report_quintile[i] = plasticity("ap_quintile_" + std::to_string(i));
    for (std::size_t i = 0; i < out.report_decile.size(); ++i)
        out.report_decile[i] = plasticity("ap_decile_" + std::to_string(i));
}

inline bool present(std::filesystem::path const& p) {
    std::error_code ec;
    return std::filesystem::exists(p, ec);
}

}  // namespace detail

/// \brief Read one run's heads back from an analysis folder (`qkgeom analyze
/// -o`, report::write_reports): head_metrics.csv (required), head_profile.csv
/// when present, else model_report.csv's ap_quintile_* / ap_decile_* when
/// present. Columns are found by name (extra columns are ignored).
/// `n_layers` is 1 + the largest layer (0 without heads); `context_length`
/// is left 0 (unknown: no CSV file records it).
/// \param[in] dir the analysis folder.
/// \returns the heads in head_metrics.csv order, each with its profile rows in file order.
/// \throws input_error naming the folder when it has no head_metrics.csv or
/// holds failures.txt (an analysis in which some heads failed); naming
/// the file, field and value for: a missing column, a bad number or integer, a
/// negative head index, an unknown taxonomy class, a head listed twice, a
/// profile row whose head is not in head_metrics.csv, a metric outside its
/// range (metric_value_problem: ap_overall 7.5, a negative or fractional
/// count, an infinity), a negative or infinite tau, a bucket plasticity or a
/// quantile mean outside [0, 1], a quintile outside 0..4 or
/// decile outside 0..9, a negative n_queries, a q_bucket not ascending within its
/// head, a model_report.csv without exactly one row; and as read_csv.
inline run_heads read_analysis(std::filesystem::path const& dir) {
    // `qkgeom analyze` writes failures.txt when some heads failed (exit
    // status 3): the folder holds only the healthy heads, and a model-level
    // mean over them would pass for the whole model's.
    if (auto const failures = dir / "failures.txt"; detail::present(failures))
        qkgeom::detail::fail_input(dir.string(), "failures.txt", failures.string(),
                                   "an incomplete analysis: the run that wrote it failed on some heads (exit status 3, "
                                   "listed in failures.txt); analyse the capture again until every head succeeds");
    auto const metrics = dir / std::string(report::head_metrics_file);
    if (!detail::present(metrics))
        qkgeom::detail::fail_input(dir.string(), std::string(report::head_metrics_file), dir.string(),
                                   "not an analysis folder: no head_metrics.csv");
    run_heads out;
    std::map<head_id, std::size_t> index;
    detail::read_head_metrics(read_csv(metrics), out, index);
    auto const profile = dir / std::string(report::head_profile_file);
    auto const model = dir / std::string(report::model_report_file);
    if (detail::present(profile)) {
        detail::read_head_profile(read_csv(profile), out, index);
        out.has_profiles = true;
    } else if (detail::present(model)) {
        detail::read_model_quantiles(read_csv(model), out);
    }
    return out;
}

}  // namespace study
}  // namespace qkgeom
