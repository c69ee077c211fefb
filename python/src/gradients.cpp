/// Certified gradients for a call: the call and its upstream gradient dO become a golden case
/// description (conventions, shapes, the inputs and dO as the case's data), and the gradients are
/// certified exactly as `attnref generate` certifies a backward case: golden::certify_gradients
/// (attnref's templated backward in MPFI intervals through certify.hpp's ladder).
#include "attnref/golden/generate.hpp"
#include "backward_case.hpp"

namespace attnref::python {

namespace {

std::vector<double> copy_of(const array_ref& a) {
    std::size_t n = 1;
    for (std::size_t e : a.shape) n *= e;
    return a.given() ? std::vector<double>(a.data, a.data + n) : std::vector<double>{};
}

/// A (B or 1, H or 1, Sq, Sk) mask broadcast to (B, H, Sq, Sk), as golden cases store masks.
template <class E>
std::vector<E> broadcast(const std::vector<E>& m, const extents_t<4>& e, std::size_t B, std::size_t H, std::size_t Sq, std::size_t Sk) {
    std::vector<E> out;
    out.reserve(B * H * Sq * Sk);
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t h = 0; h < H; ++h)
            for (std::size_t i = 0; i < Sq; ++i)
                for (std::size_t j = 0; j < Sk; ++j)
                    out.push_back(m[((((e[0] == 1 ? 0 : b) * e[1]) + (e[1] == 1 ? 0 : h)) * e[2] + i) * e[3] + j]);
    return out;
}

}  // namespace

void backward_case_of(const call& c, const array_ref& grad_output, golden::case_spec& spec, golden::case_data& data) {
    c.validate();  // the forward of the same call has checked the shapes too
    spec = {};
    data = {};
    spec.name = "attnref.sdpa";
    spec.kind = c.kind;
    // The call's conventions are the case's (masks broadcast below); projection_bias from the biases.
    spec.conventions = c.conv;
    golden::case_shapes& d = spec.shapes;
    if (c.kind == call_kind::sdpa) {
        d.batch = c.q.shape[0], d.heads = c.q.shape[1], d.query_length = c.q.shape[2], d.head_dim_qk = c.q.shape[3];
        d.kv_heads = c.k.shape[1], d.key_length = c.k.shape[2], d.head_dim_v = c.v.shape[3];
    } else {
        spec.name = "attnref.mha";
        d.batch = c.q.shape[0], d.query_length = c.q.shape[1], d.model_dim = c.q.shape[2], d.key_length = c.k.shape[1];
        d.heads = c.heads, d.kv_heads = c.kv_heads, d.output_dim = c.w_o.shape[1];
        if (c.k.shape[2] != d.model_dim || c.v.shape[2] != d.model_dim)
            throw std::invalid_argument("grad_output: gradients of mha need x_q, x_k and x_v of one width (E)");
        if (c.b_q.given() != c.b_k.given() || c.b_q.given() != c.b_v.given() || c.b_q.given() != c.b_o.given())
            throw std::invalid_argument("grad_output: gradients of mha need all four biases or none");
        d.head_dim_qk = c.w_q.shape[1] / d.heads, d.head_dim_v = c.w_v.shape[1] / d.kv_heads;
        spec.conventions.projection_bias = c.b_q.given();
        data.w_q = copy_of(c.w_q), data.w_k = copy_of(c.w_k), data.w_v = copy_of(c.w_v), data.w_o = copy_of(c.w_o);
        data.b_q = copy_of(c.b_q), data.b_k = copy_of(c.b_k), data.b_v = copy_of(c.b_v), data.b_o = copy_of(c.b_o);
    }
    data.query = copy_of(c.q), data.key = copy_of(c.k), data.value = copy_of(c.v);
    data.grad_output = copy_of(grad_output);
    const conventions& cv = c.conv;
    if (cv.boolean_mask) data.mask = broadcast(cv.mask_values, cv.mask_extents, d.batch, d.heads, d.query_length, d.key_length);
    if (cv.additive_mask) data.additive_mask = broadcast(cv.additive_values, cv.additive_extents, d.batch, d.heads, d.query_length, d.key_length);
    spec.outputs.gradients = true;
}

std::optional<std::pair<std::uint64_t, std::uint64_t>> certified_memory(const call& c, const array_ref* grad_output) {
    golden::case_spec spec;
    golden::case_data data;
    try {
        backward_case_of(c, grad_output ? *grad_output : array_ref{}, spec, data);
    } catch (const std::invalid_argument&) {
        return std::nullopt;  // an mha call no case describes (x of different widths): the caller's own model
    }
    spec.outputs.gradients = grad_output != nullptr;
    spec.outputs.weights = spec.outputs.lse = true;  // always computed: the weights feed the bounds
    const golden::generate_memory m = golden::generate_memory_estimate(spec, golden::certification_method::fast, c.conv.threads, &data);
    // The fast backward's buffers; its MPFI ladder for undecided elements runs only where it fits the
    // limit (certify_gradients_fast checks it against max_memory() when it escalates).
    const std::uint64_t gradients = grad_output ? golden::gradients_fast_bytes(spec, c.conv.threads) : 0;
    if (m.fast == 0) return std::pair{m.total - golden::program_bytes + gradients, std::uint64_t{0}};  // the fast path declines: MPFI throughout
    return std::pair{golden::safe_io_detail::sat_add(m.fast, gradients), m.escalation};
}

gradient_result compute_certified_gradients(const call& c, const array_ref& grad_output, std::uint64_t max_memory) {
    // The call's max_memory= is the limit the library's escalation checks, for this call only.
    struct limit {
        std::uint64_t saved = golden::max_memory();
        explicit limit(std::uint64_t m) { golden::set_max_memory(m); }
        ~limit() { golden::set_max_memory(saved); }
    } scoped(max_memory);
    golden::case_spec spec;
    golden::case_data data;
    backward_case_of(c, grad_output, spec, data);
    // The fast certified backward, as `attnref generate --gradients` certifies (golden/generate.hpp
    // certify_gradients_fast: what it leaves undecided goes through the MPFI ladder; the same values).
    certify::result cert = golden::certify_gradients_fast(spec, data, c.conv.threads, {certify::float64_target});
    gradient_result r;
    const std::vector<golden::gradient_tensor_layout> layout = golden::gradient_layout(spec);
    for (std::size_t t = 0; t < layout.size(); ++t) r.tensors.push_back({layout[t].role, layout[t].shape, std::move(cert.values[t][0])});
    r.certifications = cert.reports;
    r.precisions_bits = cert.precisions_bits;
    return r;
}

}  // namespace attnref::python
