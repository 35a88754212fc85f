// qkgeom_py_check — the C++ side of the NumPy / Python cross-checks
// (tests/python/*.py drive it; see tests/python/CMakeLists.txt).
//
//   dump FILE                        every array of an .npy or .npz: key, descr,
//                                    order, shape, then the values in C order
//                                    (floats widened exactly, printed %.17g)
//   list FILE.npz                    the members as the central directory says
//   rewrite IN OUT [stored|deflate] [zip64] [descriptor]
//                                    read IN (.npy or .npz) with qkgeom, write OUT
//   kept SCHEME WIDTH RATE SEED EXAMPLE LAYER q|k LENGTH
//                                    kept_positions (core/buckets.hpp)
//   heads SEED COUNT|all ELIGIBILITY NQ:NKV[:WINDOW] ...
//                                    sample_heads (capture/protocol.hpp), one "layer q k" per line
//   dataset DIR                      read_manifest + list_heads + read_head of every entry
//   sample OUT.npz [stored|deflate] [zip64] [descriptor]
//                                    a small fixed archive (f32 2x3 "a", int64 "b")
//   zlib                             1 when deflate is available, else 0
//
// Exit status 0 on success, 1 on a qkgeom error (message on stderr), 2 on usage.
#include <qkgeom/capture/protocol.hpp>
#include <qkgeom/core/buckets.hpp>
#include <qkgeom/io/dataset.hpp>
#include <qkgeom/io/npy.hpp>
#include <qkgeom/io/npz.hpp>

#include <span>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace io = qkgeom::io;

[[noreturn]] void usage(std::string const& why) {
    std::cerr << "qkgeom_py_check: " << why << "\n";
    std::exit(2);
}

void print_double(double v) { std::printf(" %.17g", v); }

/// Storage index of C-order element c (handles Fortran order of any rank).
std::size_t storage_index(io::npy_array const& a, std::size_t c) {
    if (!a.fortran_order || a.shape.size() < 2) return c;
    std::size_t s = 0, mul = 1, rest = c;
    std::vector<std::size_t> idx(a.shape.size());
    for (std::size_t k = a.shape.size(); k-- > 0;) {
        auto const ext = static_cast<std::size_t>(a.shape[k]);
        idx[k] = rest % ext;
        rest /= ext;
    }
    for (std::size_t k = 0; k < a.shape.size(); ++k) {
        s += idx[k] * mul;
        mul *= static_cast<std::size_t>(a.shape[k]);
    }
    return s;
}

void dump_array(std::string const& key, io::npy_array const& a, std::string const& src) {
    auto const t = io::npy_dtype(a, src);
    std::printf("array %s %s %s %d", key.c_str(), std::string(io::dtype_name(t)).c_str(), a.descr.c_str(),
                a.fortran_order ? 1 : 0);
    std::printf(" shape");
    for (auto d : a.shape) std::printf(" %" PRId64, d);
    std::printf("\nvalues");
    auto const n = static_cast<std::size_t>(a.size());
    for (std::size_t c = 0; c < n; ++c) {
        std::size_t const s = storage_index(a, c);
        if (io::dtype_is_float(t)) {
            print_double(io::detail::load_double(t, a.data.data(), s));
        } else if (t == io::dtype::u64) {
            std::printf(" %" PRIu64, io::detail::load_le(a.data.data() + 8 * s, 8));
        } else {
            std::int64_t v = 0;
            io::detail::load_int(t, a.data.data(), s, v);
            std::printf(" %" PRId64, v);
        }
    }
    std::printf("\n");
}

bool is_npz(std::filesystem::path const& p) { return p.extension() == ".npz"; }

int cmd_dump(std::filesystem::path const& p) {
    if (is_npz(p)) {
        auto const f = io::read_npz(p);
        for (auto const& m : f.members) dump_array(m.key, m.array, p.string() + "[" + m.key + ".npy]");
    } else {
        dump_array(p.stem().string(), io::read_npy(p), p.string());
    }
    return 0;
}

int cmd_list(std::filesystem::path const& p) {
    auto const bytes = io::detail::read_file_bytes(p);
    for (auto const& m : io::list_npz(bytes, p.string()))
        std::printf("member %s method %u zip64 %d descriptor %d size %" PRIu64 " compressed %" PRIu64 " crc %s\n",
                    m.name.c_str(), static_cast<unsigned>(m.method), m.zip64 ? 1 : 0, (m.flags & 8) ? 1 : 0, m.size,
                    m.compressed_size, io::detail::hex32(m.crc32).c_str());
    return 0;
}

int cmd_rewrite(std::filesystem::path const& in, std::filesystem::path const& out, std::vector<std::string> const& opts) {
    io::npz_write_options o;
    for (auto const& s : opts) {
        if (s == "stored") o.compression = io::npz_compression::stored;
        else if (s == "deflate") o.compression = io::npz_compression::deflate;
        else if (s == "zip64") o.force_zip64 = true;
        else if (s == "descriptor") o.data_descriptor = true;
        else usage("rewrite: unknown option '" + s + "'");
    }
    if (is_npz(in) != is_npz(out)) usage("rewrite: IN and OUT must both be .npy or both .npz");
    if (is_npz(in)) io::write_npz(out, io::read_npz(in), o);
    else io::write_npy(out, io::read_npy(in));
    return 0;
}

qkgeom::bucket_scheme scheme_of(std::string_view s) {
    if (s == "uniform") return qkgeom::bucket_scheme::uniform;
    if (s == "log") return qkgeom::bucket_scheme::log;
    if (s == "all") return qkgeom::bucket_scheme::all;
    usage("unknown scheme '" + std::string(s) + "'");
}

int cmd_kept(char** a) {
    qkgeom::bucket_spec const spec{scheme_of(a[0]), std::stoll(a[1]), std::stod(a[2])};
    std::uint64_t const seed = std::stoull(a[3]);
    std::string_view const k = a[6];
    if (k != "q" && k != "k") usage("kind must be q or k");
    auto const kept = qkgeom::kept_positions(spec, seed, std::stoll(a[4]), std::stoll(a[5]),
                                             k == "q" ? qkgeom::kind::query : qkgeom::kind::key, std::stoll(a[7]));
    for (std::size_t i = 0; i < kept.size(); ++i) std::printf(i ? " %" PRId64 : "%" PRId64, kept[i]);
    std::printf("\n");
    return 0;
}

int cmd_heads(int argc, char** a) {
    std::uint64_t const seed = std::stoull(a[0]);
    std::string_view const count = a[1], el = a[2];
    qkgeom::layer_eligibility e{};
    if (el == "full_attention_only") e = qkgeom::layer_eligibility::full_attention_only;
    else if (el == "all_layers") e = qkgeom::layer_eligibility::all_layers;
    else usage("unknown eligibility");
    qkgeom::model_layout m;
    m.head_dim = 1;
    for (int i = 3; i < argc; ++i) {
        std::string s = a[i];
        qkgeom::layer_layout L;
        auto const c1 = s.find(':');
        auto const c2 = s.find(':', c1 + 1);
        L.n_q_heads = std::stoll(s.substr(0, c1));
        L.n_kv_heads = std::stoll(s.substr(c1 + 1, c2 == std::string::npos ? std::string::npos : c2 - c1 - 1));
        if (c2 != std::string::npos) L.sliding_window = std::stoll(s.substr(c2 + 1));
        m.layers.push_back(L);
    }
    auto const heads = count == "all" ? qkgeom::eligible_heads(m, e)
                                      : qkgeom::sample_heads(m, std::stoll(std::string(count)), seed, e);
    for (auto const& h : heads) std::printf("%" PRId64 " %" PRId64 " %" PRId64 "\n", h.layer, h.q_head, h.k_head);
    return 0;
}

int cmd_dataset(std::filesystem::path const& dir) {
    auto const m = io::read_manifest(dir);
    std::printf("manifest %s %" PRId64 " %" PRId64 " %" PRId64 " %s %" PRId64 " %.17g %" PRIu64 "\n", m.model.c_str(),
                m.n_layers, m.head_dim, m.context_length, qkgeom::bucket_scheme_name(m.buckets.scheme), m.buckets.width,
                m.buckets.rate, m.seed);
    std::printf("n_q_heads");
    for (auto h : m.n_q_heads) std::printf(" %" PRId64, h);
    std::printf("\nn_kv_heads");
    for (auto h : m.n_kv_heads) std::printf(" %" PRId64, h);
    std::printf("\nsliding_window");
    if (m.sliding_window.empty()) std::printf(" unrecorded");
    for (auto const& w : m.sliding_window) w ? std::printf(" %" PRId64, *w) : std::printf(" null");
    std::printf("\n");
    if (m.rope)
        std::printf("rope %s %" PRId64 " %.17g %s %.17g\n", qkgeom::rope_pairing_name(m.rope->pairing), m.rope->rotary_dim,
                    m.rope->theta, m.rope->scaling.c_str(), m.rope->scaling_factor);
    if (m.heads) {
        std::printf("heads %s %" PRIu64 " %s\n", m.heads->count ? std::to_string(*m.heads->count).c_str() : "all",
                    m.heads->seed, io::layer_eligibility_name(m.heads->eligibility));
        for (auto const& h : io::sampled_heads(m))
            std::printf("sampled %" PRId64 " %" PRId64 " %" PRId64 "\n", h.layer, h.q_head, h.k_head);
    }
    for (auto const& id : io::list_heads(dir)) {
        auto const e = io::read_head(dir, m, id.layer, id.head, id.k);
        std::printf("entry %" PRId64 " %" PRId64 " %s %s %s %" PRId64 " %" PRId64 " %s\n", e.layer, e.head,
                    qkgeom::kind_name(e.k), io::storage_format_name(id.format), e.dtype.c_str(),
                    static_cast<std::int64_t>(e.vectors.rows()), static_cast<std::int64_t>(e.vectors.cols()),
                    e.sliding_window ? std::to_string(*e.sliding_window).c_str() : "none");
        std::printf("vectors");
        for (qkgeom::index_t i = 0; i < e.vectors.rows(); ++i)
            for (qkgeom::index_t j = 0; j < e.vectors.cols(); ++j) print_double(e.vectors(i, j));
        auto ints = [](char const* name, std::vector<std::int64_t> const& v) {
            std::printf("\n%s", name);
            for (auto x : v) std::printf(" %" PRId64, x);
        };
        ints("position", e.position.values());
        ints("bucket", e.bucket.values());
        ints("example_id", e.example_id.values());
        std::printf("\n");
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) usage("no command (dump, list, rewrite, kept, heads, dataset)");
    std::string_view const cmd = argv[1];
    try {
        if (cmd == "dump" && argc == 3) return cmd_dump(argv[2]);
        if (cmd == "list" && argc == 3) return cmd_list(argv[2]);
        if (cmd == "rewrite" && argc >= 4) return cmd_rewrite(argv[2], argv[3], std::vector<std::string>(argv + 4, argv + argc));
        if (cmd == "kept" && argc == 10) return cmd_kept(argv + 2);
        if (cmd == "heads" && argc >= 6) return cmd_heads(argc - 2, argv + 2);
        if (cmd == "dataset" && argc == 3) return cmd_dataset(argv[2]);
        if (cmd == "sample" && argc >= 3) {
            io::npz_file f;
            std::vector<float> const a{1.5f, -2.0f, 3.25f, 4.0f, 0.0f, -0.5f};
            std::vector<std::int64_t> const b{0, 1, 4, 9, 16, 25, 36, 49};
            f.add("a", io::make_npy(std::span<float const>(a), {2, 3}));
            f.add("b", io::make_npy(std::span<std::int64_t const>(b), {8}));
            std::filesystem::path const out = argv[2];
            std::filesystem::path const tmp = out.parent_path() / ("stored_" + out.filename().string());
            io::write_npz(tmp, f);
            return cmd_rewrite(tmp, out, std::vector<std::string>(argv + 3, argv + argc));
        }
        if (cmd == "zlib" && argc == 2) {
            std::printf("%d\n", io::npz_deflate_available() ? 1 : 0);
            return 0;
        }
    } catch (std::exception const& e) {
        std::cerr << "qkgeom_py_check: " << e.what() << "\n";
        return 1;
    }
    usage("bad command or argument count: " + std::string(cmd));
}
