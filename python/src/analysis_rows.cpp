// qkgeom Python extension — analyze_head over zero-copy NumPy rows: the one
// instantiation per entry point (the engines themselves come from the
// compiled part, qkgeom::compiled).
#include "common.hpp"

#include <qkgeom/plasticity.hpp>

namespace qkgeom_py {

qkgeom::head_analysis analyze_rows(qkgeom::head_capture<array_rows, array_rows> const& head,
                                   qkgeom::analysis_options const& opt) {
    return qkgeom::analyze_head(head, opt);
}

qkgeom::head_analysis analyze_moment_rows(qkgeom::head_moments const& hm, qkgeom::token_rows<array_rows> const& keys,
                                          qkgeom::capture_facts const& facts, qkgeom::analysis_options const& opt) {
    return qkgeom::analyze_head(hm, keys, facts, opt);
}

}  // namespace qkgeom_py
