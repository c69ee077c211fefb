/// `attnref study --reproduce pcast-fp8 | flash-bf16` (verify/reproduce.hpp): runs the experiment of
/// include/attnref/study/reproduce.hpp, writes DIR/<name>.csv and DIR/<name>.txt, prints the paper's
/// figure next to attnref's measurement and one verdict line per claim, and draws DIR/<name>*.svg with
/// tools/plot_reproduce.py (python3 + matplotlib) when available.

#include "reproduce.hpp"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "attnref/study/reproduce.hpp"
#include "commands.hpp"
#include "attnref/golden/safe_io.hpp"

namespace attnref::verify {

namespace {

namespace rp = attnref::study::reproduce;

std::string ci(const rp::estimate& e, const char* f = "{:.3g}") {
    return fmt::format(fmt::runtime(std::string(f) + " [" + f + ", " + f + "]"), e.value, e.lo, e.hi);
}

/// "a–b" ranges of the Δ values where pred holds, e.g. "4–8, 12".
template <class Pred>
std::string delta_ranges(const std::vector<const rp::pcast_row*>& rows, Pred pred) {
    std::string s;
    for (std::size_t i = 0; i < rows.size();) {
        if (!pred(*rows[i])) {
            ++i;
            continue;
        }
        std::size_t j = i;
        while (j + 1 < rows.size() && pred(*rows[j + 1])) ++j;
        s += (s.empty() ? "" : ", ") + (i == j ? fmt::format("{:g}", rows[i]->delta) : fmt::format("{:g}–{:g}", rows[i]->delta, rows[j]->delta));
        i = j + 1;
    }
    return s.empty() ? "none" : s;
}

/// Rows of one label, format, S and order, ascending Δ.
std::vector<const rp::pcast_row*> select(const std::vector<rp::pcast_row>& all, const std::string& label, const std::string& format,
                                         double scale, const std::string& order) {
    std::vector<const rp::pcast_row*> r;
    for (const rp::pcast_row& x : all)
        if (x.label == label && x.format == format && x.scale == scale && x.order == order) r.push_back(&x);
    return r;
}

std::string pcast_report(const std::vector<rp::pcast_config>& configs, const std::vector<rp::pcast_row>& rows, double seconds) {
    const rp::pcast_config& m = configs.front();
    std::string t = fmt::format(
        "P-cast precision in FP8 attention (arXiv 2606.06521), as quoted: forward key-block order under an attention sink\n"
        "flushes a fraction Phi(D + d_k - 6.93 - ln S) of the non-sink P values to zero in e4m3 (d_k ~ 1 for k_sink = 4);\n"
        "reverse order removes it (no underflow at all with S = 256); 3-10x lower MSE at moderate sink strengths.\n"
        "attnref: blockwise online softmax (FlashAttention rescaling, P*S rounded per key block to fp8, fp32 P.V, O/S),\n"
        "fp32 logits and values; reference: float64 (shifted softmax) on the same inputs.\n"
        "main setup: logits x_ij ~ N(0,1) given directly, + D on k_sink = {} sinks ({}), n = {}, blocks of {}, dv = {},\n"
        "values ~ N(0,1); seeds {}, {} query rows per seed ({} rows); d_k = E[max of k_sink N(0,1)] = {:.4f};\n"
        "c_F = -ln(min subnormal / 2): e4m3 {:.4f} (paper: 6.93), e5m2 {:.4f}. Intervals: 95% over rows.\n\n",
        m.sinks, generator::sink_placement_name(m.placement), m.seq, m.block, m.head_dim_v, fmt::join(m.seeds, " "), m.queries,
        m.queries * m.seeds.size(), rp::expected_max_normal(m.sinks), rp::underflow_log_threshold<float8_e4m3>(),
        rp::underflow_log_threshold<float8_e5m2>());
    std::vector<std::pair<std::string, double>> kernels;
    for (const rp::pcast_row& r : rows)
        if (r.label == m.label && r.order == "forward" &&
            std::find(kernels.begin(), kernels.end(), std::make_pair(r.format, r.scale)) == kernels.end())
            kernels.emplace_back(r.format, r.scale);
    for (const auto& [format, scale] : kernels) {
        const auto fw = select(rows, m.label, format, scale, "forward"), rv = select(rows, m.label, format, scale, "reverse");
        t += fmt::format("{} S = {:g}\n{:>5} | {:>9} | {:>30} | {:>9} {:>9} | {:>9} {:>9} | {:>26}\n", format, scale, "D", "paper",
                         "forward underflow [95% CI]", "reverse", "rev.out", "MSE fwd", "MSE rev", "MSE fwd/rev [95% CI]");
        for (std::size_t i = 0; i < fw.size(); ++i)
            t += fmt::format("{:>5g} | {:>9.3e} | {:>30} | {:>9.3e} {:>9.3e} | {:>9.3e} {:>9.3e} | {:>26}\n", fw[i]->delta,
                             fw[i]->closed_form, ci(fw[i]->underflow, "{:.3e}"), rv[i]->underflow.value, rv[i]->underflow_outside,
                             fw[i]->mse, rv[i]->mse, ci(fw[i]->mse_ratio));
        t += "\n";
    }
    t += "rev.out: reverse-order underflow fraction over the non-sink keys outside every key block that holds a sink.\n\n";
    // Sensitivity: one line per configuration.
    t += fmt::format("sensitivity (e4m3; max |forward - closed form| over D, S = 1 and 256; reverse S = 256 flushed weights; "
                     "D where the forward/reverse MSE ratio is 3-10x)\n{:<17} {:>6} {:>5} {:>6} {:>8} | {:>15} {:>15} | {:>14} | {:>18} {:>18}\n",
                     "config", "n", "block", "sinks", "place", "|fw-cf| S=1", "|fw-cf| S=256", "rev S=256 0s", "ratio 3-10 S=1",
                     "ratio 3-10 S=256");
    for (const rp::pcast_config& c : configs) {
        auto worst = [&](double scale) {
            double w = 0, at = 0;
            for (const rp::pcast_row* r : select(rows, c.label, "e4m3", scale, "forward"))
                if (std::abs(r->underflow.value - r->closed_form) > w) w = std::abs(r->underflow.value - r->closed_form), at = r->delta;
            return fmt::format("{:.3f} (D={:g})", w, at);
        };
        std::size_t flushed = 0;
        double outside = 0;
        for (const rp::pcast_row* r : select(rows, c.label, "e4m3", 256, "reverse")) flushed += r->flushed, outside = std::max(outside, r->underflow_outside);
        auto band = [&](double scale) {
            return delta_ranges(select(rows, c.label, "e4m3", scale, "forward"),
                                [](const rp::pcast_row& r) { return r.mse_ratio.value >= 3 && r.mse_ratio.value <= 10; });
        };
        t += fmt::format("{:<17} {:>6} {:>5} {:>6} {:>8} | {:>15} {:>15} | {:>14} | {:>18} {:>18}\n", c.label, c.seq, c.block, c.sinks,
                         generator::sink_placement_name(c.placement), worst(1), worst(256),
                         fmt::format("{}{}", flushed, outside > 0 ? "*" : ""), band(1), band(256));
    }
    t += "(* some flushed weights lie outside the sink blocks; qk_gaussian: logits q.k/sqrt(64) with q, k ~ N(0,1) + D at the sinks)\n\n";
    // Verdicts on the main configuration.
    double worst4 = 0, worst4_at = 0, worst4_s = 0, worst5 = 0;
    for (const rp::pcast_row& r : rows) {
        if (r.label != m.label || r.order != "forward") continue;
        const double d = std::abs(r.underflow.value - r.closed_form);
        if (r.format == "e4m3" && d > worst4) worst4 = d, worst4_at = r.delta, worst4_s = r.scale;
        if (r.format == "e5m2") worst5 = std::max(worst5, d);
    }
    t += fmt::format("VERDICT closed form: {} — forward-order e4m3 underflow fraction within {:.3f} (absolute) of Phi(D + d_k - 6.93 - ln S) "
                     "for D = {:g}..{:g}, S = 1, 16, 256 (largest gap at D = {:g}, S = {:g}; e5m2 with c_F = 11.78: within {:.3f}); "
                     "criterion: within 0.05 holds, 0.15 approximately; measured above the curve where it rises: the sinks' max is random, "
                     "E[Phi(M - c)] is wider than Phi(E[M] - c)\n",
                     worst4 <= 0.05 ? "HOLDS" : worst4 <= 0.15 ? "HOLDS APPROXIMATELY" : "DOES NOT HOLD", worst4, m.deltas.front(), m.deltas.back(), worst4_at, worst4_s, worst5);
    std::size_t flushed = 0, in_sink_block_rows = 0;
    double outside = 0, worst_in = 0, worst_in_at = 0;
    for (const rp::pcast_row* r : select(rows, m.label, "e4m3", 256, "reverse")) {
        flushed += r->flushed;
        outside = std::max(outside, r->underflow_outside);
        if (r->underflow.value > worst_in) worst_in = r->underflow.value, worst_in_at = r->delta;
        in_sink_block_rows += r->flushed > 0;
    }
    if (flushed == 0)
        t += fmt::format("VERDICT reverse order, S = 256: HOLDS — no P value flushed to zero at any D = {:g}..{:g}\n", m.deltas.front(), m.deltas.back());
    else
        t += fmt::format("VERDICT reverse order, S = 256: {} — {} P values flushed to zero; {} (fraction of non-sink keys up to {:.2e} at D = {:g}): "
                         "the non-sink keys of the sinks' own key block are rounded after the sinks set the running max\n",
                         outside == 0 ? "HOLDS ONLY OUTSIDE THE SINKS' KEY BLOCK" : "DOES NOT HOLD", flushed,
                         outside == 0 ? "all in the key block holding the sinks" : "some outside the sinks' key block", worst_in, worst_in_at);
    for (double scale : {1.0, 256.0}) {
        const auto fw = select(rows, m.label, "e4m3", scale, "forward");
        double best = 0, best_at = 0;
        for (const rp::pcast_row* r : fw)
            if (r->mse_ratio.value > best) best = r->mse_ratio.value, best_at = r->delta;
        const std::string in = delta_ranges(fw, [](const rp::pcast_row& r) { return r.mse_ratio.value >= 3 && r.mse_ratio.value <= 10; });
        const std::string above = delta_ranges(fw, [](const rp::pcast_row& r) { return r.mse_ratio.value > 10; });
        const std::string below = delta_ranges(fw, [](const rp::pcast_row& r) { return r.mse_ratio.value < 3; });
        t += fmt::format("VERDICT MSE forward/reverse, e4m3 S = {:g}: {} — ratio 3-10x at D = {}; above 10x at D = {}; below 3x at D = {} "
                         "(largest {:.3g} at D = {:g})\n",
                         scale, in == "none" ? (above == "none" ? "DOES NOT HOLD" : "EXCEEDED") : "HOLDS AT MODERATE D", in, above, below,
                         best, best_at);
    }
    t += fmt::format("\n{} configurations, {:.1f} s\n", configs.size(), seconds);
    return t;
}

std::string pcast_csv(const std::vector<rp::pcast_row>& rows) {
    std::string s = "label,format,scale,order,delta,seq,block,sinks,placement,inputs,rows,closed_form,underflow,underflow_lo,underflow_hi,"
                    "underflow_outside,flushed,mse,mse_ratio,mse_ratio_lo,mse_ratio_hi\n";
    for (const rp::pcast_row& r : rows)
        s += fmt::format("{},{},{:g},{},{:g},{},{},{},{},{},{},{:.6e},{:.6e},{:.6e},{:.6e},{:.6e},{},{:.6e},{:.6e},{:.6e},{:.6e}\n", r.label,
                         r.format, r.scale, r.order, r.delta, r.seq, r.block, r.sinks, r.placement, r.inputs, r.rows, r.closed_form,
                         r.underflow.value, r.underflow.lo, r.underflow.hi, r.underflow_outside, r.flushed, r.mse, r.mse_ratio.value,
                         r.mse_ratio.lo, r.mse_ratio.hi);
    return s;
}

std::string flash_report(const std::vector<rp::flash_config>& configs, const std::vector<rp::flash_row>& rows, double seconds) {
    const rp::flash_config& m = configs.front();
    std::string t = fmt::format(
        "Is Flash Attention Stable? (arXiv 2405.02803), as quoted: in an isolated forward pass, FlashAttention's bf16 output deviates\n"
        "from a high-precision reference by about an order of magnitude more than baseline (materialised-softmax) attention.\n"
        "attnref kernels: flash = bf16 inputs, fp32 logits and online softmax (blocks of {}), P rounded to bf16 per block, fp32 P.V,\n"
        "bf16 output (bf16_fp32acc, online); baseline = the score matrix S and P stored in bf16, fp32 arithmetic, bf16 output\n"
        "(bf16_materialised, shifted softmax); baseline_p = only P stored in bf16; *_pure = every operation in bf16.\n"
        "Reference: float64 on the same bf16 inputs. main setup: q, k, v ~ N(0,1) rounded to bf16, dk = dv = {}, scale 1/sqrt(dk),\n"
        "seeds {}, {} query rows per seed. Deviation |o_hat - o| over all rows and dv; ratio = RMS deviation / the baseline's of the\n"
        "same arithmetic (flash, baseline_p vs baseline; flash_pure vs baseline_pure), 95% CI over rows; max ratio without CI.\n\n",
        m.block, m.head_dim, fmt::join(m.seeds, " "), m.queries);
    t += fmt::format("{:<15} {:<14} {:>6} {:>4} | {:>10} {:>10} | {:>28} {:>9}\n", "config", "kernel", "n", "dk", "RMS dev", "max dev",
                     "RMS ratio to baseline [CI]", "max ratio");
    for (const rp::flash_row& r : rows)
        t += fmt::format("{:<15} {:<14} {:>6} {:>4} | {:>10.3e} {:>10.3e} | {:>28} {:>9.3g}\n", r.label, r.kernel, r.seq, r.head_dim,
                         r.rms_dev, r.max_dev, ci(r.rms_ratio), r.max_ratio);
    double lo = 1e300, hi = 0, mlo = 1e300, mhi = 0, plo = 1e300, phi = 0;
    for (const rp::flash_row& r : rows) {
        if (r.label == m.label && r.kernel == std::string("flash"))
            lo = std::min(lo, r.rms_ratio.value), hi = std::max(hi, r.rms_ratio.value), mlo = std::min(mlo, r.max_ratio),
            mhi = std::max(mhi, r.max_ratio);
        if (r.label == m.label && r.kernel == std::string("flash_pure")) plo = std::min(plo, r.rms_ratio.value), phi = std::max(phi, r.rms_ratio.value);
    }
    const char* verdict = lo >= 5 ? "HOLDS" : hi < 2 ? "DOES NOT HOLD" : "HOLDS IN PART";
    t += fmt::format("\nVERDICT flash vs baseline, bf16: {} — attnref's flash/baseline deviation ratio is {:.2g}–{:.2g} (RMS) and {:.2g}–{:.2g} (max) "
                     "over n = {}..{} (paper: ~10); every operation in bf16 instead: {:.2g}–{:.2g}; criterion: ratio >= 5 holds, < 2 does not\n",
                     verdict, lo, hi, mlo, mhi, m.seqs.front(), m.seqs.back(), plo, phi);
    t += fmt::format("\n{} configurations, {:.1f} s\n", configs.size(), seconds);
    return t;
}

std::string flash_csv(const std::vector<rp::flash_row>& rows) {
    std::string s = "label,kernel,inputs,sigma,seq,head_dim,block,rows,rms_dev,max_dev,rms_ratio,rms_ratio_lo,rms_ratio_hi,max_ratio\n";
    for (const rp::flash_row& r : rows)
        s += fmt::format("{},{},{},{:g},{},{},{},{},{:.6e},{:.6e},{:.6e},{:.6e},{:.6e},{:.6e}\n", r.label, r.kernel, r.inputs, r.sigma, r.seq,
                         r.head_dim, r.block, r.rows, r.rms_dev, r.max_dev, r.rms_ratio.value, r.rms_ratio.lo, r.rms_ratio.hi, r.max_ratio);
    return s;
}

}  // namespace

void run_reproduction(const std::string& name, const std::string& out, std::size_t threads, bool reduced, bool no_plot) {
    if (name != "pcast-fp8" && name != "flash-bf16")
        throw data_error("attnref study: --reproduce: expected pcast-fp8 or flash-bf16, got '" + printable(name) + "'");
    const std::filesystem::path dir(out);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw data_error("attnref study: --out: " + printable(dir.string()) + ": cannot create the directory: " + ec.message());
    const auto start = std::chrono::steady_clock::now();
    auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
    std::string csv, text;
    if (name == "pcast-fp8") {
        const std::vector<rp::pcast_config> configs = rp::pcast_configs(reduced);
        std::vector<rp::pcast_row> rows;
        for (const rp::pcast_config& c : configs) {
            std::fprintf(stderr, "attnref study --reproduce pcast-fp8: %s\n", c.label.c_str());
            const std::vector<rp::pcast_row> r = rp::run_pcast(c, threads);
            rows.insert(rows.end(), r.begin(), r.end());
        }
        csv = pcast_csv(rows);
        text = pcast_report(configs, rows, elapsed());
    } else {
        const std::vector<rp::flash_config> configs = rp::flash_configs(reduced);
        std::vector<rp::flash_row> rows;
        for (const rp::flash_config& c : configs) {
            std::fprintf(stderr, "attnref study --reproduce flash-bf16: %s\n", c.label.c_str());
            const std::vector<rp::flash_row> r = rp::run_flash(c, threads);
            rows.insert(rows.end(), r.begin(), r.end());
        }
        csv = flash_csv(rows);
        text = flash_report(configs, rows, elapsed());
    }
    const std::string stem = name == "pcast-fp8" ? "pcast_fp8" : "flash_bf16";
    write_file_atomic(dir / (stem + ".csv"), csv, true);  // like study's files: atomically, never through a link
    write_file_atomic(dir / (stem + ".txt"), text, true);
    std::fputs(text.c_str(), stdout);
    std::printf("wrote %s and %s\n", printable((dir / (stem + ".csv")).string()).c_str(), printable((dir / (stem + ".txt")).string()).c_str());
    if (no_plot) return;
    const std::string script = (data_dir() / "tools" / "plot_reproduce.py").string();
    const std::vector<std::string> argv{"/usr/bin/python3", script, (dir / (stem + ".csv")).string(), dir.string()};
    if (std::filesystem::exists(argv[0]) && std::filesystem::exists(script) && run_quietly(argv))
        std::printf("plots: %s/%s*.svg\n", printable(dir.string()).c_str(), stem.c_str());
    else
        std::printf("plots not drawn (needs /usr/bin/python3 with matplotlib and %s)\n", printable(script).c_str());
}

}  // namespace attnref::verify
