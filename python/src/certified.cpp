/// The certified reference for a call: certify.hpp's Ziv ladder over MPFI enclosures computed by
/// attnref's own templates (run.hpp), targets float64. Escalation recomputes only the query rows
/// that hold undecided elements; NaN is accepted only where the mask alone empties a row under
/// empty_row_policy::nan (and in what that row feeds), exactly as `attnref generate` certifies.
#include "attnref/certify.hpp"
#include "attnref/multiprecision.hpp"
#include "core.hpp"
#include "run.hpp"

namespace attnref::python {

namespace {
/// Flags (B, H, Sq): 1 where the row has no attendable key, from the mask data alone (exact).
std::vector<std::uint8_t> empty_rows(const call& c, const attention_options& o) {
    const std::vector<std::size_t> w = c.weights_shape();
    const std::size_t B = w[0], H = w[1], sq = w[2], sk = w[3];
    std::vector<std::uint8_t> empty(B * H * sq, 0);
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t h = 0; h < H; ++h)
            for (std::size_t i = 0; i < sq; ++i) {
                bool any = false;
                for (std::size_t j = 0; j < sk && !any; ++j) any = !structurally_masked(o.mask, b, h, i, j, sq, sk);
                empty[(b * H + h) * sq + i] = any ? 0 : 1;
            }
    return empty;
}
}  // namespace

result compute_certified(const call& c) {
    c.validate();
    const attention_options o = c.conv.options();
    const std::vector<std::size_t> ws = c.weights_shape(), os = c.output_shape();
    const std::size_t B = ws[0], H = ws[1], sq = ws[2], sk = ws[3], width = os.back();
    const std::vector<std::string> names{"output", "weights", "lse"};
    certify::options opts;
    opts.shapes = {os, ws, c.lse_shape()};
    if (c.conv.empty_rows == empty_row_policy::nan) {
        const std::vector<std::uint8_t> empty = empty_rows(c, o);
        std::vector<std::uint8_t> out(B * sq * H * width / (c.kind == call_kind::sdpa ? 1 : H), 0), wt(B * H * sq * sk, 0);
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t h = 0; h < H; ++h)
                for (std::size_t i = 0; i < sq; ++i) {
                    const std::size_t row = (b * H + h) * sq + i;
                    if (!empty[row]) continue;
                    for (std::size_t j = 0; j < sk; ++j) wt[row * sk + j] = 1;
                    // SDPA: the row's output; MHA: every feature of query row (b, i), which reads every head.
                    const std::size_t out_row = c.kind == call_kind::sdpa ? row : b * sq + i;
                    for (std::size_t f = 0; f < width; ++f) out[out_row * width + f] = 1;
                }
        opts.nan_allowed = {std::move(out), std::move(wt), {}};
    }
    // Escalation: an output element of SDPA (b, h, i, ·), a weight (b, h, i, ·) and an lse (b, h, i)
    // belong to row (b, h, i); an MHA output (b, i, ·) to query row (b, i) of every head.
    auto rows_for = [&](const certify::request& req) {
        std::vector<std::uint8_t> rows;
        if (req.pending.empty() || req.pending[0].empty()) return rows;  // first rung: everything
        rows.assign(B * H * sq, 0);
        for (std::size_t t = 0; t < names.size(); ++t)
            for (std::size_t n = 0; n < req.pending[t].size(); ++n) {
                if (!req.pending[t][n]) continue;
                if (t == 0 && c.kind == call_kind::mha) {
                    const std::size_t r = n / width, b = r / sq, i = r % sq;
                    for (std::size_t h = 0; h < H; ++h) rows[(b * H + h) * sq + i] = 1;
                } else {
                    rows[n / (t == 0 ? width : t == 1 ? sk : 1)] = 1;
                }
            }
        return rows;
    };
    const certify::result cert = certify::certify(
        names, {certify::float64_target},
        [&]<unsigned D>(std::integral_constant<unsigned, D>, const certify::request& req) {
            using P = uniform_precision<mpfr_interval<D>>;
            const std::vector<std::uint8_t> rows = rows_for(req);
            outputs_of<P> out = run_call<P, double>(c, true, true, rows);
            return std::vector<std::vector<mpfr_interval<D>>>{std::move(out.output), std::move(out.weights), std::move(out.lse)};
        },
        opts);
    result r;
    r.output = cert.values[0][0];
    r.weights = cert.values[1][0];
    r.lse = cert.values[2][0];
    r.precisions_bits = cert.precisions_bits;
    for (const certify::tensor_report& t : cert.reports)
        r.certifications.push_back({t.tensor, t.elements, t.certified, t.escalated, t.precisions_bits});
    return r;
}

}  // namespace attnref::python
