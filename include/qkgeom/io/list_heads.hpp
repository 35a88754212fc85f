// qkgeom — the head entries present in a dataset directory, and the entries
// that look like head entries but are not in the manifest's layout.
// docs/dataset.md.
#pragma once

#include <qkgeom/core/head.hpp>
#include <qkgeom/io/head_entry.hpp>
#include <qkgeom/io/manifest.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace qkgeom::io {

namespace detail {

/// Parses a canonical entry name l<LL>h<HH>[qk] (without extension) into
/// id.layer, id.head, id.k; false for any other name.
inline bool parse_entry_name(std::string_view name, entry_id& id) {
    if (name.size() < 7 || name[0] != 'l') return false;
    std::size_t const hpos = name.find('h', 1);
    if (hpos == std::string_view::npos || hpos < 3) return false;
    char const kc = name.back();
    if (kc != 'q' && kc != 'k') return false;
    auto digits = [](std::string_view t, std::int64_t& v) {
        if (t.size() < 2 || t.size() > 9) return false;
        v = 0;
        for (char c : t) {
            if (c < '0' || c > '9') return false;
            v = v * 10 + (c - '0');
        }
        return true;
    };
    if (!digits(name.substr(1, hpos - 1), id.layer) || !digits(name.substr(hpos + 1, name.size() - hpos - 2), id.head))
        return false;
    id.k = kc == 'q' ? kind::query : kind::key;
    return head_entry_name(id.layer, id.head, id.k) == name;  // canonical only
}

}  // namespace detail

/// \brief The head entries present in DIR (names lLLhHH[qk], lLLhHH[qk].safetensors
/// or lLLhHH[qk].npz), sorted by layer, head, kind. Classified by name only,
/// whatever the file type (a directory named l00h01q.npz is listed as the npz
/// form; read_head then says it is a directory). Other names are ignored. An
/// entry present in two forms is listed twice (read_head rejects it).
/// \param[in] dir the dataset directory.
/// \returns the entries found (canonical names only; not checked against a manifest).
/// \throws qkgeom::input_error (source = dir) when the directory cannot be listed.
/// \throws std::filesystem::filesystem_error if iteration or an entry's status
///         fails after the listing has started.
/// \throws std::bad_alloc if the list cannot be allocated.
[[nodiscard]] inline std::vector<entry_id> list_heads(std::filesystem::path const& dir) {
    std::vector<entry_id> out;
    std::error_code ec;
    for (auto const& de : std::filesystem::directory_iterator(dir, ec)) {
        std::string name = de.path().filename().string();
        entry_id id;
        // Classified by name only: an entry of the wrong file type (a directory
        // named lLLhHHq.npz) is listed, and read_head says what is wrong with it.
        if (name.size() > 12 && name.ends_with(".safetensors")) {
            id.format = storage_format::safetensors;
            name.resize(name.size() - 12);
        } else if (name.size() > 4 && name.ends_with(".npz")) {
            id.format = storage_format::npz;
            name.resize(name.size() - 4);
        } else {
            id.format = storage_format::npy;
        }
        if (!detail::parse_entry_name(name, id)) continue;
        out.push_back(id);
    }
    if (ec) qkgeom::detail::fail_input(dir.string(), "directory", dir.string(), "cannot list directory: " + ec.message());
    std::sort(out.begin(), out.end(), [](entry_id const& a, entry_id const& b) {
        if (a.layer != b.layer) return a.layer < b.layer;
        if (a.head != b.head) return a.head < b.head;
        if (a.k != b.k) return a.k < b.k;
        return a.format < b.format;
    });
    return out;
}

/// \brief Directory entries of DIR that look like head entries (a canonical
/// name lLLhHH[qk], bare or ending in .safetensors / .npz, whatever the
/// file type) but lie outside the manifest: layer ≥ n_layers, or head ≥ the
/// layer's n_q_heads (q) / n_kv_heads (k). A program reports these instead
/// of skipping them silently.
/// \param[in] dir the dataset directory.
/// \param[in] m its manifest.
/// \param[in] max_names the most names returned (default 1000); when more
///            entries are stray, one last element "... and N more" follows
///            them. The whole directory is scanned; memory stays bounded by
///            max_names.
/// \returns the file names (no directory), in directory order.
/// \throws qkgeom::input_error (source = dir) when the directory cannot be listed.
/// \throws std::bad_alloc if the list cannot be allocated.
[[nodiscard]] inline std::vector<std::string> stray_entries(std::filesystem::path const& dir, manifest const& m,
                                                            std::size_t max_names = 1000) {
    std::vector<std::string> out;
    std::uint64_t more = 0;
    std::error_code ec;
    std::filesystem::directory_iterator it(dir, ec), end;
    for (; !ec && it != end; it.increment(ec)) {
        std::string const file = it->path().filename().string();
        std::string_view name = file;
        if (name.ends_with(".safetensors")) name.remove_suffix(12);
        else if (name.ends_with(".npz")) name.remove_suffix(4);
        entry_id id;
        if (!detail::parse_entry_name(name, id)) continue;
        bool stray = id.layer >= m.n_layers;
        if (!stray) {
            auto const L = static_cast<std::size_t>(id.layer);
            auto const& counts = id.k == kind::query ? m.n_q_heads : m.n_kv_heads;
            stray = L >= counts.size() || id.head >= counts[L];
        }
        if (!stray) continue;
        if (out.size() < max_names) out.push_back(file);
        else ++more;
    }
    if (ec) qkgeom::detail::fail_input(dir.string(), "directory", dir.string(), "cannot list directory: " + ec.message());
    if (more > 0) out.push_back("... and " + std::to_string(more) + " more");
    return out;
}

}  // namespace qkgeom::io
