// Runtime tests of the streaming dataset writer (io::dataset_writer) and of
// the dataset analysis loop (io::analyze_dataset): the writer's files equal
// write_head's of the concatenated rows byte for byte however the rows are
// batched and flushed; bad batches throw naming the field and change nothing;
// an unclosed writer leaves no dataset; the loop accounts for every planned head.
#include "temp_dir.hpp"

#include <qkgeom/analysis/policy_names.hpp>
#include <qkgeom/io/dataset.hpp>
#include <qkgeom/io/dataset_writer.hpp>
#include <qkgeom/run/dataset_analysis.hpp>

#include <catch2/catch.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <functional>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <vector>

// One namespace per file: the test program is built as a unity build
// (tests/CMakeLists.txt), where the files' helpers must not meet.
namespace qkgeom_tests_dataset_writer_test {

namespace {

namespace fs = std::filesystem;
namespace io = qkgeom::io;
using Catch::Matchers::Contains;
using qkgeom::kind;

struct temp_dir : qkgeom_test::temp_dir {  // tests/runtime/temp_dir.hpp
    temp_dir() : qkgeom_test::temp_dir("qkgeom_writer_test_") {}
};

std::vector<unsigned char> file_bytes(fs::path const& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// 2 layers (4 and 2 query heads, 2 and 1 key heads), d = 5, L = 500,
/// uniform buckets of 32, layer 1 windowed.
io::manifest writer_manifest() {
    io::manifest m;
    m.model = "writer-test";
    m.n_layers = 2;
    m.n_q_heads = {4, 2};
    m.n_kv_heads = {2, 1};
    m.head_dim = 5;
    m.buckets = {qkgeom::bucket_scheme::uniform, 32, 1.0};
    m.context_length = 500;
    m.seed = 11;
    m.sliding_window = {std::nullopt, 64};
    m.rope_applied = {true, false};
    m.token_sampler = "qk-sniffer";
    return m;
}

/// The rows of one entry: values, positions, example ids.
struct entry_rows {
    qkgeom::row_matrix v;
    std::vector<std::int64_t> pos, ex;
};

using entry_key = std::tuple<std::int64_t, kind, std::int64_t>;

std::map<entry_key, entry_rows> make_rows(std::uint64_t seed, std::int64_t d, double scale) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> g(0.0, scale);
    std::uniform_int_distribution<std::int64_t> n_of(30, 140), pos_of(0, 499), ex_of(0, 9);
    std::map<entry_key, entry_rows> out;
    // every entry of the manifest but l00h03q (never appended: not written)
    std::vector<entry_key> const keys{{0, kind::query, 0}, {0, kind::query, 1}, {0, kind::query, 2}, {0, kind::key, 0},
                                  {0, kind::key, 1},   {1, kind::query, 0}, {1, kind::query, 1}, {1, kind::key, 0}};
    for (auto const& k : keys) {
        entry_rows e;
        auto const n = n_of(rng);
        e.v.resize(n, d);
        std::set<std::pair<std::int64_t, std::int64_t>> used;  // one row per token (close refuses a repeat)
        for (std::int64_t i = 0; i < n; ++i) {
            for (std::int64_t j = 0; j < d; ++j) e.v(i, j) = g(rng);
            std::pair<std::int64_t, std::int64_t> t;
            do t = {ex_of(rng), pos_of(rng)};
            while (!used.insert(t).second);
            e.pos.push_back(t.second);
            e.ex.push_back(t.first);
        }
        out[k] = std::move(e);
    }
    return out;
}

/// Appends every entry's rows in batches of 0..12 rows (and one batch of 60
/// rows, larger than a tiny budget), entries interleaved at random.
void stream_rows(io::dataset_writer& w, std::map<entry_key, entry_rows> const& rows, std::uint64_t seed,
                 std::size_t budget) {
    std::mt19937_64 rng(seed);
    std::map<entry_key, std::int64_t> done;
    std::vector<entry_key> open;
    for (auto const& [k, e] : rows) open.push_back(k);
    bool big_done = false;
    while (!open.empty()) {
        std::size_t const pick = std::uniform_int_distribution<std::size_t>(0, open.size() - 1)(rng);
        auto const k = open[pick];
        auto const& e = rows.at(k);
        std::int64_t const at = done[k];
        std::int64_t want = std::uniform_int_distribution<std::int64_t>(0, 12)(rng);
        if (!big_done && e.v.rows() - at >= 60) {
            want = 60;
            big_done = true;
        }
        std::int64_t const n = std::min(want, e.v.rows() - at);
        // rows as float64 Eigen (column-major: a strided read) of the batch
        Eigen::MatrixXd batch = e.v.middleRows(at, n);
        w.append(std::get<0>(k), std::get<1>(k), std::get<2>(k), batch,
                 std::span<std::int64_t const>(e.pos.data() + at, static_cast<std::size_t>(n)),
                 std::span<std::int64_t const>(e.ex.data() + at, static_cast<std::size_t>(n)));
        CHECK(w.buffered_bytes() <= budget);
        done[k] = at + n;
        if (done[k] == e.v.rows()) open.erase(open.begin() + static_cast<std::ptrdiff_t>(pick));
    }
}

/// The reference: write_head of each entry's whole rows.
void write_reference(fs::path const& dir, io::manifest const& m, std::map<entry_key, entry_rows> const& rows,
                     std::string_view dtype) {
    io::write_manifest(dir, m);
    for (auto const& [k, e] : rows) {
        io::head_entry h;
        h.layer = std::get<0>(k);
        h.k = std::get<1>(k);
        h.head = std::get<2>(k);
        h.vectors = e.v;
        h.position = qkgeom::token_positions(e.pos);
        std::vector<std::int64_t> b;
        for (auto t : e.pos) b.push_back(qkgeom::bucket_of(m.buckets, t));
        h.bucket = qkgeom::token_buckets(b);
        h.example_id = qkgeom::example_ids(e.ex);
        auto const L = static_cast<std::size_t>(h.layer);
        h.sliding_window = m.sliding_window[L];
        io::write_head(dir, m, h, io::storage_format::npy, dtype);
    }
}

/// Every file of every entry of `a` equals, byte for byte, the same file in `b`.
void require_same_entries(fs::path const& a, fs::path const& b, std::size_t n_entries) {
    std::size_t entries = 0, files = 0;
    for (auto const& de : fs::directory_iterator(b)) {
        if (!de.is_directory()) continue;
        ++entries;
        for (auto const& f : fs::directory_iterator(de.path())) {
            auto const other = a / de.path().filename() / f.path().filename();
            INFO(other.string());
            REQUIRE(fs::exists(other));
            CHECK(file_bytes(other) == file_bytes(f.path()));
            ++files;
        }
        std::size_t mine = 0;
        for (auto const& f : fs::directory_iterator(a / de.path().filename())) mine += f.is_regular_file() ? 1 : 0;
        CHECK(mine == static_cast<std::size_t>(std::distance(fs::directory_iterator(de.path()), fs::directory_iterator())));
    }
    CHECK(entries == n_entries);
    CHECK(files >= 4 * n_entries);
}

}  // namespace

TEST_CASE("dataset_writer: many small batches and flushes give write_head's files byte for byte",
          "[dataset_writer][io]") {
    auto const m = writer_manifest();
    for (std::string_view dtype : {"f32", "f16", "bf16", "f64"}) {
        INFO("dtype " << dtype);
        temp_dir tmp;
        auto const rows = make_rows(7, m.head_dim, 1.5);
        std::size_t const budget = 300;  // a few rows: flushes after nearly every batch
        {
            io::dataset_writer w(tmp.path / "streamed", m, dtype, budget);
            stream_rows(w, rows, 3, budget);
            // rows are on disk before close (flushed), the folder is not a dataset yet
            CHECK(fs::file_size(tmp.path / "streamed" / "l00h00q" / "vectors.npy") > 128);
            CHECK(!fs::exists(tmp.path / "streamed" / "manifest.json"));
            for (auto const& [k, e] : rows) CHECK(w.rows(std::get<0>(k), std::get<1>(k), std::get<2>(k)) == e.v.rows());
            w.close();
            CHECK(w.closed());
            CHECK_NOTHROW(w.close());  // again: nothing
        }
        write_reference(tmp.path / "reference", m, rows, dtype);
        require_same_entries(tmp.path / "streamed", tmp.path / "reference", rows.size());
        CHECK(!fs::exists(tmp.path / "streamed" / "l00h03q"));  // never appended: not written
        auto const back = io::read_manifest(tmp.path / "streamed");
        CHECK_NOTHROW(io::check_compatible(back, m));
        CHECK(back.rope_applied == m.rope_applied);
        CHECK(back.token_sampler == "qk-sniffer");
        for (auto const& [k, e] : rows) {
            auto const h = io::read_head(tmp.path / "streamed", back, std::get<0>(k), std::get<2>(k), std::get<1>(k));
            CHECK(h.dtype == dtype);
            CHECK(h.position.values() == e.pos);
            CHECK(h.example_id.values() == e.ex);
            CHECK(h.sliding_window == m.sliding_window[static_cast<std::size_t>(std::get<0>(k))]);
            if (dtype == "f64") CHECK(h.vectors == e.v);  // f64: the values themselves
        }
    }
}

TEST_CASE("dataset_writer: one big budget (no flush before close) gives the same files", "[dataset_writer][io]") {
    auto const m = writer_manifest();
    temp_dir tmp;
    auto const rows = make_rows(19, m.head_dim, 0.7);
    {
        io::dataset_writer w(tmp.path / "streamed", m, io::dtype::bf16);
        stream_rows(w, rows, 5, io::dataset_writer::default_buffer_bytes);
        CHECK(!fs::exists(tmp.path / "streamed" / "l00h00q"));  // nothing flushed yet
        w.close();
    }
    write_reference(tmp.path / "reference", m, rows, "bf16");
    require_same_entries(tmp.path / "streamed", tmp.path / "reference", rows.size());
}

TEST_CASE("dataset_writer: a batch of more rows than one encoding chunk (and than the budget)", "[dataset_writer][io]") {
    auto m = writer_manifest();
    m.context_length = 100000;
    std::map<entry_key, entry_rows> rows;
    std::mt19937_64 rng(29);
    std::normal_distribution<double> g(0.0, 2.0);
    entry_rows e;
    std::int64_t const n = 60000;  // the writer encodes 2^17 / d = 26214 rows at a time: three chunks
    e.v.resize(n, m.head_dim);
    for (Eigen::Index i = 0; i < e.v.size(); ++i) e.v.data()[i] = g(rng);
    for (std::int64_t i = 0; i < n; ++i) {
        e.pos.push_back((i * 7919) % m.context_length);
        e.ex.push_back(i / 1000);
    }
    rows[{0, kind::query, 2}] = e;
    for (std::string_view dtype : {"f32", "bf16"}) {
        temp_dir tmp;
        {
            io::dataset_writer w(tmp.path / "streamed", m, dtype, 4096);
            w.append(0, kind::query, 2, e.v, e.pos, e.ex);
            CHECK(w.buffered_bytes() == 0);  // over the budget: written at once
            w.close();
        }
        write_reference(tmp.path / "reference", m, rows, dtype);
        require_same_entries(tmp.path / "streamed", tmp.path / "reference", 1);
    }
}

TEST_CASE("dataset_writer: rows of any RowMatrix type, f16 views included, are stored exactly", "[dataset_writer][io]") {
    auto m = writer_manifest();
    temp_dir tmp;
    // f16 source rows stored as f16: the values survive bit for bit
    std::vector<qkgeom::float16> src;
    for (int i = 0; i < 3 * 5; ++i) src.push_back(qkgeom::float16::from_float(0.1f * static_cast<float>(i) - 0.7f));
    auto const view = qkgeom::make_matrix_view(std::span<qkgeom::float16 const>(src), 3, 5);
    std::vector<std::int64_t> const pos{3, 40, 499}, ex{0, 1, 2};
    io::dataset_writer w(tmp.path / "d", m, io::dtype::f16, 64);
    w.append(0, kind::key, 1, view, pos, ex);
    w.close();
    auto const h = io::read_head(tmp.path / "d", 0, 1, kind::key);
    REQUIRE(h.vectors.rows() == 3);
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 5; ++j) CHECK(h.vectors(i, j) == static_cast<double>(src[static_cast<std::size_t>(i * 5 + j)].to_float()));
    CHECK(h.bucket.values() == std::vector<std::int64_t>{0, 1, 15});
}

TEST_CASE("dataset_writer: bad batches throw naming the field and change nothing", "[dataset_writer][io]") {
    auto const m = writer_manifest();
    temp_dir tmp;
    io::dataset_writer w(tmp.path / "d", m, io::dtype::f16, 100);
    Eigen::MatrixXd good = Eigen::MatrixXd::Constant(4, 5, 0.25);
    std::vector<std::int64_t> pos{0, 1, 2, 3}, ex{0, 0, 0, 0};
    w.append(0, kind::query, 0, good, pos, ex);
    auto const before = w.rows(0, kind::query, 0);
    auto bad = [&](auto const& rows, std::vector<std::int64_t> const& p, std::vector<std::int64_t> const& e, std::int64_t layer,
                   kind k, std::int64_t head, std::string const& what) {
        INFO(what);
        CHECK_THROWS_WITH(w.append(layer, k, head, rows, p, e), Contains(what));
        CHECK(w.rows(0, kind::query, 0) == before);
    };
    bad(good, pos, ex, 2, kind::query, 0, "layer outside [0, n_layers = 2); layer (value 2)");
    bad(good, pos, ex, -1, kind::query, 0, "(value -1)");
    bad(good, pos, ex, 0, kind::key, 2, "head outside [0, n_kv_heads[0] = 2); head (value 2)");
    bad(good, pos, ex, 1, kind::query, 2, "head outside [0, n_q_heads[1] = 2); head (value 2)");
    Eigen::MatrixXd wide = Eigen::MatrixXd::Zero(4, 6);
    bad(wide, pos, ex, 0, kind::query, 0, "(l00h00q): rows: width differs from the manifest's head_dim = 5; width (value 6)");
    bad(good, {0, 1, 2}, ex, 0, kind::query, 0, "positions: length differs from the 4 rows; length (value 3)");
    bad(good, pos, {0, 0}, 0, kind::query, 0, "example_ids: length differs from the 4 rows; length (value 2)");
    bad(good, {0, 1, 500, 3}, ex, 0, kind::query, 0, "positions[2]: position outside [0, context_length = 500) (value 500)");
    bad(good, {0, -4, 2, 3}, ex, 0, kind::query, 0, "positions[1]: position outside [0, context_length = 500) (value -4)");
    Eigen::MatrixXd nan = good;
    nan(2, 3) = std::numeric_limits<double>::quiet_NaN();
    bad(nan, pos, ex, 0, kind::query, 0, "rows[row 2, col 3]: non-finite value");
    Eigen::MatrixXd huge = good;
    huge(3, 1) = 1e6;  // finite, but f16 overflows at 65520
    bad(huge, pos, ex, 0, kind::query, 0, "rows[row 3, col 1]: value overflows the storage dtype f16 (value 1000000)");
    huge(3, 1) = 1e39;
    bad(huge, pos, ex, 0, kind::query, 0, "rows[row 3, col 1]: value outside the input limit");
    CHECK(w.rows(0, kind::key, 1) == 0);
    w.close();
    auto const h = io::read_head(tmp.path / "d", 0, 0, kind::query);
    CHECK(h.vectors.rows() == 4);
    CHECK(h.vectors == good);
    CHECK_THROWS_WITH(w.append(0, kind::query, 0, good, pos, ex), Contains("the writer is closed"));
    // a batch of no rows writes nothing
    temp_dir t2;
    io::dataset_writer w2(t2.path / "d", m);
    w2.append(0, kind::query, 1, Eigen::MatrixXd(0, 5), std::span<std::int64_t const>{}, std::span<std::int64_t const>{});
    w2.close();
    CHECK(!fs::exists(t2.path / "d" / "l00h01q"));
}

TEST_CASE("read_head refuses an entry holding one token twice, naming the entry, example, position and rows",
          "[dataset][io]") {
    auto const m = writer_manifest();
    Eigen::MatrixXd const rows = Eigen::MatrixXd::Constant(3, 5, 0.5);
    temp_dir tmp;
    io::dataset_writer w(tmp.path / "d", m, io::dtype::f32);
    w.append(0, kind::query, 1, rows, std::vector<std::int64_t>{4, 4, 6}, std::vector<std::int64_t>{7, 8, 7});
    w.append(0, kind::key, 0, rows, std::vector<std::int64_t>{4, 5, 6}, std::vector<std::int64_t>{7, 7, 7});
    w.close();
    CHECK(io::read_head(tmp.path / "d", 0, 1, kind::query).vectors.rows() == 3);  // distinct tokens: read
    // the same example for rows 0 and 1 (both at position 4): one token twice
    auto const ex = tmp.path / "d" / "l00h01q" / "example_id.npy";
    io::write_npy(ex, std::vector<std::int64_t>{7, 7, 7}, {3});
    CHECK_THROWS_WITH(io::read_head(tmp.path / "d", 0, 1, kind::query),
                      Contains("l00h01q") && Contains("example 7, position 4 is held twice (rows 0 and 1") &&
                          Contains("example_id.npy"));
    io::write_npy(ex, std::vector<std::int64_t>{9, 7, 7}, {3});  // rows 0 and 1 apart again
    CHECK(io::read_head(tmp.path / "d", 0, 1, kind::query).vectors.rows() == 3);
}

TEST_CASE("dataset_writer: one token appended twice is refused at close, naming it, with no manifest",
          "[dataset_writer][io]") {
    auto const m = writer_manifest();
    Eigen::MatrixXd const rows = Eigen::MatrixXd::Constant(3, 5, 0.5);
    for (std::size_t budget : {std::size_t{1}, io::dataset_writer::default_buffer_bytes}) {  // flushed apart, or buffered
        INFO("budget " << budget);
        temp_dir tmp;
        io::dataset_writer w(tmp.path / "d", m, io::dtype::f32, budget);
        w.append(0, kind::query, 1, rows, std::vector<std::int64_t>{4, 5, 6}, std::vector<std::int64_t>{7, 7, 7});
        // the same positions under other examples, and another entry: fine
        w.append(0, kind::query, 1, rows, std::vector<std::int64_t>{4, 5, 6}, std::vector<std::int64_t>{8, 9, 9});
        w.append(0, kind::key, 0, rows, std::vector<std::int64_t>{4, 5, 6}, std::vector<std::int64_t>{7, 7, 7});
        // example 9, position 6 again (row 6 of the entry; first at row 5)
        w.append(0, kind::query, 1, rows.topRows(1), std::vector<std::int64_t>{6}, std::vector<std::int64_t>{9});
        CHECK_THROWS_WITH(w.close(), Contains("(l00h01q)") && Contains("example 9, position 6 appended twice (rows 5 and 6)"));
        CHECK(!w.closed());
        CHECK(!fs::exists(tmp.path / "d" / "manifest.json"));
    }
    temp_dir ok;  // the control: the same batches without the repeat close fine
    io::dataset_writer w(ok.path / "d", m, io::dtype::f32, 1);
    w.append(0, kind::query, 1, rows, std::vector<std::int64_t>{4, 5, 6}, std::vector<std::int64_t>{7, 7, 7});
    w.append(0, kind::query, 1, rows, std::vector<std::int64_t>{4, 5, 6}, std::vector<std::int64_t>{8, 9, 9});
    w.close();
    CHECK(fs::exists(ok.path / "d" / "manifest.json"));
}

TEST_CASE("dataset_writer: a flush that fails leaves the writer as before the append", "[dataset_writer][io]") {
    auto const m = writer_manifest();
    temp_dir tmp;
    auto const rows = make_rows(31, m.head_dim, 1.0);
    auto const& a = rows.at({0, kind::query, 0});
    auto const& b = rows.at({0, kind::key, 1});
    REQUIRE(a.v.rows() >= 60);
    REQUIRE(b.v.rows() >= 40);
    std::size_t const budget = 2000;  // about 45 rows of f32
    io::dataset_writer w(tmp.path / "d", m, io::dtype::f32, budget);
    auto put = [&](entry_rows const& e, kind k, std::int64_t head, std::int64_t from, std::int64_t n) {
        w.append(0, k, head, qkgeom::row_matrix(e.v.middleRows(from, n)),
                 std::span<std::int64_t const>(e.pos.data() + from, static_cast<std::size_t>(n)),
                 std::span<std::int64_t const>(e.ex.data() + from, static_cast<std::size_t>(n)));
    };
    put(a, kind::query, 0, 0, 50);   // 50 rows: over the budget, written at once
    put(a, kind::query, 0, 50, 10);  // buffered
    // an obstacle: example_id.npy of l00h00q becomes a directory (the file set
    // aside), so the next flush of that entry appends to three files and fails
    // at the fourth
    auto const dir = tmp.path / "d" / "l00h00q";
    fs::rename(dir / "example_id.npy", tmp.path / "aside.npy");
    fs::create_directories(dir / "example_id.npy");
    CHECK_THROWS_AS(put(b, kind::key, 1, 0, 40), qkgeom::io_error);  // needs room: flushes l00h00q, which fails
    CHECK(w.rows(0, kind::query, 0) == 60);  // the 10 rows still buffered
    CHECK(w.rows(0, kind::key, 1) == 0);     // the failed batch was not taken
    CHECK(fs::file_size(dir / "vectors.npy") == 128 + 50 * 5 * 4);  // the appended rows truncated away
    CHECK(fs::file_size(dir / "position.npy") == 128 + 50 * 8);
    CHECK(fs::file_size(dir / "bucket.npy") == 128 + 50 * 8);
    fs::remove(dir / "example_id.npy");
    fs::rename(tmp.path / "aside.npy", dir / "example_id.npy");
    put(b, kind::key, 1, 0, 40);  // again: now it works
    put(a, kind::query, 0, 60, a.v.rows() - 60);
    put(b, kind::key, 1, 40, b.v.rows() - 40);
    w.close();
    std::map<entry_key, entry_rows> both{{{0, kind::query, 0}, a}, {{0, kind::key, 1}, b}};
    write_reference(tmp.path / "reference", m, both, "f32");
    require_same_entries(tmp.path / "d", tmp.path / "reference", 2);
}

TEST_CASE("dataset_writer: refuses a folder holding a dataset, a bad manifest or dtype", "[dataset_writer][io]") {
    auto const m = writer_manifest();
    temp_dir tmp;
    io::write_manifest(tmp.path / "has_manifest", m);
    CHECK_THROWS_AS(io::dataset_writer(tmp.path / "has_manifest", m), qkgeom::io_error);
    CHECK_THROWS_WITH(io::dataset_writer(tmp.path / "has_manifest", m), Contains("already holds a manifest.json"));
    fs::create_directories(tmp.path / "has_entry");
    std::ofstream(tmp.path / "has_entry" / "l01h00k.npz") << "x";
    CHECK_THROWS_WITH(io::dataset_writer(tmp.path / "has_entry", m), Contains("already holds an entry ('l01h00k.npz')"));
    std::ofstream(tmp.path / "a_file") << "x";
    CHECK_THROWS_WITH(io::dataset_writer(tmp.path / "a_file", m), Contains("is not a directory"));
    fs::create_directories(tmp.path / "other_files");
    std::ofstream(tmp.path / "other_files" / "README") << "x";
    CHECK_NOTHROW(io::dataset_writer(tmp.path / "other_files", m));  // unrelated files are fine
    auto bad = m;
    bad.n_kv_heads = {3, 1};
    CHECK_THROWS_WITH(io::dataset_writer(tmp.path / "new1", bad), Contains("n_kv_heads[0]"));
    bad = m;
    bad.rope_applied = {true};
    CHECK_THROWS_WITH(io::dataset_writer(tmp.path / "new2", bad), Contains("capture.rope_applied"));
    bad = m;
    bad.token_sampler = "";
    CHECK_THROWS_WITH(io::dataset_writer(tmp.path / "new3", bad), Contains("capture.token_sampler"));
    CHECK_THROWS_WITH(io::dataset_writer(tmp.path / "new4", m, "f8"), Contains("vector dtype must be"));
    CHECK_THROWS_WITH(io::dataset_writer(tmp.path / "new5", m, io::dtype::i64), Contains("vector dtype must be"));
    CHECK_THROWS_WITH(io::dataset_writer(tmp.path / "new6", m, io::dtype::f32, 0), Contains("buffer_bytes must be >= 1"));
}

TEST_CASE("dataset_writer: a writer destroyed without close leaves no dataset", "[dataset_writer][io]") {
    auto const m = writer_manifest();
    temp_dir tmp;
    auto const rows = make_rows(23, m.head_dim, 1.0);
    {
        io::dataset_writer w(tmp.path / "d", m, io::dtype::f32, 200);
        stream_rows(w, rows, 9, 200);
    }  // no close
    CHECK(!fs::exists(tmp.path / "d" / "manifest.json"));
    CHECK_THROWS_AS(io::read_manifest(tmp.path / "d"), qkgeom::input_error);
    REQUIRE(fs::exists(tmp.path / "d" / "l00h00q" / "vectors.npy"));  // flushed rows stay...
    CHECK_THROWS_AS(io::read_npy(tmp.path / "d" / "l00h00q" / "vectors.npy"), qkgeom::input_error);  // ...unreadable
    CHECK_THROWS_AS(io::read_head(tmp.path / "d", m, 0, 0, kind::query), qkgeom::input_error);
}

// ---------------------------------------------------------------------------
// analyze_dataset: the loop of `qkgeom analyze`
// ---------------------------------------------------------------------------

namespace {

/// 1 layer, 6 query heads, 2 key heads, d = 5, L = 500; every key entry and
/// the query entries `q_heads`, 20 rows each.
io::manifest loop_dataset(fs::path const& dir, std::vector<std::int64_t> const& q_heads,
                          io::dtype vectors = io::dtype::f32) {
    io::manifest m;
    m.model = "loop-test";
    m.n_layers = 1;
    m.n_q_heads = {6};
    m.n_kv_heads = {2};
    m.head_dim = 5;
    m.buckets = {qkgeom::bucket_scheme::uniform, 50, 1.0};
    m.context_length = 500;
    std::mt19937_64 rng(5);
    std::normal_distribution<double> g;
    io::dataset_writer w(dir, m, vectors);
    auto put = [&](kind k, std::int64_t h) {
        Eigen::MatrixXd v(20, 5);
        for (Eigen::Index i = 0; i < v.size(); ++i) v.data()[i] = g(rng);
        std::vector<std::int64_t> pos, ex;
        for (std::int64_t i = 0; i < 20; ++i) {
            pos.push_back(i * 24 + h);
            ex.push_back(i % 3);
        }
        w.append(0, k, h, v, pos, ex);
    };
    for (std::int64_t h = 0; h < 2; ++h) put(kind::key, h);
    for (auto h : q_heads) put(kind::query, h);
    w.close();
    return m;
}

}  // namespace

TEST_CASE("analyze_dataset: every planned head is analysed, missing or failed, strays listed", "[dataset_writer][io]") {
    temp_dir tmp;
    loop_dataset(tmp.path, {0, 1, 2, 4});
    fs::create_directories(tmp.path / "l00h07q");  // outside n_q_heads = 6
    std::atomic<int> done{0};
    io::dataset_run_options o;
    o.jobs = 3;
    o.context = 480;
    o.window = 7;
    o.on_head_done = [&](std::string const&) { ++done; };
    std::vector<std::int64_t> seen_context(6, -1), seen_window(6, -1);
    auto stub = [&](qkgeom::head_capture<qkgeom::row_matrix> const& h, qkgeom::analysis_options const&) {
        if (h.id.q_head == 2) throw std::runtime_error("boom");
        seen_context[static_cast<std::size_t>(h.id.q_head)] = h.facts.context_length;
        seen_window[static_cast<std::size_t>(h.id.q_head)] = h.facts.sliding_window;
        qkgeom::head_analysis a;
        a.id = h.id;
        a.n_q_tokens = h.queries.vectors.rows();
        return a;
    };
    auto const run = io::analyze_dataset(io::plan_dataset(tmp.path), o, stub);
    CHECK(done == 6);
    REQUIRE(run.planned.size() == 6);
    REQUIRE(run.heads.size() == 3);
    CHECK(run.heads[0].id.q_head == 0);
    CHECK(run.heads[1].id.q_head == 1);
    CHECK(run.heads[2].id.q_head == 4);
    CHECK(run.heads[2].id.k_head == 1);
    CHECK(run.heads[2].n_q_tokens == 20);
    CHECK(seen_context[4] == 480);  // the override
    CHECK(seen_window[4] == 7);     // no recorded window: the override applies
    CHECK(run.missing == std::vector<std::size_t>{3, 5});
    CHECK(io::missing_entry_message(run, 3) ==
          (tmp.path / "l00h03q").string() + ": no entry (neither a folder nor a .npz / .safetensors file)");
    REQUIRE(run.failures.size() == 1);
    CHECK(run.failures[0].index == 2);
    CHECK(run.failures[0].message == "boom");
    REQUIRE(run.stray.size() == 1);
    CHECK(run.stray[0].name == "l00h07q");
    CHECK_THAT(run.stray[0].message, Contains("entry outside the manifest's head counts (n_layers 1, n_q_heads [6], n_kv_heads [2] in "));

    // strict: the stray entry first, before any analysis
    o.strict = true;
    o.jobs = 1;
    done = 0;
    CHECK_THROWS_WITH(io::analyze_dataset(io::plan_dataset(tmp.path), o, stub), Contains("l00h07q: entry outside"));
    CHECK(done == 0);
    fs::remove_all(tmp.path / "l00h07q");
    CHECK_THROWS_WITH(io::analyze_dataset(io::plan_dataset(tmp.path), o, stub),
                      Catch::Matchers::Equals("l00h02q (layer 0, query head 2): boom"));

    // a context below the positions: every present head fails, saying why
    o.strict = false;
    o.context = 100;
    o.context_name = "--context";
    auto const low = io::analyze_dataset(io::plan_dataset(tmp.path), o, stub);
    CHECK(low.heads.empty());
    REQUIRE(low.failures.size() == 4);
    CHECK_THAT(low.failures[0].message, Contains("query entry l00h00q: position 456 is not below the context length 100 given by --context"));
}

TEST_CASE("analyze_dataset: a manifest planning no head is refused", "[dataset_writer][io]") {
    temp_dir tmp;
    auto m = loop_dataset(tmp.path, {0});
    m.heads = io::head_sampling{0, 0, qkgeom::layer_eligibility::all_layers};
    fs::remove(tmp.path / "manifest.json");
    io::write_manifest(tmp.path, m);
    CHECK_THROWS_WITH(io::plan_dataset(tmp.path), Contains("no head to analyse: capture.head_count is 0"));
}

TEST_CASE("analyze_dataset: the default analysis is analyze_head of read_capture", "[dataset_writer][io]") {
    temp_dir tmp;
    auto const m = loop_dataset(tmp.path, {1, 3});
    qkgeom::analysis_options a;
    a.diagnostics = false;
    io::dataset_run_options o;
    o.analysis = a;
    o.jobs = 2;
    auto const run = io::analyze_dataset(tmp.path, o);
    REQUIRE(run.heads.size() == 2);
    CHECK(run.missing.size() == 4);
    auto const direct = qkgeom::analyze_head(io::read_capture(tmp.path, m, run.planned[3]), a);
    auto const x = qkgeom::head_metric_values(run.heads[1]), y = qkgeom::head_metric_values(direct);
    for (std::size_t i = 0; i < x.size(); ++i) {
        INFO(qkgeom::head_metric_names[i]);
        CHECK((x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i]))));
    }
}

TEST_CASE("policy names: tables, round trips and messages", "[dataset_writer][policy]") {
    auto round = [](auto tag) {
        using E = decltype(tag);
        std::set<std::string_view> names;
        std::string_view prev;
        for (auto const& [n, e] : qkgeom::policy_choices<E>()) {
            CHECK(qkgeom::policy_from_name<E>(n) == e);
            CHECK(qkgeom::policy_name(e) == n);
            CHECK(prev < n);  // sorted, no duplicates
            prev = n;
            names.insert(n);
        }
        CHECK(!qkgeom::policy_from_name<E>("Dominant"));
        return names.size();
    };
    CHECK(round(qkgeom::sign_policy{}) == 2);
    CHECK(round(qkgeom::separation_policy{}) == 2);
    CHECK(round(qkgeom::semantic_model{}) == 3);
    CHECK(round(qkgeom::pair_policy{}) == 2);
    CHECK(round(qkgeom::ap_weighting{}) == 2);
    CHECK(round(qkgeom::enumeration_policy{}) == 3);
    CHECK(qkgeom::policy_name(qkgeom::enumeration_policy::automatic) == "auto");
    CHECK(qkgeom::policy_choices_text<qkgeom::pair_policy>() == "prefix | same_bucket");
    CHECK_THROWS_WITH(qkgeom::parse_policy<qkgeom::semantic_model>("diagonal", "Options.semantic"),
                      Catch::Matchers::Equals("Options.semantic: 'diagonal' is not one of diag | full | global_linear"));
    CHECK(qkgeom::parse_policy<qkgeom::sign_policy>("query_anchor", "--sign") == qkgeom::sign_policy::query_anchor);
    CHECK(round(qkgeom::rank_key_policy{}) == 2);
    // options_text: every option that changes a result changes the text
    // (it is a study's cache key); the speed-only ones do not.
    qkgeom::analysis_options const base;
    std::string const t0 = qkgeom::options_text(base);
    std::vector<std::function<void(qkgeom::analysis_options&)>> const changes{
        [](auto& o) { o.plasticity.split_profile = false; },
        [](auto& o) { o.ranks_on = false; },
        [](auto& o) { o.ranks.keys_per_set = 4; },
        [](auto& o) { o.ranks.sets_per_bucket = 3; },
        [](auto& o) { o.ranks.lattice_points = 2; },
        [](auto& o) { o.ranks.lattice_shifts = 3; },
        [](auto& o) { o.ranks.keys = qkgeom::rank_key_policy::same_bucket; },
        [](auto& o) { o.ranks.seed = 1; },
        [](auto& o) { o.rope.n_bands = 4; },
        [](auto& o) { o.rope.min_angle_span = 1.0; },
        [](auto& o) { o.rope.min_energy_z = 5.0; },
        [](auto& o) { o.rope.consistent_above = 0.9; },
        [](auto& o) { o.rope.inconsistent_below = 0.4; },
        [](auto& o) { o.rope.min_bucket_rows = 3; },
        [](auto& o) { o.rope.max_mirror_ratio = 0.25; },
        [](auto& o) { o.plasticity.seed = 1; },
        [](auto& o) { o.plasticity.empirical_check = qkgeom::empirical_policy::exact; },
        [](auto& o) { o.plasticity.empirical_budget = 8192; },
        [](auto& o) { o.plasticity.empirical_max_exact = 1024; }};
    std::set<std::string> texts{t0};
    for (auto const& change : changes) {
        auto o = base;
        change(o);
        CHECK(texts.insert(qkgeom::options_text(o)).second);  // differs from the default and from each other
    }
    auto fast = base;
    fast.ranks.keep_sets = true;
    fast.plasticity.dense_min_keys = 7;
    CHECK(qkgeom::options_text(fast) == t0);
}

TEST_CASE("analyze_dataset: heads read in their stored precision give bit-identical results and the same failures "
          "(issue 18)",
          "[dataset_writer][io]") {
    for (auto t : {io::dtype::f32, io::dtype::f16, io::dtype::bf16, io::dtype::f64}) {
        INFO("vectors " << io::dtype_name(t));
        temp_dir tmp;
        loop_dataset(tmp.path, {0, 1, 2, 4}, t);
        io::dataset_run_options o;
        o.jobs = 2;
        std::atomic<int> f32_heads{0};
        io::head_analyzers const stored{
            [](qkgeom::head_capture<qkgeom::row_matrix> const& h, qkgeom::analysis_options const& a) {
                return qkgeom::analyze_head(h, a);
            },
            [&](qkgeom::head_capture<io::row_matrix_f32> const& h, qkgeom::analysis_options const& a) {
                ++f32_heads;
                return qkgeom::analyze_head(h, a);
            }};
        io::head_analyzer const doubles = [](qkgeom::head_capture<qkgeom::row_matrix> const& h,
                                             qkgeom::analysis_options const& a) { return qkgeom::analyze_head(h, a); };
        auto const a = io::analyze_dataset(io::plan_dataset(tmp.path), o, stored);
        auto const b = io::analyze_dataset(io::plan_dataset(tmp.path), o, doubles);
        CHECK(f32_heads == (t == io::dtype::f64 ? 0 : 4));
        REQUIRE(a.heads.size() == 4);
        REQUIRE(b.heads.size() == 4);
        for (std::size_t i = 0; i < 4; ++i) {
            auto const x = qkgeom::head_metric_values(a.heads[i]), y = qkgeom::head_metric_values(b.heads[i]);
            INFO("head " << i);
            CHECK(std::memcmp(x.data(), y.data(), sizeof x) == 0);  // bit for bit, NaN included
            // the heads were really analysed (20 rows: the closed forms are finite)
            CHECK(a.heads[i].n_q_tokens == 20);
            CHECK(std::count_if(x.begin(), x.end(), [](double v) { return std::isfinite(v); }) >= 20);
        }
        CHECK(a.missing == b.missing);
        // The failures of the override checks name the same entry, position and source.
        o.context = 100;
        o.context_name = "--context";
        auto const la = io::analyze_dataset(io::plan_dataset(tmp.path), o, stored);
        auto const lb = io::analyze_dataset(io::plan_dataset(tmp.path), o, doubles);
        REQUIRE(la.failures.size() == 4);
        REQUIRE(lb.failures.size() == 4);
        for (std::size_t i = 0; i < 4; ++i) CHECK(la.failures[i].message == lb.failures[i].message);
    }
}

}  // namespace qkgeom_tests_dataset_writer_test
