// qkgeom tests — the heads the report tests write and read back: two layers
// of a small synthetic GQA model (d = 8, 4 rotary dims, 2 query heads on one
// kv head; 20 sequences of 512 tokens, 8 uniform buckets of 64), analysed
// once. Layer 0 with diagnostics, layer 1 without (its diagnostics are NaN,
// written as `nan`). Each head's facts carry the capture's bucket scheme and
// context length. Shared by csv_test.cpp and study_read_test.cpp.
#pragma once

#include <qkgeom/analysis/analyze.hpp>
#include <qkgeom/capture/synthetic.hpp>

#include <cstdint>
#include <vector>

namespace qkgeom_test {

/// \param[in] model_seed the synthetic model's seed (layer_spec::model_seed).
/// \param[in] capture_seed the capture's seed (capture_spec::seed).
/// \returns the analyses of the 4 heads, layer by layer.
inline std::vector<qkgeom::head_analysis> report_heads(std::uint64_t model_seed, std::uint64_t capture_seed) {
    namespace syn = qkgeom::synthetic;
    std::vector<qkgeom::head_analysis> out;
    for (std::int64_t layer = 0; layer < 2; ++layer) {
        syn::layer_spec L;
        L.d = 8;
        L.rotary_dims = 4;
        L.n_q_heads = 2;
        L.n_kv_heads = 1;
        L.layer = layer;
        L.model_seed = model_seed;
        syn::capture_spec cap;
        cap.n_examples = 20;
        cap.context_length = 512;
        cap.buckets = {qkgeom::bucket_scheme::uniform, 64, 4.0};
        cap.seed = capture_seed;
        qkgeom::analysis_options opt;
        opt.diagnostics = layer == 0;  // layer 1: diagnostics NaN
        for (auto const& c : syn::generate_layer(L, cap)) out.push_back(qkgeom::analyze_head(c, opt));
    }
    return out;
}

}  // namespace qkgeom_test
