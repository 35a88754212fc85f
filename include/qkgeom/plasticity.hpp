// qkgeom — the one include a researcher needs to analyse a head.
//
// Umbrella header: brings in the tensor concepts (any tensor type), the
// streaming moment accumulator (SPEC §1) and its shard serialisation. The
// geometry (SPEC §2–4) and plasticity (SPEC §5–6) analyses are added here as
// they land.
#pragma once

#include <qkgeom/config.hpp>      // IWYU pragma: export
#include <qkgeom/errors.hpp>      // IWYU pragma: export
#include <qkgeom/float16.hpp>     // IWYU pragma: export
#include <qkgeom/moments.hpp>     // IWYU pragma: export
#include <qkgeom/moments_io.hpp>  // IWYU pragma: export
#include <qkgeom/tensor.hpp>      // IWYU pragma: export
