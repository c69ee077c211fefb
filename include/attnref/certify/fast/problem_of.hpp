#pragma once
/// \file certify/fast/problem_of.hpp
/// The fast certified path's input (fast_problem) from an attention problem's views
/// (problem.hpp forward_problem): the one place a golden case (golden/generate.hpp) and a Python
/// call (python/src/certified.cpp) become what certify_fast reads.

#include "attnref/certify/fast/problem.hpp"
#include "attnref/core/problem.hpp"

namespace attnref::fast {

/// The problem's inputs and options as the fast path's problem; views into what `f` views.
inline fast_problem fast_problem_of(const forward_problem& f) {
    fast_problem p;
    p.options = f.options();
    if (f.sdpa) {
        p.q = f.q, p.k = f.k, p.v = f.v;
        return p;
    }
    p.mha = true;
    p.heads = f.mo.heads;
    p.kv_heads = f.mo.kv_heads;
    p.x_q = f.x_q, p.x_k = f.x_k, p.x_v = f.x_v;
    p.params = f.w;
    return p;
}

}  // namespace attnref::fast
