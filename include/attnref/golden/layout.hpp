#pragma once
/// \file golden/layout.hpp
/// The tensors a golden case implies, as views of the role table (problem.hpp): its inputs in file
/// order (input_layout, with the generator's role of each), the shapes of output, weights and lse,
/// its certified gradients (gradient_layout) and every tensor its manifest must list
/// (expected_tensors, with the targets' copies).

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attnref/core/binary_format.hpp"
#include "attnref/io/generator.hpp"
#include "attnref/core/problem.hpp"
#include "attnref/golden/case_spec.hpp"

namespace attnref::golden {

/// The roles a case generates as inputs, in file order, with their stored shapes.
struct input_tensor_layout {
    generator::role role;
    std::vector<std::size_t> shape;
};
inline std::vector<input_tensor_layout> input_layout(const case_spec& spec);
/// Shapes of output, weights and lse.
inline std::vector<std::size_t> output_shape(const case_spec& spec);
inline std::vector<std::size_t> weights_shape(const case_spec& spec);
inline std::vector<std::size_t> lse_shape(const case_spec& spec);

/// A certified gradient of a backward case (outputs.gradients): its role name and shape.
struct gradient_tensor_layout {
    std::string role;
    std::vector<std::size_t> shape;
};
/// The certified gradients of a backward case, in file order (empty unless outputs.gradients):
/// sdpa grad_query (B, H, Sq, dk), grad_key (B, Hkv, Sk, dk), grad_value (B, Hkv, Sk, dv); mha
/// grad_query, grad_key, grad_value (w.r.t. the embeddings x_q, x_k, x_v), grad_w_q, grad_w_k, grad_w_v,
/// grad_w_o (the weights' shapes) and, with projection_bias, grad_b_q, grad_b_k, grad_b_v, grad_b_o.
inline std::vector<gradient_tensor_layout> gradient_layout(const case_spec& spec);

/// A tensor a case's manifest must list: role, target copy (nullopt: the float64 values), the
/// '.npy' descr and the shape, all implied by the case description. Inputs are '<f8' (the boolean
/// mask '|b1'); outputs '<f8', their float32 copies '<f4', float16 '<f2', bfloat16 '<u2' (bits).
struct expected_tensor {
    std::string role;
    std::optional<std::string> target;
    std::string dtype;
    std::vector<std::size_t> shape;
};
inline std::vector<expected_tensor> expected_tensors(const case_spec& spec);

/// The generator's role of an input role (the names agree).
inline generator::role generator_role(tensor_role r) {
    for (std::uint64_t i = 1; i <= generator::last_role_id; ++i)
        if (generator::role_name(static_cast<generator::role>(i)) == role_name(r)) return static_cast<generator::role>(i);
    throw std::logic_error("no generator role named '" + std::string(role_name(r)) + "'");
}

// input_layout is defined in golden/manifest.hpp.
inline std::vector<std::size_t> output_shape(const case_spec& s) { return shape_of(s, tensor_role::output); }
inline std::vector<std::size_t> weights_shape(const case_spec& s) { return shape_of(s, tensor_role::weights); }
inline std::vector<std::size_t> lse_shape(const case_spec& s) { return shape_of(s, tensor_role::lse); }

inline std::vector<gradient_tensor_layout> gradient_layout(const case_spec& s) {
    std::vector<gradient_tensor_layout> out;
    for (const role_tensor& t : roles_of(s, role_direction::gradient, s.selection())) out.push_back({std::string(t.name), t.shape});
    return out;
}

inline std::vector<expected_tensor> expected_tensors(const case_spec& s) {
    std::vector<expected_tensor> out;
    for (const input_tensor_layout& t : input_layout(s))
        out.push_back({std::string(generator::role_name(t.role)), std::nullopt, t.role == generator::role::mask ? "|b1" : "<f8", t.shape});
    std::vector<std::pair<std::string, std::vector<std::size_t>>> outputs{{"output", output_shape(s)}};
    if (s.outputs.weights) outputs.emplace_back("weights", weights_shape(s));
    if (s.outputs.lse) outputs.emplace_back("lse", lse_shape(s));
    for (const gradient_tensor_layout& g : gradient_layout(s)) outputs.emplace_back(g.role, g.shape);
    for (const auto& [name, shape] : outputs) {
        out.push_back({name, std::nullopt, "<f8", shape});
        for (const std::string& target : s.outputs.targets)
            out.push_back({name, target, describe(*format_from_name(target)).npy_descr, shape});
    }
    return out;
}

}  // namespace attnref::golden
