#include "summary.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace attnref::verify {

std::string shapes_text(const case_spec& s) {
    const case_shapes& d = s.shapes;
    std::string t = fmt::format("B{} H{}/{} S{}x{} d{}/{}", d.batch, d.heads, d.kv_heads, d.query_length, d.key_length,
                                d.head_dim_qk, d.head_dim_v);
    if (s.kind == case_kind::mha) t += fmt::format(" E{}->{}", d.model_dim, d.output_dim);
    return t;
}

std::string conventions_text(const case_spec& s) {
    const case_conventions& c = s.conventions;
    std::vector<std::string> parts;
    if (s.kind == case_kind::mha) parts.push_back(c.projection_bias ? "mha+bias" : "mha");
    if (c.causal) parts.push_back(c.alignment == causal_alignment::top_left ? "causal=tl" : "causal=br");
    if (c.diagonal_offset) parts.push_back(fmt::format("offset={}", c.diagonal_offset));
    if (c.window)
        parts.push_back(fmt::format("window={}/{}", c.window->left ? std::to_string(*c.window->left) : "inf",
                                    c.window->right ? std::to_string(*c.window->right) : "inf"));
    if (!c.key_lengths.empty()) parts.push_back("padding");
    if (c.boolean_mask) parts.push_back(c.polarity == mask_polarity::true_means_attend ? "bool=attend" : "bool=masked");
    if (c.additive_mask) parts.push_back("additive");
    if (c.seed_mask) parts.push_back("seedmask");
    if (c.empty_rows != empty_row_policy::zero) parts.push_back(std::string("empty=") + empty_rows_name(c.empty_rows));
    if (c.scale) parts.push_back(fmt::format("scale={}", *c.scale));
    if (c.placement != scale_placement::on_product) parts.push_back(placement_name(c.placement));
    if (c.softcap) parts.push_back(fmt::format("softcap={}", *c.softcap));
    if (!c.alibi_slopes.empty()) parts.push_back("alibi");
    if (s.inputs.format != generator::input_format::float64) parts.push_back(std::string("in=") + std::string(generator::format_name(s.inputs.format)));
    if (s.inputs.family.name != "standard") parts.push_back(s.inputs.family.name);
    std::string t;
    for (const std::string& p : parts) t += (t.empty() ? "" : " ") + p;
    return t.empty() ? "-" : t;
}

std::string summary_table(const std::vector<summary_row>& rows) {
    std::size_t wn = 4, ws = 6, wc = 11;
    for (const summary_row& r : rows) {
        wn = std::max(wn, r.spec->name.size());
        ws = std::max(ws, shapes_text(*r.spec).size());
        wc = std::max(wc, conventions_text(*r.spec).size());
    }
    std::string out = fmt::format("{:<{}}  {:<{}}  {:<{}}  {:>10}  {:>9}  {:>8}  {}\n", "case", wn, "shapes", ws, "conventions", wc,
                                  "certified", "escalated", "time [s]", "status");
    std::size_t certified = 0, escalated = 0;
    double seconds = 0;
    for (const summary_row& r : rows) {
        out += fmt::format("{:<{}}  {:<{}}  {:<{}}  {:>10}  {:>9}  {:>8.2f}  {}\n", r.spec->name, wn, shapes_text(*r.spec), ws,
                           conventions_text(*r.spec), wc, r.certified, r.escalated, r.seconds, r.status);
        certified += r.certified;
        escalated += r.escalated;
        seconds += r.seconds;
    }
    out += fmt::format("{:<{}}  {:<{}}  {:<{}}  {:>10}  {:>9}  {:>8.2f}  (sum of per-case times)\n", fmt::format("{} cases", rows.size()),
                       wn, "", ws, "", wc, certified, escalated, seconds);
    return out;
}

}  // namespace attnref::verify
