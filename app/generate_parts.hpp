// qkgeom program — the synthetic generator's two heaviest parts, declared
// here and instantiated once in generate_parts.cpp (generate.cpp instantiates
// the rest), so that each translation unit stays small.
#pragma once

#include <qkgeom/capture/synthetic.hpp>

namespace qkgeom::synthetic::detail {

extern template kind_block make_kind_block<void>(kind_params const&, kept_tokens const&, bucket_table const&,
                                                 layer_spec const&, capture_spec const&, Eigen::VectorXd const&,
                                                 Eigen::MatrixXd const*, Eigen::VectorXd const&, stream_tag, stream_tag,
                                                 std::int64_t);
extern template head_truth make_truth<void>(layer_spec const&, bucket_table const&, Eigen::MatrixXd const&,
                                            Eigen::VectorXd const&, kind_block const&, kind_block const&,
                                            kept_tokens const&, kept_tokens const&);

}  // namespace qkgeom::synthetic::detail
