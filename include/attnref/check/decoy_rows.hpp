#pragma once
/// \file check/decoy_rows.hpp
/// The decoy rule (check/judgment.hpp: passing_decoy) computed only as far as it needs: a decoy
/// passes only when every element of it lies within its bound, so its output rows are computed a
/// few at a time (a sample spread over the tensor first, then the rest in growing chunks) and the
/// decoy is dropped at its first row with an element outside its bound. A row is computed exactly
/// as the whole forward pass computes it (attention_options::rows, linear_into's row filter: each
/// row is independent), so the verdict is the one judge_with_decoys gives. Multi-head decoys share
/// the key and value projections (no decoy changes them) and, but for the uniform one, the query
/// projection; the uniform decoy's query projection (W_q = b_q = 0) is +0 without a product when
/// the query inputs are finite.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "attnref/core/attention.hpp"
#include "attnref/core/multi_head_attention.hpp"
#include "attnref/core/precision.hpp"
#include "attnref/bounds/tolerance.hpp"
#include "attnref/check/judgment.hpp"

namespace attnref::golden {

namespace decoy_detail {

/// The projections of a multi-head problem in head layout (B, heads, S, d), computed as
/// multi_head_attention_into computes them in double.
struct head_projection {
    tensor<double, 4> h;
    const double* w = nullptr;  // the weights and bias it was computed from
    const double* b = nullptr;
};

inline bool all_zero(tensor_view<const double, 2> w) {
    for (std::size_t n = 0; n < w.size(); ++n)
        if (w.data[n] != 0 || std::signbit(w.data[n])) return false;
    return true;
}

/// x·W + b in double split into `heads`: linear_into sums from +0 over the input features and adds
/// the bias. With W and b all +0 and x finite every product is ±0 and every sum +0, so the result
/// is +0 throughout: returned without the products.
inline tensor<double, 4> project(tensor_view<const double, 3> x, tensor_view<const double, 2> w, tensor_view<const double, 1> b,
                                 std::size_t heads, std::size_t threads, const char* name) {
    using pol = uniform_precision<double>;
    tensor<double, 3> y({x.extents[0], x.extents[1], w.extents[1]});
    bool zero = all_zero(w);
    for (std::size_t n = 0; zero && n < b.size(); ++n) zero = b.data[n] == 0 && !std::signbit(b.data[n]);
    for (std::size_t n = 0; zero && n < x.size(); ++n) zero = std::isfinite(x.data[n]);
    if (!zero) linear_into<pol>(x, w, b, y.view(), threads, name);  // else y is +0 already
    return split_heads<double>(y.view(), heads);
}

/// Computes a problem's output rows on request. Rows: the output's rows of `row` elements in C
/// order ((B, Sq) for multi-head attention, (B, H, Sq) for SDPA), each computed once.
class row_forward {
public:
    row_forward(const forward_problem& p, std::deque<head_projection>& shared) : p_(p) {
        if (p.sdpa) {
            out_.assign(p.q.extents[0] * p.q.extents[1] * p.q.extents[2] * p.v.extents[3], 0.0);
            return;
        }
        d_ = mha_dims_of(p.x_q, p.x_k, p.x_v, p.w, p.mo);
        const std::size_t threads = p.mo.attention.threads;
        auto find = [&](tensor_view<const double, 3> x, tensor_view<const double, 2> w, tensor_view<const double, 1> b, std::size_t heads,
                        const char* name) -> const tensor<double, 4>& {
            for (const head_projection& s : shared)
                if (s.w == w.data && s.b == b.data && s.h.extents()[1] == heads && s.h.extents()[2] == x.extents[1]) return s.h;
            shared.push_back({project(x, w, b, heads, threads, name), w.data, b.data});
            return shared.back().h;
        };
        // (input data differ only with the weights: every decoy keeps x_q, x_k and x_v)
        qh_ = &find(p.x_q, p.w.w_q, p.w.b_q, d_.heads, "w_q");
        kh_ = &find(p.x_k, p.w.w_k, p.w.b_k, d_.kv_heads, "w_k");
        vh_ = &find(p.x_v, p.w.w_v, p.w.b_v, d_.kv_heads, "w_v");
        heads_out_ = tensor<double, 4>({d_.batch, d_.heads, d_.query_length, d_.head_dim_v});
        out_.assign(d_.batch * d_.query_length * d_.output_dim, 0.0);
    }

    /// Computes the rows flagged in `rows` (one flag per output row).
    void compute(std::span<const std::uint8_t> rows) {
        using pol = uniform_precision<double>;
        if (p_.sdpa) {
            attention_options o = p_.o;
            o.rows = rows;
            scaled_dot_product_attention_into<pol>(p_.q, p_.k, p_.v, o, tensor_view<double, 4>{out_.data(), {p_.q.extents[0], p_.q.extents[1], p_.q.extents[2], p_.v.extents[3]}},
                                                   tensor_view<double, 4>{}, tensor_view<double, 3>{});
            return;
        }
        // Query row (b, i) needs every head's row i (multi_head_attention_into with attention rows).
        std::vector<std::uint8_t> head_rows(d_.batch * d_.heads * d_.query_length, 0);
        for (std::size_t b = 0; b < d_.batch; ++b)
            for (std::size_t h = 0; h < d_.heads; ++h)
                for (std::size_t i = 0; i < d_.query_length; ++i) head_rows[(b * d_.heads + h) * d_.query_length + i] = rows[b * d_.query_length + i];
        attention_options ao = p_.mo.attention;
        ao.rows = head_rows;
        scaled_dot_product_attention_into<pol>(tensor_view<const double, 4>(qh_->view()), tensor_view<const double, 4>(kh_->view()),
                                               tensor_view<const double, 4>(vh_->view()), ao, heads_out_.view(), tensor_view<double, 4>{},
                                               tensor_view<double, 3>{});
        const tensor<double, 3> merged = merge_heads<double>(heads_out_.view());
        linear_into<pol>(merged.view(), p_.w.w_o, p_.w.b_o, tensor_view<double, 3>{out_.data(), {d_.batch, d_.query_length, d_.output_dim}},
                         ao.threads, "w_o", rows);
    }
    std::vector<double>& output() { return out_; }

private:
    const forward_problem& p_;
    mha_dims d_{};
    const tensor<double, 4>*qh_ = nullptr, *kh_ = nullptr, *vh_ = nullptr;
    tensor<double, 4> heads_out_;
    std::vector<double> out_;
};

}  // namespace decoy_detail

/// judge_with_decoys (check/judgment.hpp) with the decoys computed row by row as far as the rule
/// needs (see the file comment): the same report.
inline tensor_report judge_with_decoy_rows(std::span<const double> candidate, std::span<const double> expected, tolerance::candidate_format f,
                                           std::span<const double> bounds, std::size_t row, const forward_problem& p) {
    namespace tol = attnref::tolerance;
    tensor_report t = judge_output(candidate, expected, f, bounds, row);
    if (t.verdict != verdict::pass && !t.untrustworthy) return t;
    const std::vector<std::uint8_t> exact = correctly_rounded_elements(candidate, expected, f);  // (judge_output's rule)
    if (all_correctly_rounded(exact)) return t;  // no decoy can count
    const std::size_t n = expected.size();
    if (row == 0 || n == 0 || n % row != 0) return judge_output(candidate, expected, f, bounds, row, decoy_outputs(p));
    const std::size_t rows = n / row;
    std::vector<decoy_problem> problems = decoy_problems(p);
    const std::size_t expected_rows = p.sdpa ? p.q.extents[0] * p.q.extents[1] * p.q.extents[2] : p.x_q.extents[0] * p.x_q.extents[1];
    if (rows != expected_rows) return judge_output(candidate, expected, f, bounds, row, decoy_outputs(p));
    std::deque<decoy_detail::head_projection> shared;  // (a deque: references to its elements stay valid)
    for (decoy_problem& dp : problems) {
        decoy_detail::row_forward fwd(dp.p, shared);
        std::vector<std::uint8_t> done(rows, 0), pass(rows, 0);
        bool outside = false;
        // A row's elements within their bounds (tolerance::compare's rule, element by element).
        auto within = [&](std::size_t r) {
            const std::size_t at = r * row;
            const std::span<const double> d(fwd.output().data() + at, row);
            return tol::compare(d, expected.subspan(at, row), f, [&](std::size_t e) { return bounds[at + e]; }, std::nullopt, 1).ok();
        };
        auto run = [&]() {
            fwd.compute(pass);
            for (std::size_t r = 0; r < rows && !outside; ++r)
                if (pass[r]) outside = !within(r);
            for (std::size_t r = 0; r < rows; ++r) done[r] = done[r] || pass[r], pass[r] = 0;
        };
        // A sample of up to 16 rows spread over the tensor, then the rest in order, 64 rows and then
        // twice as many each time.
        for (std::size_t k = 0; k < 16 && k < rows; ++k) pass[(2 * k + 1) * rows / 32 < rows ? (2 * k + 1) * rows / 32 : rows - 1] = 1;
        run();
        for (std::size_t next = 0, chunk = 64; next < rows && !outside; chunk *= 2) {
            std::size_t taken = 0;
            for (; next < rows && taken < chunk; ++next)
                if (!done[next]) pass[next] = 1, ++taken;
            if (taken) run();
        }
        if (outside) continue;  // this decoy fails the bounds: it cannot make them vacuous
        const decoy whole{dp.name, std::move(fwd.output())};
        if (passing_decoy(std::span<const decoy>(&whole, 1), expected, f, bounds, row, exact))
            return judge_output(candidate, expected, f, bounds, row, std::span<const decoy>(&whole, 1));
    }
    return t;
}

}  // namespace attnref::golden
