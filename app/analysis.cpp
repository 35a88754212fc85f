// qkgeom program — analyze_head for the program's row types: heads read
// from a capture (row-major double, or row-major float for f32 / f16 / bf16
// entries) and synthetic heads (Eigen::MatrixXd).
// The engines themselves are instantiated once, in the compiled part the
// program links (qkgeom::compiled, docs/building.md "Compile model").
#include "program.hpp"

#include <qkgeom/io/dataset.hpp>
#include <qkgeom/plasticity.hpp>

namespace qkgeom_app {

qkgeom::head_analysis analyze(qkgeom::head_capture<qkgeom::row_matrix> const& head, qkgeom::analysis_options const& opt) {
    return qkgeom::analyze_head(head, opt);
}

qkgeom::head_analysis analyze(qkgeom::head_capture<Eigen::MatrixXd> const& head, qkgeom::analysis_options const& opt) {
    return qkgeom::analyze_head(head, opt);
}

qkgeom::head_analysis analyze(qkgeom::head_capture<qkgeom::io::row_matrix_f32> const& head,
                              qkgeom::analysis_options const& opt) {
    return qkgeom::analyze_head(head, opt);
}

}  // namespace qkgeom_app
