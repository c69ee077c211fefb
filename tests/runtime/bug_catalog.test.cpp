// The bug catalog × every committed golden case × candidate formats float64, float32, bfloat16 and
// float16, judged by the checker's own code (golden::judge_output under the default data-aware
// bound): no wrong implementation may PASS unless it is provably undetectable in that format.
//
// Each wrong implementation is computed through attnref's templates in the format's precision
// policy (uniform_precision<double>, uniform_precision<float>, bf16 or fp16 storage with fp32
// accumulation — the policies `attnref run` calls float64, float32, bf16_fp32acc, fp16_fp32acc),
// the bug injected into the case's conventions or data; "softmax over the wrong axis" is written
// out below in the policy's accumulation type, from inputs rounded to its storage format.
//
// A cell (bug, case, format) is
//   fail          the checker says FAIL;
//   inconclusive  it says INCONCLUSIVE (a vacuous bound, a decoy that would pass) or untrustworthy;
//   undetectable  it says PASS and the wrong output passes FlashAttention's own acceptance rule
//                 against attnref's correct implementations in the same policy (the shifted,
//                 online with 16-key blocks, and division-free softmax): max|w − e| ≤ 2·max|c − e| +
//                 2·max|fl(fl(e + 0.3) − 0.3) − e| (FA3's tests; tolerance::baseline_bound) for one of
//                 them, e the certified reference. Such a wrong output is as close to the exact
//                 result as the practice of the field requires of a correct kernel in that format;
//                 no checker can reject it without rejecting correct kernels FlashAttention accepts;
//   pass          anything else: a wrong implementation that passes although it is detectably
//                 worse than correct ones. The test asserts there is none.
// "One row off by 0.1%" applies only to a row where 0.1% is ≥ 100× attnref's own error in the
// format and the format's unit roundoff is ≤ 1e-5 (float32, float64): below that, a 0.1% change is
// within the format's resolution (bf16 and fp16 hold 3–4 significant digits).
// The matrix counts are printed (--log_level=message).
#define BOOST_TEST_MODULE bug_catalog
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "attnref/core/formats.hpp"
#include "attnref/bounds/tolerance.hpp"
#include "attnref/golden/check.hpp"
#include "attnref/golden/case.hpp"

namespace fs = std::filesystem;
namespace tol = attnref::tolerance;
using namespace attnref;
using namespace attnref::golden;
using F = tol::candidate_format;

namespace {

const fs::path golden_dir = fs::path(ATTNREF_SOURCE_DIR) / "golden";

using bf16_policy = precision_policy<formats::bfloat16, float, formats::bfloat16, formats::bfloat16>;
using fp16_policy = precision_policy<formats::float16, float, formats::float16, formats::float16>;

template <class T>
std::vector<double> flat(const T& t) {
    std::vector<double> r(t.size());
    for (std::size_t n = 0; n < t.size(); ++n) r[n] = static_cast<double>(t[n]);
    return r;
}

/// The case's output computed by attnref in format f's policy.
std::vector<double> run_in(F f, const case_spec& s, const case_data& d, softmax_algorithm a = softmax_algorithm::shifted_division,
                           std::size_t block = 64) {
    case_spec spec = s;
    spec.outputs.weights = spec.outputs.lse = false;
    switch (f) {
        case F::float64: return flat(compute_case<uniform_precision<double>>(spec, d, 1, a, block).output);
        case F::float32: return flat(compute_case<uniform_precision<float>>(spec, d, 1, a, block).output);
        case F::bfloat16: return flat(compute_case<bf16_policy>(spec, d, 1, a, block).output);
        case F::float16: return flat(compute_case<fp16_policy>(spec, d, 1, a, block).output);
    }
    return {};
}

struct golden_case {
    fs::path dir;
    loaded_case lc;
    std::vector<double> expected;
    tol::data_aware_scales scales;
    std::size_t row = 0;  // output row length
};

golden_case load(const fs::path& dir) {
    golden_case g{dir, load_case(dir), {}, {}, 0};
    for (const tensor_entry& t : g.lc.m.tensors)
        if (t.role == "output" && !t.target) g.expected = npy::to_double(npy::read(dir / t.file));
    g.scales = data_aware_scales_for(g.lc.m.spec, g.lc.data, reference_weights(g.lc));
    g.row = output_shape(g.lc.m.spec).back();
    return g;
}

/// Rows (b, h, i) of the case whose keys are all structurally masked.
bool has_empty_rows(const case_spec& s, const case_data& d) {
    const attention_options o = options_for(s, d, 1, softmax_algorithm::shifted_division, 64);
    const case_shapes& z = s.shapes;
    for (std::size_t b = 0; b < z.batch; ++b)
        for (std::size_t h = 0; h < z.heads; ++h)
            for (std::size_t i = 0; i < z.query_length; ++i)
                if (attnref::row_is_empty(o.mask, b, h, i, z.query_length, z.key_length)) return true;
    return false;
}

/// Copies the per-head blocks of a (B, H, …) array: block hp of the result is block pi(hp) of x.
template <class V>
V permute_heads(const V& x, std::size_t batch, std::size_t heads, std::size_t per_head, const std::function<std::size_t(std::size_t)>& pi) {
    if (x.empty()) return x;
    V r(x.size());
    for (std::size_t b = 0; b < batch; ++b)
        for (std::size_t hp = 0; hp < heads; ++hp)
            std::copy_n(&x[(b * heads + pi(hp)) * per_head], per_head, &r[(b * heads + hp) * per_head]);
    return r;
}

/// Softmax over the query axis instead of the key axis (SDPA): logits through attnref's
/// attention_logits in T from inputs rounded to f, the rest in T, the output rounded to f.
template <class T>
std::vector<double> softmax_over_queries(F f, const case_spec& s, const case_data& d) {
    const case_shapes& z = s.shapes;
    auto rounded = [&](const std::vector<double>& x) {
        std::vector<T> r(x.size());
        for (std::size_t n = 0; n < x.size(); ++n) r[n] = static_cast<T>(tol::round_to(f, x[n]));
        return r;
    };
    const std::vector<T> q = rounded(d.query), k = rounded(d.key), v = rounded(d.value);
    const attention_options o = options_for(s, d, 1, softmax_algorithm::shifted_division, 64);
    const auto S = attention_logits<uniform_precision<T>>(tensor_view<const T, 4>{q.data(), {z.batch, z.heads, z.query_length, z.head_dim_qk}},
                                                          tensor_view<const T, 4>{k.data(), {z.batch, z.kv_heads, z.key_length, z.head_dim_qk}}, o);
    const std::size_t G = z.heads / z.kv_heads;
    std::vector<T> out(z.batch * z.heads * z.query_length * z.head_dim_v, T(0));
    for (std::size_t b = 0; b < z.batch; ++b)
        for (std::size_t h = 0; h < z.heads; ++h)
            for (std::size_t j = 0; j < z.key_length; ++j) {
                T mx = -std::numeric_limits<T>::infinity(), sum = 0;
                for (std::size_t i = 0; i < z.query_length; ++i) mx = std::max(mx, S(b, h, i, j));
                if (!(mx > -std::numeric_limits<T>::infinity())) continue;  // a key no query sees
                for (std::size_t i = 0; i < z.query_length; ++i) sum += std::exp(S(b, h, i, j) - mx);
                for (std::size_t i = 0; i < z.query_length; ++i)
                    for (std::size_t c = 0; c < z.head_dim_v; ++c)
                        out[((b * z.heads + h) * z.query_length + i) * z.head_dim_v + c] +=
                            std::exp(S(b, h, i, j) - mx) / sum * v[((b * z.kv_heads + h / G) * z.key_length + j) * z.head_dim_v + c];
            }
    std::vector<double> r(out.size());
    for (std::size_t n = 0; n < r.size(); ++n) r[n] = tol::round_to(f, static_cast<double>(out[n]));
    return r;
}

/// One wrong implementation: its output in format f on the case, or nullopt where the bug does not
/// apply (it would compute the correct result, or the case lacks the feature).
struct bug {
    const char* name;
    std::function<std::optional<std::vector<double>>(const golden_case&, F)> apply;
};

std::vector<bug> catalog() {
    auto mutated = [](auto&& change) {
        return [change](const golden_case& g, F f) -> std::optional<std::vector<double>> {
            case_spec s = g.lc.m.spec;
            case_data d = g.lc.data;
            if (!change(s, d)) return std::nullopt;
            return run_in(f, s, d);
        };
    };
    std::vector<bug> r;
    r.push_back({"missing scale", mutated([](case_spec& s, case_data&) {
                     if (s.conventions.scale == 1.0) return false;
                     s.conventions.scale = 1.0;
                     return true;
                 })});
    r.push_back({"scale 1/d instead of 1/sqrt(d)", mutated([](case_spec& s, case_data&) {
                     if (s.conventions.scale || s.shapes.head_dim_qk == 1) return false;
                     s.conventions.scale = 1.0 / static_cast<double>(s.shapes.head_dim_qk);
                     return true;
                 })});
    r.push_back({"uniform weights (mean of V)", mutated([](case_spec& s, case_data& d) {
                     // Every logit 0: q (or W_q, b_q) zeroed, no ALiBi, additive masks keep only their
                     // −inf; the structural masks and the seed mask's −1e9 still mask.
                     if (s.kind == case_kind::sdpa) std::fill(d.query.begin(), d.query.end(), 0.0);
                     else std::fill(d.w_q.begin(), d.w_q.end(), 0.0), std::fill(d.b_q.begin(), d.b_q.end(), 0.0);
                     s.conventions.alibi_slopes.clear();
                     for (double& x : d.additive_mask)
                         if (std::isfinite(x)) x = 0;
                     return true;
                 })});
    r.push_back({"flipped mask polarity", mutated([](case_spec& s, case_data&) {
                     if (!s.conventions.boolean_mask) return false;
                     s.conventions.polarity = s.conventions.polarity == mask_polarity::true_means_attend ? mask_polarity::true_means_masked
                                                                                                          : mask_polarity::true_means_attend;
                     return true;
                 })});
    r.push_back({"top-left vs bottom-right", mutated([](case_spec& s, case_data&) {
                     if (!(s.conventions.causal || s.conventions.window) || s.shapes.query_length == s.shapes.key_length) return false;
                     s.conventions.alignment = s.conventions.alignment == causal_alignment::top_left ? causal_alignment::bottom_right
                                                                                                     : causal_alignment::top_left;
                     return true;
                 })});
    r.push_back({"softmax over the wrong axis", [](const golden_case& g, F f) -> std::optional<std::vector<double>> {
                     const case_spec& s = g.lc.m.spec;
                     // SDPA cases with more than one query and no per-key-row conventions this
                     // hand-written kernel would have to repeat (softcap, ALiBi, additive/seed masks).
                     if (s.kind != case_kind::sdpa || s.shapes.query_length < 2 || s.conventions.softcap || !s.conventions.alibi_slopes.empty() ||
                         s.conventions.additive_mask || s.conventions.seed_mask)
                         return std::nullopt;
                     return f == F::float64 ? softmax_over_queries<double>(f, s, g.lc.data) : softmax_over_queries<float>(f, s, g.lc.data);
                 }});
    r.push_back({"heads merged in the wrong order", mutated([](case_spec& s, case_data& d) {
                     // (c, h) instead of (h, c): the same as permuting W_o's rows.
                     const std::size_t H = s.shapes.heads, dv = s.shapes.head_dim_v, E = s.shapes.output_dim;
                     if (s.kind != case_kind::mha || H < 2 || dv < 2) return false;
                     std::vector<double> w = d.w_o;
                     for (std::size_t h = 0; h < H; ++h)
                         for (std::size_t c = 0; c < dv; ++c)
                             for (std::size_t e = 0; e < E; ++e) w[(h * dv + c) * E + e] = d.w_o[(c * H + h) * E + e];
                     d.w_o = w;
                     return true;
                 })});
    r.push_back({"transposed projection", mutated([](case_spec& s, case_data& d) {
                     const std::size_t E = s.shapes.model_dim;  // W_q is E × H·dk: square ones only
                     if (s.kind != case_kind::mha || E != s.shapes.heads * s.shapes.head_dim_qk) return false;
                     std::vector<double> w = d.w_q;
                     for (std::size_t r0 = 0; r0 < E; ++r0)
                         for (std::size_t c = 0; c < E; ++c) w[r0 * E + c] = d.w_q[c * E + r0];
                     d.w_q = w;
                     return true;
                 })});
    r.push_back({"interleaved GQA", [](const golden_case& g, F f) -> std::optional<std::vector<double>> {
                     // Query head h reads kv head h % Hkv instead of h / G. The correct (blocked) code
                     // runs on query heads permuted by pi(hp) = (hp % G)·Hkv + hp / G (then kv head
                     // hp / G = pi(hp) % Hkv), with the per-head masks and slopes permuted alike.
                     const case_spec& s0 = g.lc.m.spec;
                     const case_shapes& z = s0.shapes;
                     const std::size_t H = z.heads, Hkv = z.kv_heads;
                     if (Hkv < 2 || Hkv == H) return std::nullopt;
                     const std::size_t G = H / Hkv;
                     const auto pi = [=](std::size_t hp) { return (hp % G) * Hkv + hp / G; };
                     case_spec s = s0;
                     case_data d = g.lc.data;
                     const std::size_t per_mask = z.query_length * z.key_length;
                     d.mask = permute_heads(d.mask, z.batch, H, per_mask, pi);
                     d.additive_mask = permute_heads(d.additive_mask, z.batch, H, per_mask, pi);
                     d.seed_mask = permute_heads(d.seed_mask, z.batch, H, per_mask, pi);
                     s.conventions.alibi_slopes = permute_heads(s.conventions.alibi_slopes, 1, H, 1, pi);
                     if (s.kind == case_kind::mha) {
                         // W_q's column blocks and b_q's blocks, W_o's row blocks.
                         const std::size_t E = z.model_dim, dk = z.head_dim_qk, dv = z.head_dim_v, Eo = z.output_dim;
                         std::vector<double> wq(d.w_q.size()), wo(d.w_o.size());
                         for (std::size_t e = 0; e < E; ++e)
                             for (std::size_t hp = 0; hp < H; ++hp)
                                 std::copy_n(&g.lc.data.w_q[e * H * dk + pi(hp) * dk], dk, &wq[e * H * dk + hp * dk]);
                         d.w_q = wq;
                         d.b_q = permute_heads(d.b_q, 1, H, dk, pi);
                         for (std::size_t hp = 0; hp < H; ++hp)
                             std::copy_n(&g.lc.data.w_o[pi(hp) * dv * Eo], dv * Eo, &wo[hp * dv * Eo]);
                         d.w_o = wo;
                         return run_in(f, s, d);
                     }
                     d.query = permute_heads(d.query, z.batch, H, z.query_length * z.head_dim_qk, pi);
                     const std::vector<double> o = run_in(f, s, d);
                     std::vector<double> r(o.size());
                     const std::size_t m = z.query_length * z.head_dim_v;
                     for (std::size_t b = 0; b < z.batch; ++b)
                         for (std::size_t hp = 0; hp < H; ++hp) std::copy_n(&o[(b * H + hp) * m], m, &r[(b * H + pi(hp)) * m]);
                     return r;
                 }});
    r.push_back({"wrong empty-row policy", mutated([](case_spec& s, case_data& d) {
                     if (!has_empty_rows(s, d)) return false;
                     s.conventions.empty_rows = s.conventions.empty_rows == empty_row_policy::zero ? empty_row_policy::uniform : empty_row_policy::zero;
                     return true;
                 })});
    r.push_back({"dropped bias", mutated([](case_spec& s, case_data&) {
                     if (s.kind != case_kind::mha || !s.conventions.projection_bias) return false;
                     s.conventions.projection_bias = false;
                     return true;
                 })});
    r.push_back({"one row off by 0.1%", [](const golden_case& g, F f) -> std::optional<std::vector<double>> {
                     // The correct output with one row moved by a factor 1.001 (a wrong constant, a
                     // dropped correction term), rounded to f: the first row with a finite, nonzero
                     // reference where 0.1% is at least 100× the format's own error (attnref's in f):
                     // below that a 0.1% change is within the format's resolution, not a detectable bug.
                     std::vector<double> out = run_in(f, g.lc.m.spec, g.lc.data);
                     for (std::size_t r0 = 0; r0 + g.row <= out.size(); r0 += g.row) {
                         bool usable = true, nonzero = false;
                         double row_max = 0, own = 0;
                         for (std::size_t c = 0; c < g.row; ++c) {
                             const double e = g.expected[r0 + c];
                             usable = usable && std::isfinite(e) && std::isfinite(out[r0 + c]);
                             nonzero = nonzero || e != 0;
                             row_max = std::max(row_max, std::fabs(e));
                             own = std::max(own, std::fabs(out[r0 + c] - e));
                         }
                         if (!usable || !nonzero || own > 1e-5 * row_max || tol::unit_roundoff(f) > 1e-5) continue;
                         for (std::size_t c = 0; c < g.row; ++c) out[r0 + c] = tol::round_to(f, out[r0 + c] * 1.001);
                         return out;
                     }
                     return std::nullopt;
                 }});
    return r;
}

enum class cell { fail, inconclusive, undetectable, pass };

/// FlashAttention's acceptance rule (FA3's tests: max|out − ref| ≤ 2·max|out_pt − ref| + 2·max|(ref +
/// 0.3 − 0.3) − ref| with the ±0.3 in the tested format; tolerance::baseline_bound), with attnref's
/// correct runs as out_pt (the largest of their bounds): the wrong candidate's max|w − e| over that
/// bound. ≤ 1: FlashAttention's own tests would accept the wrong output as correct. +inf where a
/// non-finite value differs from the reference.
double excess_over_own_error(const std::vector<double>& w, const std::vector<double>& e, const std::vector<std::vector<double>>& correct,
                             F f) {
    double wrong = 0, own = 0;
    for (std::size_t n = 0; n < e.size(); ++n) {
        if (!std::isfinite(e[n]) || !std::isfinite(w[n])) {
            if (!(std::isnan(w[n]) && std::isnan(e[n])) && w[n] != e[n]) return HUGE_VAL;  // non-finite values must match
            continue;
        }
        wrong = std::max(wrong, std::fabs(w[n] - e[n]));
    }
    for (const auto& c : correct) own = std::max(own, tol::baseline_bound(e, c, f));
    return wrong == 0 ? 0.0 : wrong / own;
}

struct counts {
    std::array<std::size_t, 4> n{};
};

/// Runs the whole catalog in the given formats over every committed case; returns the counts per
/// (bug, format) and asserts that no cell passes.
void run_matrix(const std::vector<F>& formats) {
    const std::vector<bug> bugs = catalog();
    std::map<std::pair<std::size_t, F>, counts> m;
    std::size_t correct_pass = 0;
    std::string inconclusive_cases;
    std::vector<fs::path> cases;
    for (const auto& e : fs::directory_iterator(golden_dir))
        if (e.is_directory() && fs::exists(e.path() / "manifest.json")) cases.push_back(e.path());
    std::sort(cases.begin(), cases.end());
    BOOST_REQUIRE_GE(cases.size(), 40u);
    for (const fs::path& dir : cases) {
        const golden_case g = load(dir);
        const case_spec& s = g.lc.m.spec;
        const std::vector<decoy> decoys = decoy_outputs(s, g.lc.data);
        for (const F f : formats) {
            const std::vector<double> bounds = tol::element_bounds(g.scales, f);
            const std::vector<std::vector<double>> correct = {run_in(f, s, g.lc.data), run_in(f, s, g.lc.data, softmax_algorithm::online, 16),
                                                              run_in(f, s, g.lc.data, softmax_algorithm::division_free)};
            // attnref's own correct candidate: never FAIL; PASS in float32 and float64 (the verdict
            // must not make the checker useless), INCONCLUSIVE allowed in bf16/fp16 (counted).
            const tensor_report own = judge_output(correct[0], g.expected, f, bounds, g.row, decoys);
            BOOST_TEST((own.verdict != verdict::fail), s.name << " " << tol::format_name(f) << ": " << own.note);
            if (f == F::float64 || f == F::float32) BOOST_TEST((own.verdict == verdict::pass), s.name << " " << tol::format_name(f) << ": " << own.note);
            if (own.verdict == verdict::pass) ++correct_pass;
            else inconclusive_cases += " " + s.name;
            for (std::size_t k = 0; k < bugs.size(); ++k) {
                const std::optional<std::vector<double>> w = bugs[k].apply(g, f);
                if (!w) continue;
                const tensor_report t = judge_output(*w, g.expected, f, bounds, g.row, decoys);
                cell c = t.verdict == verdict::fail ? cell::fail : t.verdict == verdict::pass ? cell::pass : cell::inconclusive;
                const double excess = excess_over_own_error(*w, g.expected, correct, f);
                if (c == cell::pass && excess <= 1) {
                    c = cell::undetectable;
                    BOOST_TEST_MESSAGE("undetectable: " << s.name << " × " << bugs[k].name << " × " << tol::format_name(f) << ": its error is "
                                                        << excess << " of FlashAttention's acceptance bound");
                }
                ++m[{k, f}].n[static_cast<std::size_t>(c)];
                BOOST_TEST((c != cell::pass), s.name << " × " << bugs[k].name << " × " << tol::format_name(f) << ": a wrong implementation "
                                                   << "passes (worst error " << t.cmp.worst_ratio << " of the bound)");
            }
        }
    }
    std::ostringstream out;
    out << "bug catalog × " << cases.size() << " committed cases: fail/inconclusive/undetectable/pass per format\n";
    out << "  " << std::string(34, ' ');
    for (const F f : formats) out << " " << std::setw(16) << tol::format_name(f);
    out << "\n";
    std::array<std::size_t, 4> total{};
    for (std::size_t k = 0; k < bugs.size(); ++k) {
        out << "  " << std::left << std::setw(34) << bugs[k].name << std::right;
        for (const F f : formats) {
            const counts& c = m[{k, f}];
            std::ostringstream cellt;
            cellt << c.n[0] << "/" << c.n[1] << "/" << c.n[2] << "/" << c.n[3];
            out << " " << std::setw(16) << cellt.str();
            for (std::size_t i = 0; i < 4; ++i) total[i] += c.n[i];
        }
        out << "\n";
    }
    out << "  total: " << total[0] << " fail, " << total[1] << " inconclusive, " << total[2] << " undetectable, " << total[3] << " pass";
    out << "\n  attnref's own correct candidates: " << correct_pass << " of " << cases.size() * formats.size() << " PASS"
        << (inconclusive_cases.empty() ? std::string() : "; INCONCLUSIVE (or untrustworthy) on" + inconclusive_cases);
    BOOST_TEST_MESSAGE(out.str());
    BOOST_TEST(total[3] == 0u);
    BOOST_TEST(total[0] + total[1] + total[2] > 0u);
}

}  // namespace

BOOST_AUTO_TEST_CASE(float64_candidates) { run_matrix({F::float64}); }
BOOST_AUTO_TEST_CASE(float32_candidates) { run_matrix({F::float32}); }
BOOST_AUTO_TEST_CASE(bfloat16_candidates) { run_matrix({F::bfloat16}); }
BOOST_AUTO_TEST_CASE(float16_candidates) { run_matrix({F::float16}); }
