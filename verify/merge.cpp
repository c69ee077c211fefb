/// `attnref merge`: assembles the shard directories of `generate --shard I/N` into a suite
/// directory, byte-identical to an unsharded `generate` (shard.hpp). Every shard is validated, not
/// trusted: the same suite (sha256 of its file), the same selection and shard count, every shard
/// index exactly once, each shard holding exactly the cases the deterministic assignment gives it,
/// and each case a valid golden case (load_case: strict manifest, sha256 of every file, shapes)
/// whose description equals the suite's and whose manifest is the canonical text. Then every case is
/// re-derived here: generate_case recomputes its inputs from the suite's recipe (or takes a "files"
/// case's inputs, pinned by the sha256 in the suite's description) and re-certifies its reference by
/// the method its manifest names; every file of the shard must equal the re-derived file byte for
/// byte. A checksum the same hand can rewrite proves nothing, so none is trusted: what merge writes
/// is what this machine certified (docs/sharding.md).
#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "commands.hpp"
#include "attnref/golden/case.hpp"
#include "attnref/golden/generate.hpp"
#include "attnref/golden/manifest.hpp"
#include "attnref/golden/safe_io.hpp"
#include "attnref/golden/sha256.hpp"
#include "shard.hpp"

namespace attnref::verify {

using namespace attnref::golden;

namespace fs = std::filesystem;

namespace {

struct merge_args {
    std::string suite = default_suite();
    std::string out;
    std::vector<std::string> shards;
    bool force = false;
    bool quiet = false;
    bool verify = false;  ///< re-derive and compare every case; write nothing
    std::size_t threads = 0;
    std::string max_memory;
};

generated_case read_case_files(const fs::path& dir, const loaded_case& lc);

/// The role of a case file ("query.npy" → "query", "output.float32.npy" → "output").
std::string role_of(const std::string& file) { return file.substr(0, file.find('.')); }

/// Re-derives the case in `dir` (inputs from the recipe, reference re-certified) and compares every
/// file with the shard's; returns the re-derived files' sha256 (in generate_case's order), or throws
/// data_error naming the first file that differs.
std::vector<std::pair<std::string, std::string>> rederive(const fs::path& dir, std::size_t threads) {
    const loaded_case lc = load_case(dir);
    const generated_case shard = read_case_files(dir, lc);
    const certification_method method =
        lc.m.reference.method.rfind(reference_method_mpfi, 0) == 0 ? certification_method::mpfi : certification_method::fast;
    const generated_case g = generate_case(lc.m.spec, threads, {}, method, lc.m.spec.inputs.from_files ? &lc.data : nullptr);
    std::set<std::string> inputs;
    for (const input_tensor_layout& t : input_layout(lc.m.spec)) inputs.insert(std::string(generator::role_name(t.role)));
    for (const case_file& f : g.files) {
        auto it = std::find_if(shard.files.begin(), shard.files.end(), [&](const case_file& x) { return x.name == f.name; });
        if (it == shard.files.end())
            throw data_error((dir / "manifest.json").string() + ": lists no " + f.name + ", which the re-derived case has");
        if (it->bytes != f.bytes) {
            const std::string why = f.name == "manifest.json" ? "not the manifest of the re-derived case"
                                    : inputs.count(role_of(f.name))
                                        ? "not the inputs the suite's recipe generates (re-derived here)"
                                        : "not the certified reference of the suite's case (re-certified here)";
            throw data_error((dir / f.name).string() + ": " + why + "; the shard is refused");
        }
    }
    if (shard.files.size() != g.files.size())
        throw data_error((dir / "manifest.json").string() + ": lists tensors the re-derived case does not have");
    std::vector<std::pair<std::string, std::string>> digests;
    for (const case_file& f : g.files) digests.emplace_back(f.name, sha256_hex(f.bytes));
    return digests;
}

/// The case directory's files as generate_case serialises them: every tensor in manifest order,
/// then manifest.json, each re-hashed after reading (no window between check and use).
generated_case read_case_files(const fs::path& dir, const loaded_case& lc) {
    generated_case g;
    g.m = lc.m;
    auto bytes_of = [&](const std::string& name, std::uintmax_t cap) {
        const std::string text = read_file_capped(dir / name, static_cast<std::size_t>(cap), dir);
        std::vector<std::byte> b(text.size());
        std::transform(text.begin(), text.end(), b.begin(), [](char c) { return static_cast<std::byte>(c); });
        return b;
    };
    for (std::size_t i = 0; i < lc.m.tensors.size(); ++i) {
        const tensor_entry& t = lc.m.tensors[i];
        const std::uintmax_t size = require_regular_file(dir / t.file, (dir / "manifest.json").string(), dir);
        case_file f{t.file, bytes_of(t.file, size)};
        if (sha256_hex(f.bytes) != t.sha256)
            throw data_error((dir / t.file).string() + ": changed while being merged (sha256 does not match manifest.json field 'tensors[" +
                             std::to_string(i) + "].sha256')");
        g.files.push_back(std::move(f));
    }
    const std::vector<std::byte> manifest = bytes_of("manifest.json", max_json_bytes);
    const std::string canonical = manifest_text(lc.m);
    if (manifest.size() != canonical.size() ||
        !std::equal(manifest.begin(), manifest.end(), canonical.begin(), [](std::byte b, char c) { return b == static_cast<std::byte>(c); }))
        throw data_error((dir / "manifest.json").string() + ": not the canonical manifest text that `attnref generate` writes");
    g.files.push_back({"manifest.json", manifest});
    return g;
}

void run_merge(const merge_args& a) {
    if (a.shards.empty()) throw data_error("command line: merge: expected one or more shard directories");
    if (!a.max_memory.empty()) set_max_memory(parse_memory_size(a.max_memory, "--max-memory"));
    const std::string text = read_text(a.suite);
    const std::string digest = sha256_hex(std::as_bytes(std::span(text.data(), text.size())));
    const std::vector<case_spec> suite = parse_suite(text, a.suite);
    fs::path out = a.out;
    if (out.empty()) out = fs::path(a.suite).parent_path();
    if (out.empty()) out = ".";

    std::vector<shard_record> records;
    for (const std::string& dir : a.shards) records.push_back(read_shard(dir));
    const shard_record& first = records.front();
    std::map<std::size_t, std::string> seen;
    for (std::size_t r = 0; r < records.size(); ++r) {
        const std::string file = (fs::path(a.shards[r]) / shard_file).string();
        if (records[r].suite_sha256 != digest)
            throw data_error(file + ": field 'suite_sha256': the shard was generated from another suite than " + a.suite + " (sha256 " +
                             digest + ")");
        if (records[r].shard.count != first.shard.count)
            throw data_error(file + ": field 'shards': " + std::to_string(records[r].shard.count) + ", but " + a.shards[0] + " has " +
                             std::to_string(first.shard.count));
        if (records[r].selection != first.selection)
            throw data_error(file + ": field 'selection': differs from " + a.shards[0] + "'s (shards of different generate runs)");
        const auto [it, inserted] = seen.emplace(records[r].shard.index, a.shards[r]);
        if (!inserted)
            throw data_error(file + ": field 'shard': shard " + std::to_string(records[r].shard.index) + " is also " + it->second);
    }
    for (std::size_t i = 0; i < first.shard.count; ++i)
        if (!seen.count(i))
            throw data_error(fmt::format("command line: merge: shard {} of {} is missing (given: {} shard directories)", i,
                                         first.shard.count, records.size()));
    std::vector<case_spec> selection;
    for (const std::string& name : first.selection) {
        auto it = std::find_if(suite.begin(), suite.end(), [&](const case_spec& s) { return s.name == name; });
        if (it == suite.end())
            throw data_error((fs::path(a.shards[0]) / shard_file).string() + ": field 'selection': no case named '" + printable(name) +
                             "' in " + a.suite);
        selection.push_back(*it);
    }

    // Validate every shard and case before writing anything, so a bad shard leaves --out untouched.
    struct source {
        fs::path dir;
        std::size_t shard;
        const case_spec* spec;
        certification_method method;
        std::vector<std::pair<std::string, std::string>> digests;  ///< of the re-derived files
    };
    std::vector<source> sources;
    for (std::size_t r = 0; r < records.size(); ++r) {
        std::vector<std::string> expected;
        for (std::size_t i : shard_cases(selection, records[r].shard)) expected.push_back(selection[i].name);
        if (records[r].cases != expected)
            throw data_error((fs::path(a.shards[r]) / shard_file).string() + ": field 'cases': not the cases shard " +
                             std::to_string(records[r].shard.index) + " of " + std::to_string(first.shard.count) + " computes");
        for (const std::string& name : records[r].cases) {
            const fs::path dir = fs::path(a.shards[r]) / name;
            const loaded_case lc = load_case(dir);
            const case_spec& want = *std::find_if(selection.begin(), selection.end(), [&](const case_spec& s) { return s.name == name; });
            if (to_json(lc.m.spec) != to_json(want))
                throw data_error((dir / "manifest.json").string() + ": field 'case': differs from the suite's case '" + name + "'");
            (void)read_case_files(dir, lc);  // the canonical manifest text
            sources.push_back({dir, records[r].shard.index, &want,
                               lc.m.reference.method.rfind(reference_method_mpfi, 0) == 0 ? certification_method::mpfi : certification_method::fast,
                               {}});
        }
    }

    // Re-derive every case (inputs from the recipe, reference re-certified) and compare byte for byte:
    // large cases one at a time on every thread, the rest concurrently on one thread each, as generate.
    const std::size_t threads = a.threads ? a.threads : std::max(1u, std::thread::hardware_concurrency());
    for (const source& src : sources)
        check_generate_memory(*src.spec, src.method, threads, (src.dir / "manifest.json").string());
    std::vector<std::string> errors(sources.size());
    std::mutex io;
    std::atomic<bool> failed{false};  // after a refusal no further case is re-derived (the merge is refused anyway)
    auto one = [&](std::size_t k, std::size_t inner) {
        if (failed) return;
        try {
            sources[k].digests = rederive(sources[k].dir, inner);
            if (!a.quiet) {
                const std::lock_guard<std::mutex> lock(io);
                std::fprintf(stderr, "attnref merge: %s (shard %zu): re-derived, identical\n", sources[k].dir.filename().c_str(), sources[k].shard);
            }
        } catch (const std::exception& e) {
            errors[k] = e.what();
            failed = true;
        }
    };
    std::vector<std::size_t> small;
    for (std::size_t k = 0; k < sources.size(); ++k) {
        if (case_cost(*sources[k].spec) > 2e6 && threads > 1) one(k, threads);
        else small.push_back(k);
    }
    std::atomic<std::size_t> next{0};
    std::vector<std::thread> pool;
    for (std::size_t t = 0; t < std::min(threads, small.size()); ++t)
        pool.emplace_back([&] {
            for (std::size_t i = next++; i < small.size(); i = next++) one(small[i], 1);
            thread_cleanup<mpfr_interval<40>>::run();  // MPFR's per-thread constant caches
        });
    for (std::thread& t : pool) t.join();
    // The first failure in shard order (with one bad case, the same whatever the threads' timing).
    for (const std::string& e : errors)
        if (!e.empty()) throw data_error(e);
    if (a.verify) {
        std::printf("verified %zu shard(s), %zu case(s): every file equals the re-derived, re-certified case; nothing written\n",
                    records.size(), selection.size());
        return;
    }

    std::error_code ec;
    fs::create_directories(out, ec);
    if (ec) throw data_error(out.string() + ": cannot create the directory: " + ec.message());
    const directory_lock lock(out);
    std::size_t conflicts = 0;
    std::string first_conflict;
    for (const source& src : sources) {
        const std::string name = src.dir.filename().string();
        const generated_case g = read_case_files(src.dir, load_case(src.dir));  // re-read and re-hashed: what is written
        // What is written is what was re-derived: a file changed since then is refused.
        for (std::size_t f = 0; f < g.files.size(); ++f)
            if (f >= src.digests.size() || g.files[f].name != src.digests[f].first || sha256_hex(g.files[f].bytes) != src.digests[f].second)
                throw data_error((src.dir / g.files[f].name).string() + ": changed while being merged (no longer the re-derived file)");
        const comparison c = compare_case(out / name, g);
        std::string status;
        if (!c.exists) {
            write_case(out / name, g);
            status = "written";
        } else if (c.identical) {
            status = "unchanged";
        } else if (a.force) {
            write_case(out / name, g);
            status = "overwritten";
        } else {
            status = "CONFLICT";
            if (conflicts++ == 0) first_conflict = (out / name).string() + " (" + c.first_difference + ")";
        }
        if (!a.quiet) std::fprintf(stderr, "attnref merge: %s (shard %zu): %s\n", name.c_str(), src.shard, status.c_str());
    }
    std::printf("merged %zu shard(s), %zu case(s) into %s\n", records.size(), selection.size(), out.string().c_str());
    if (conflicts)
        throw data_error(fmt::format("{} existing case(s) differ from the shards', first {}; not overwritten, use --force", conflicts,
                                     first_conflict));
}

}  // namespace

void register_merge(CLI::App& app) {
    auto a = std::make_shared<merge_args>();
    CLI::App* m = app.add_subcommand("merge", "Assemble the shard directories of `generate --shard I/N` into a suite directory");
    m->add_option("shards", a->shards, "shard directories (all N of them)")->required();
    m->add_option("--suite", a->suite, "the suite the shards were generated from")->capture_default_str();
    m->add_option("--out", a->out, "output directory (default: the suite file's directory)");
    m->add_flag("--force", a->force, "overwrite existing cases whose content differs");
    m->add_flag("--quiet", a->quiet, "no progress lines on stderr");
    m->add_flag("--verify", a->verify, "validate and re-derive every case as merge does, then stop: write nothing");
    m->add_option("--threads", a->threads, "threads for re-certifying the cases (0 = all cores); results do not depend on it")
        ->check(unsigned_text())->capture_default_str();
    m->add_option("--max-memory", a->max_memory,
                  "refuse cases whose re-certification is estimated to need more memory (bytes, K/M/G/T suffix; default: half the machine's memory, at least 4G)");
    m->callback([a] { run_merge(*a); });
}

}  // namespace attnref::verify
