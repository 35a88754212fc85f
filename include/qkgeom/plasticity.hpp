// qkgeom — the one include a researcher needs to analyse a head.
//
// Umbrella header: brings in the tensor concepts (any tensor type), the
// streaming moment accumulator (method §1), the geometry of method §2–4
// (PCA, planar rotation, Householder decomposition), attention plasticity
// (method §5–6), and `analyze_head` / `summarise_model`, which run
// everything for a head and aggregate heads into a model report.
//
// Not included, to keep the umbrella cheap to compile: the shard files of
// head_moments (save_moments, load_moments, read_moments, write_moments,
// merge_moment_files): #include <qkgeom/io/moments_io.hpp>.
#pragma once

#include <qkgeom/analysis/analyze.hpp>          // IWYU pragma: export
#include <qkgeom/analysis/model.hpp>            // IWYU pragma: export
#include <qkgeom/core/buckets.hpp>              // IWYU pragma: export
#include <qkgeom/core/config.hpp>               // IWYU pragma: export
#include <qkgeom/core/errors.hpp>               // IWYU pragma: export
#include <qkgeom/core/float16.hpp>              // IWYU pragma: export
#include <qkgeom/core/tensor.hpp>               // IWYU pragma: export
#include <qkgeom/geometry/householder.hpp>      // IWYU pragma: export
#include <qkgeom/geometry/pca.hpp>              // IWYU pragma: export
#include <qkgeom/geometry/rotation.hpp>         // IWYU pragma: export
#include <qkgeom/plasticity/attention_plasticity.hpp>  // IWYU pragma: export
#include <qkgeom/simd/dispatch.hpp>             // IWYU pragma: export
#include <qkgeom/stats/gaussian.hpp>            // IWYU pragma: export
#include <qkgeom/stats/moments.hpp>             // IWYU pragma: export
