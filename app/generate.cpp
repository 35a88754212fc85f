// qkgeom program — the synthetic generator (qkgeom/capture/synthetic.hpp, method §0),
// instantiated in this translation unit only.
#include "generate_parts.hpp"
#include "program.hpp"

#include <qkgeom/capture/synthetic.hpp>

namespace qkgeom_app {

std::vector<qkgeom::synthetic::head_capture> generate_layer(qkgeom::synthetic::layer_spec const& layer,
                                                            qkgeom::synthetic::capture_spec const& capture) {
    return qkgeom::synthetic::generate_layer(layer, capture);
}

qkgeom::synthetic::head_capture generate_head(qkgeom::synthetic::layer_spec const& layer,
                                              qkgeom::synthetic::capture_spec const& capture, std::int64_t q_head) {
    return qkgeom::synthetic::generate_head(layer, capture, q_head);
}

}  // namespace qkgeom_app
