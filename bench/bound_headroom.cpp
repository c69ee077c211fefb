// Benchmark-style measurement (not a test): how much room a golden case's data-aware output bound
// leaves before `attnref check` could no longer decide with it. For each candidate format (float32
// undeclared; with --policies also the declared bf16_fp32acc and fp16_fp32acc, whose inputs are taken
// as exact in the format, as they are once `check --input-format auto` has rounded them), per output
// row (the last axis):
//   - vacuity headroom: the row's scale max|expected| over the row's largest element bound, i.e. the
//     factor by which every bound could grow before one of the row's bounds is vacuous (< 1: vacuous);
//   - decoy headroom: over the rows where a decoy (check/judgment.hpp: the mean of V, the softmax with
//     the scale ×2 and ×½) is visibly wrong (off by ≥ 2⁻⁷ of the row's scale), the smallest
//     max_e |decoy_e − expected_e| / bound_e: the factor by which the bounds could grow before a
//     visibly wrong decoy row lies within them (< 1: the check already calls the bound vacuous there).
// The bounds are those `attnref check` computes (forward_reference, element_bounds); minimum and
// median over the rows are printed. Usage: bound_headroom CASE_DIR [--policies]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "attnref/check/checker.hpp"
#include "attnref/multiprecision/policies.hpp"

using namespace attnref;
using namespace attnref::golden;
namespace tol = attnref::tolerance;

int main(int argc, char** argv) {
    if (argc < 2 || (argc > 2 && std::strcmp(argv[2], "--policies") != 0)) {
        std::fprintf(stderr, "usage: bound_headroom CASE_DIR [--policies]\n");
        return 2;
    }
    try {
        const loaded_case lc = load_case(argv[1]);
        const tensor_entry* out = lc.entry("output");
        if (!out) throw data_error(std::string(argv[1]) + "/manifest.json: field 'tensors': no tensor with role 'output'");
        const std::size_t row = output_shape(lc.m.spec).back();
        const std::vector<double> expected = lc.reference(*out);
        const std::vector<decoy> decoys = decoy_outputs(lc.m.spec, lc.data);
        struct candidate_kind {
            const char* name;
            tol::candidate_format format;
            bool declared;
        };
        const candidate_kind kinds[] = {{"float32", tol::candidate_format::float32, false},
                                        {"bf16_fp32acc", tol::candidate_format::bfloat16, true},
                                        {"fp16_fp32acc", tol::candidate_format::float16, true}};
        std::printf("case %s: %zu output rows of %zu\n", lc.m.spec.name.c_str(), expected.size() / row, row);
        for (std::size_t k = 0; k < (argc > 2 ? 3u : 1u); ++k) {
            const candidate_kind& c = kinds[k];
            forward_reference ref(lc, c.declared, tol::underflow_terms_for(c.format, c.declared));
            const std::vector<double> bounds =
                c.declared ? tol::element_bounds(ref.scales(), *roundoffs_of_policy(c.name)) : tol::element_bounds(ref.scales(), c.format);
            std::vector<double> vacuity, decoy_room;
            for (std::size_t r0 = 0; r0 < expected.size(); r0 += row) {
                double scale = 0, largest = 0;
                for (std::size_t e = r0; e < r0 + row; ++e) scale = std::max(scale, std::fabs(expected[e])), largest = std::max(largest, bounds[e]);
                vacuity.push_back(scale / largest);
                for (const decoy& d : decoys) {
                    double off = 0, room = 0;
                    for (std::size_t e = r0; e < r0 + row; ++e) {
                        const double diff = std::fabs(d.output[e] - expected[e]);
                        off = std::max(off, diff), room = std::max(room, diff / bounds[e]);
                    }
                    if (off >= 0x1p-7 * scale) decoy_room.push_back(room);
                }
            }
            auto min_median = [](std::vector<double>& v) {
                std::sort(v.begin(), v.end());
                return v.empty() ? std::pair<double, double>{NAN, NAN} : std::pair<double, double>{v.front(), v[v.size() / 2]};
            };
            const auto [vmin, vmed] = min_median(vacuity);
            const auto [dmin, dmed] = min_median(decoy_room);
            std::printf("  %-13s vacuity headroom min %9.3g median %9.3g | decoy headroom min %9.3g median %9.3g (%zu visibly wrong decoy rows)\n",
                        c.name, vmin, vmed, dmin, dmed, decoy_room.size());
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bound_headroom: %s\n", e.what());
        return 1;
    }
    return 0;
}
