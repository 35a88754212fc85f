// qkgeom — the one include a researcher needs to analyse a head.
//
// Umbrella header: brings in the tensor concepts (any tensor type), the
// streaming moment accumulator (SPEC §1) and its shard serialisation, and the
// geometry of SPEC §2–4 (PCA, planar rotation, Householder decomposition).
// The plasticity analyses (SPEC §5–6) are added here as they land.
#pragma once

#include <qkgeom/config.hpp>      // IWYU pragma: export
#include <qkgeom/errors.hpp>      // IWYU pragma: export
#include <qkgeom/float16.hpp>     // IWYU pragma: export
#include <qkgeom/householder.hpp>  // IWYU pragma: export
#include <qkgeom/moments.hpp>     // IWYU pragma: export
#include <qkgeom/moments_io.hpp>  // IWYU pragma: export
#include <qkgeom/pca.hpp>         // IWYU pragma: export
#include <qkgeom/rotation.hpp>    // IWYU pragma: export
#include <qkgeom/tensor.hpp>      // IWYU pragma: export
