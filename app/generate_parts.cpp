// qkgeom program — the synthetic generator's rows (make_kind_block) and
// ground truth (make_truth), instantiated once (see generate_parts.hpp).
#include "generate_parts.hpp"

namespace qkgeom::synthetic::detail {

template kind_block make_kind_block<void>(kind_params const&, kept_tokens const&, bucket_table const&,
                                          layer_spec const&, capture_spec const&, Eigen::VectorXd const&,
                                          Eigen::MatrixXd const*, Eigen::VectorXd const&, stream_tag, stream_tag,
                                          std::int64_t);
template head_truth make_truth<void>(layer_spec const&, bucket_table const&, Eigen::MatrixXd const&,
                                     Eigen::VectorXd const&, kind_block const&, kind_block const&, kept_tokens const&,
                                     kept_tokens const&);

}  // namespace qkgeom::synthetic::detail
