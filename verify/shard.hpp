#pragma once
/// \file shard.hpp
/// Owns sharded generation: which cases of a selection shard I of N computes (`attnref generate
/// --shard I/N`), the shard directory's record (shard.json, schema "attnref.shard" version 1) and
/// its validation when `attnref merge` assembles shards into a suite directory.
///
/// A shard is a subset of the selected cases (whole cases, never parts of one): the assignment is
/// deterministic — longest processing time first over the cases' multiply-add counts, ties broken by
/// suite order, each case to the least-loaded shard (lowest index on ties) — so every process computes
/// the same partition from the suite alone, and shards are balanced within the largest case.
/// A shard directory holds its cases' directories (written exactly as `generate --out` writes them)
/// and shard.json, written last:
///     {"schema": "attnref.shard", "schema_version": 1, "suite_sha256": "<hex>", "selection": [names],
///      "shard": I, "shards": N, "cases": [names of this shard, in suite order]}
/// so a shard without shard.json is incomplete, and merge refuses it.

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include "attnref/golden/manifest.hpp"

namespace attnref::verify {

struct shard_id {
    std::size_t index = 0, count = 1;
};

/// Parses "I/N" (decimal, 0 ≤ I < N ≤ 100000). data_error naming `flag`.
shard_id parse_shard(const std::string& text, const std::string& flag);

/// Multiply-adds of a case in exact arithmetic (a cost estimate for scheduling and sharding).
double case_cost(const golden::case_spec& s);

/// Indices (into `cases`, ascending) of the cases shard `s` computes.
std::vector<std::size_t> shard_cases(const std::vector<golden::case_spec>& cases, shard_id s);

inline constexpr const char* shard_schema = "attnref.shard";
inline constexpr const char* shard_file = "shard.json";

struct shard_record {
    std::string suite_sha256;
    std::vector<std::string> selection;  ///< every selected case, in suite order
    shard_id shard;
    std::vector<std::string> cases;  ///< this shard's cases, in suite order
};

/// shard.json's text (deterministic, final newline).
std::string shard_text(const shard_record& r);
/// Strict reader of a shard directory's shard.json; data_error naming the file and field.
shard_record read_shard(const std::filesystem::path& dir);

}  // namespace attnref::verify
