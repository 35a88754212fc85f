// qkgeom — the on-disk dataset layout of one model (issue 5, method §0).
//
//   DIR/manifest.json
//   DIR/lLLhHHq/{vectors,position,bucket,example_id[,sliding_window]}.npy   (NumPy form)
//   DIR/lLLhHHk.safetensors  (tensors of the same names)                    (safetensors form)
//   DIR/lLLhHHq.npz          (members vectors.npy, position.npy, ...)        (NumPy archive form)
//
// LL and HH are the zero-padded layer and head (two digits, more when >= 100).
// q entries are indexed by query head, k entries by key (kv) head.
// See docs/dataset.md for the manifest fields and the validation rules.
//
// This header includes the dataset layer by job:
//   <qkgeom/io/manifest.hpp>    manifest.json: parse, write, layout, head plan, merge check
//   <qkgeom/io/head_entry.hpp>  an entry: storage forms, name, the checks it must pass
//   <qkgeom/io/write_head.hpp>  write one entry
//   <qkgeom/io/read_head.hpp>   read one entry, or one head as one value
//   <qkgeom/io/list_heads.hpp>  the entries present in a directory
#pragma once

#include <qkgeom/io/head_entry.hpp>   // IWYU pragma: export
#include <qkgeom/io/list_heads.hpp>   // IWYU pragma: export
#include <qkgeom/io/manifest.hpp>     // IWYU pragma: export
#include <qkgeom/io/read_head.hpp>    // IWYU pragma: export
#include <qkgeom/io/write_head.hpp>   // IWYU pragma: export
