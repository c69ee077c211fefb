/// A candidate against a reference under tolerance.hpp's models: the sizes of the arrays are
/// checked here (shape_error naming the argument); everything else — the bounds, the vacuity,
/// decoy and zero-trust rules, the weights' and lse's invariants and the empty-row lse convention —
/// is the checker's golden::judge_forward (include/attnref/check/judge_forward.hpp), called on the
/// call's problem.
#include <string>

#include "core.hpp"

namespace attnref::python {

namespace {

void require_size(const char* what, std::size_t got, std::size_t expected) {
    if (got != expected)
        throw shape_error(std::string(what) + ": " + std::to_string(got) + " elements, the reference has " + std::to_string(expected));
}

std::size_t count(const std::vector<std::size_t>& s) {
    std::size_t n = 1;
    for (std::size_t e : s) n *= e;
    return n;
}

}  // namespace

golden::forward_judgment judge(const call* c, const judge_request& rq) {
    require_size("actual", rq.actual_output.size(), rq.expected_output.size());
    const bool weights = !rq.actual_weights.empty(), lse = !rq.actual_lse.empty();
    if ((weights || lse) && !c) throw std::invalid_argument("weights, lse: comparing them needs the reference's call");
    if (c) {
        c->validate();
        require_size("the reference's weights", rq.expected_weights.size(), count(c->weights_shape()));
        require_size("the reference's lse", rq.expected_lse.size(), count(c->lse_shape()));
        if (weights) require_size("weights", rq.actual_weights.size(), rq.expected_weights.size());
        if (lse) require_size("lse", rq.actual_lse.size(), rq.expected_lse.size());
    }
    golden::forward_request fr;
    fr.model = rq.model;
    fr.format = rq.format;
    fr.reference_u = rq.reference_u;
    fr.expected_output = rq.expected_output, fr.expected_weights = rq.expected_weights, fr.expected_lse = rq.expected_lse;
    fr.actual_output = rq.actual_output, fr.actual_weights = rq.actual_weights, fr.actual_lse = rq.actual_lse;
    fr.output_row = rq.output_row;
    fr.ulp_limit = rq.ulp_limit;
    fr.empty_lse = rq.empty_lse;
    if (!c) return golden::judge_forward(nullptr, fr);
    const forward_problem p = c->problem();
    return golden::judge_forward(&p, fr);
}

}  // namespace attnref::python
