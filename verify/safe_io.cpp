#include "safe_io.hpp"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <set>
#include <vector>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

namespace attnref::verify {

namespace fs = std::filesystem;

namespace {
std::atomic<std::uint64_t> memory_limit{default_max_memory};

std::string gib(std::uint64_t bytes) {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, "%.3g GiB", static_cast<double>(bytes) / double(1u << 30));
    return buffer;
}

std::uint64_t sat_mul(std::uint64_t a, std::uint64_t b) {
    const std::optional<std::uint64_t> r = checked_mul(a, b);
    return r ? *r : UINT64_MAX;
}
std::uint64_t sat_add(std::uint64_t a, std::uint64_t b) {
    const std::optional<std::uint64_t> r = checked_add(a, b);
    return r ? *r : UINT64_MAX;
}
std::uint64_t sat_count(const std::vector<std::size_t>& shape) {
    std::uint64_t n = 1;
    for (std::size_t e : shape) n = e == 0 ? 0 : (n == 0 ? 0 : sat_mul(n, e));
    return n;
}
}  // namespace

std::uint64_t max_memory() { return memory_limit.load(); }
void set_max_memory(std::uint64_t bytes) { memory_limit.store(bytes); }

std::uint64_t parse_memory_size(const std::string& text, const std::string& flag) {
    std::size_t digits = 0;
    while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
    const std::string suffix = text.substr(digits);
    unsigned shift = 0;
    if (suffix.empty()) shift = 0;
    else if (suffix == "K" || suffix == "k") shift = 10;
    else if (suffix == "M" || suffix == "m") shift = 20;
    else if (suffix == "G" || suffix == "g") shift = 30;
    else if (suffix == "T" || suffix == "t") shift = 40;
    else digits = 0;
    std::uint64_t value = 0;
    bool ok = digits > 0 && digits <= 19;
    for (std::size_t i = 0; ok && i < digits; ++i) value = value * 10 + static_cast<unsigned>(text[i] - '0');
    if (ok && value > (UINT64_MAX >> shift)) ok = false;
    if (!ok || value == 0)
        throw data_error("command line: " + flag + ": expected a positive byte count with an optional K, M, G or T suffix, got '" +
                         printable(text) + "'");
    return value << shift;
}

std::string printable(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (const char ch : text) {
        const auto c = static_cast<unsigned char>(ch);
        if (c == '\\') out += "\\\\";
        else if (c == '\n') out += "\\n";
        else if (c == '\t') out += "\\t";
        else if (c == '\r') out += "\\r";
        else if (c < 0x20 || c == 0x7f) {
            constexpr char hex[] = "0123456789abcdef";
            out += "\\x";
            out += hex[c >> 4];
            out += hex[c & 0xf];
        } else {
            out += ch;
        }
    }
    return out;
}

std::uintmax_t require_regular_file(const fs::path& path, const std::string& what, const std::optional<fs::path>& case_dir) {
    const std::string name = path.string();
    auto fail = [&](const std::string& why) -> void { throw data_error(name + ": " + what + ": " + why); };
    std::error_code ec;
    const fs::file_status link = fs::symlink_status(path, ec);
    if (ec || !fs::exists(link)) fail("cannot open for reading (no such file)");
    if (case_dir && fs::is_symlink(link)) {
        // Where the link leads is the case's business only if it stays inside the case: the target
        // of an escaping link is neither opened, hashed nor named.
        const fs::path base = fs::canonical(*case_dir, ec);
        if (ec) fail("cannot resolve the case directory");
        const fs::path target = fs::canonical(path, ec);
        if (ec) fail("a symlink that cannot be resolved (refused)");
        auto b = base.begin(), t = target.begin();
        for (; b != base.end() && t != target.end() && *b == *t; ++b, ++t) {
        }
        if (b != base.end() || t == target.end()) fail("a symlink that resolves outside the case directory (refused)");
    }
    const fs::file_status status = fs::status(path, ec);
    if (ec) fail("cannot open for reading");
    if (fs::is_directory(status)) fail("is a directory");
    if (!fs::is_regular_file(status)) fail("not a regular file (a FIFO, socket or device is refused)");
    const std::uintmax_t size = fs::file_size(path, ec);
    if (ec) fail("cannot read its size");
    return size;
}

std::string read_file_capped(const fs::path& path, std::size_t cap, const std::optional<fs::path>& case_dir) {
    const std::string name = path.string();
    require_regular_file(path, "file", case_dir);
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) throw data_error(name + ": file: cannot open for reading: " + std::strerror(errno));
    struct closer {
        int fd;
        ~closer() { ::close(fd); }
    } guard{fd};
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        throw data_error(name + ": file: not a regular file (a FIFO, socket or device is refused)");
    auto too_big = [&](std::uintmax_t size) {
        throw data_error(name + ": file: " + std::to_string(size) + " bytes or more, above the limit of " + std::to_string(cap) +
                         " bytes for this kind of file");
    };
    if (static_cast<std::uintmax_t>(st.st_size) > cap) too_big(static_cast<std::uintmax_t>(st.st_size));
    std::string text;
    text.resize(static_cast<std::size_t>(st.st_size) + 1);  // one more byte: detects a file that grew
    std::size_t got = 0;
    while (got < text.size()) {
        const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw data_error(name + ": file: read error: " + std::strerror(errno));
        if (n == 0) break;
        got += static_cast<std::size_t>(n);
    }
    if (got > static_cast<std::size_t>(st.st_size)) throw data_error(name + ": file: changed size while being read");
    text.resize(got);
    return text;
}

namespace {

/// SAX handler for json_prepass: depth and duplicate keys. Keeps one frame per open container
/// (at most max_json_depth), never recurses.
class prepass_handler : public nlohmann::json_sax<nlohmann::json> {
public:
    explicit prepass_handler(const std::string& file) : file_(file) {}

    bool null() override { return value(); }
    bool boolean(bool) override { return value(); }
    bool number_integer(number_integer_t) override { return value(); }
    bool number_unsigned(number_unsigned_t) override { return value(); }
    bool number_float(number_float_t, const string_t&) override { return value(); }
    bool string(string_t&) override { return value(); }
    bool binary(binary_t&) override { return value(); }
    bool start_object(std::size_t) override { return open(true); }
    bool start_array(std::size_t) override { return open(false); }
    bool end_object() override { return close(); }
    bool end_array() override { return close(); }
    bool key(string_t& k) override {
        frame& f = frames_.back();
        if (!f.keys.insert(k).second)
            throw data_error(file_ + ": field '" + path(k) + "': duplicate key (each key may appear once in an object)");
        f.current = k;
        return true;
    }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

private:
    struct frame {
        bool object;
        std::set<std::string> keys;
        std::string current;
        std::size_t index = 0;
    };
    bool value() {
        if (!frames_.empty() && !frames_.back().object) ++frames_.back().index;
        return true;
    }
    bool open(bool object) {
        if (frames_.size() >= max_json_depth)
            throw data_error(file_ + ": field '" + path("") + "': JSON nested deeper than " + std::to_string(max_json_depth) +
                             " levels (refused before parsing)");
        frames_.push_back({object, {}, {}, 0});
        return true;
    }
    bool close() {
        frames_.pop_back();
        return value();
    }
    std::string path(const std::string& last) const {
        std::string p;
        for (std::size_t i = 0; i < frames_.size(); ++i) {
            const frame& f = frames_[i];
            const bool innermost = i + 1 == frames_.size();
            if (f.object) {
                const std::string& k = innermost ? last : f.current;
                if (k.empty() && innermost) break;
                p += (p.empty() ? "" : ".") + printable(k.size() > 40 ? k.substr(0, 40) + "..." : k);
            } else {
                p += "[" + std::to_string(f.index) + "]";
            }
        }
        if (p.size() > 60) {  // a deep path stays a short line
            p.resize(57);
            p.append("...");  // append, not operator+: GCC 12 -Wrestrict false positive
        }
        return p;
    }
    const std::string& file_;
    std::vector<frame> frames_;
};

}  // namespace

void json_prepass(const std::string& text, const std::string& file) {
    if (const std::size_t nul = text.find('\0'); nul != std::string::npos)
        throw data_error(file + ": byte " + std::to_string(nul) + ": NUL byte in a JSON text (refused)");
    prepass_handler handler(file);
    try {
        (void)nlohmann::json::sax_parse(text, &handler);
    } catch (const nlohmann::json::exception&) {
        // Syntax and range errors are reported by the parser proper, with its own message.
    }
}

std::optional<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b) {
    std::uint64_t r = 0;
    if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
    return r;
}
std::optional<std::uint64_t> checked_add(std::uint64_t a, std::uint64_t b) {
    std::uint64_t r = 0;
    if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
    return r;
}

std::uint64_t case_memory_estimate(const case_spec& spec, std::uint64_t bytes_per_value) {
    std::uint64_t values = 0;
    for (const input_tensor_layout& t : input_layout(spec)) values = sat_add(values, sat_count(t.shape));
    values = sat_add(values, sat_mul(4, sat_count(output_shape(spec))));
    values = sat_add(values, sat_mul(4, sat_count(weights_shape(spec))));
    values = sat_add(values, sat_mul(2, sat_count(lse_shape(spec))));
    return sat_mul(values, bytes_per_value);
}

void check_case_memory(const case_spec& spec, const std::string& file, std::uint64_t bytes_per_value) {
    const std::uint64_t estimate = case_memory_estimate(spec, bytes_per_value);
    if (estimate <= max_memory()) return;
    const case_shapes& d = spec.shapes;
    throw data_error(file + ": field 'shapes': the case would need about " +
                     (estimate == UINT64_MAX ? std::string("more than 2^64 bytes") : gib(estimate)) + " (B=" + std::to_string(d.batch) +
                     " H=" + std::to_string(d.heads) + " Sq=" + std::to_string(d.query_length) + " Sk=" + std::to_string(d.key_length) +
                     " dk=" + std::to_string(d.head_dim_qk) + " dv=" + std::to_string(d.head_dim_v) + "), above the limit of " +
                     gib(max_memory()) + " (raise it with --max-memory)");
}

directory_lock::directory_lock(const fs::path& dir) {
    fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd_ < 0) throw data_error(dir.string() + ": cannot open the directory to lock it: " + std::strerror(errno));
    int rc = 0;
    while ((rc = ::flock(fd_, LOCK_EX)) != 0 && errno == EINTR) {
    }
    if (rc != 0) {
        const int e = errno;
        ::close(fd_);
        throw data_error(dir.string() + ": cannot lock the directory: " + std::strerror(e));
    }
}

directory_lock::~directory_lock() {
    if (fd_ >= 0) ::close(fd_);  // closing the descriptor releases the flock
}

void write_file_atomic(const fs::path& path, const std::string& text, bool overwrite) {
    static std::atomic<unsigned long> counter{0};
    const std::string name = path.string();
    if (path.filename().empty()) throw data_error(name + ": file: path has no file name");
    fs::path tmp = path;
    std::string temporary = ".";  // appends, not operator+: GCC 12 -Wrestrict false positive
    temporary.append(path.filename().string()).append(".tmp-").append(std::to_string(::getpid()));
    temporary.append("-").append(std::to_string(counter++));
    tmp.replace_filename(temporary);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) throw data_error(name + ": file: cannot create a temporary file next to it: " + std::strerror(errno));
    std::size_t done = 0;
    bool ok = true;
    while (ok && done < text.size()) {
        const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) continue;
        ok = n > 0;
        if (ok) done += static_cast<std::size_t>(n);
    }
    const int write_errno = errno;
    ok = ::close(fd) == 0 && ok;
    if (!ok) {
        ::unlink(tmp.c_str());
        throw data_error(name + ": file: write failed: " + std::strerror(write_errno));
    }
    if (overwrite) {
        if (::rename(tmp.c_str(), path.c_str()) != 0) {
            const int e = errno;
            ::unlink(tmp.c_str());
            throw data_error(name + ": file: cannot rename the temporary file over it: " + std::strerror(e));
        }
        return;
    }
    // link(2) publishes the complete file under the final name only if that name is still free.
    const int rc = ::link(tmp.c_str(), path.c_str());
    const int e = errno;
    ::unlink(tmp.c_str());
    if (rc != 0) {
        if (e == EEXIST) throw data_error(name + ": file: exists; not overwritten (use --force)");
        throw data_error(name + ": file: cannot create it: " + std::strerror(e));
    }
}

bool same_file(const fs::path& a, const fs::path& b) {
    std::error_code ec;
    const bool r = fs::equivalent(a, b, ec);
    return !ec && r;
}

}  // namespace attnref::verify
