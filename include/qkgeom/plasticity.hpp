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
// merge_moment_files): #include <qkgeom/moments_io.hpp>.
#pragma once

#include <qkgeom/analyze.hpp>     // IWYU pragma: export
#include <qkgeom/attention_plasticity.hpp>  // IWYU pragma: export
#include <qkgeom/buckets.hpp>     // IWYU pragma: export
#include <qkgeom/config.hpp>      // IWYU pragma: export
#include <qkgeom/errors.hpp>      // IWYU pragma: export
#include <qkgeom/float16.hpp>     // IWYU pragma: export
#include <qkgeom/gaussian.hpp>    // IWYU pragma: export
#include <qkgeom/householder.hpp>  // IWYU pragma: export
#include <qkgeom/moments.hpp>     // IWYU pragma: export
#include <qkgeom/pca.hpp>         // IWYU pragma: export
#include <qkgeom/rotation.hpp>    // IWYU pragma: export
#include <qkgeom/simd.hpp>        // IWYU pragma: export
#include <qkgeom/tensor.hpp>      // IWYU pragma: export
