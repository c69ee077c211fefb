#pragma once
/// \file golden/safe_io.hpp
/// Owns the golden module's error types (data_error: exit 2, check_failure: exit 1) and the one
/// path by which the library and the `attnref` command read files they did not create themselves
/// (candidate .npy files, golden cases, suites, study descriptions) and write reports and cases
/// (write_file_atomic). Files come
/// from other people's kernels, artifact caches and pull requests, so every reader here:
/// - accepts regular files only (after following symlinks): a FIFO, socket or device (/dev/zero,
///   /dev/stdin) is refused before anything is read from it, so nothing blocks or streams forever;
/// - inside a golden case directory, refuses a symlink that resolves outside that directory
///   (without reading, hashing or naming what it points to);
/// - bounds memory before spending it: JSON files are capped at max_json_bytes, .npy files are read
///   through npy::read with the expected descr and shape (npy::expectation), and a case whose
///   shapes imply more than max_memory() bytes is refused up front (case_memory_estimate).
/// Every failure is a data_error (exit 2) with one line naming the file and the field.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include <stdexcept>

// Used by the definitions below.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <set>
#include <vector>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

namespace attnref::golden {

/// Usage or data error: exit code 2, what() is the one-line message.
class data_error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};
/// A check failed (e.g. --verify found a difference): exit code 1.
class check_failure : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};


/// Largest JSON file (manifest.json, suite, study description) read: 16 MiB. The largest committed
/// manifest is below 16 KiB and the suite below 64 KiB; a file near the cap is not a real manifest.
inline constexpr std::size_t max_json_bytes = std::size_t{16} << 20;
/// Deepest nesting of JSON arrays and objects accepted (a manifest needs 5 levels): deeper input is
/// refused by a non-recursive pre-pass before any recursive code (JSON DOM, error formatting) sees it.
inline constexpr std::size_t max_json_depth = 64;
/// The floor of the default memory limit: 4 GiB.
inline constexpr std::uint64_t min_default_max_memory = std::uint64_t{4} << 30;
/// Default limit on the memory one case may make a command spend (--max-memory overrides it): half
/// of the machine's physical memory, at least 4 GiB, and never above the process's address-space
/// limit (RLIMIT_AS) when one is set — an estimate above that could not be allocated anyway. On a
/// 24 GiB machine without an address-space limit: 12 GiB.
inline std::uint64_t default_max_memory();

/// The process-wide memory limit for a case (bytes), set from --max-memory.
inline std::uint64_t max_memory();
inline void set_max_memory(std::uint64_t bytes);
/// Parses a --max-memory value: bytes with an optional K, M, G or T suffix (powers of 1024), e.g.
/// "8G". Throws data_error naming the flag.
inline std::uint64_t parse_memory_size(const std::string& text, const std::string& flag);

/// `text` for a one-line message: bytes 0x00-0x1f and 0x7f as \n, \t, \r or \xNN, backslash doubled.
inline std::string printable(std::string_view text);

/// Checks that `path` is a regular file (following symlinks) and returns its size. With
/// `case_dir`, a symlink must resolve to a file inside `case_dir` (after resolving `case_dir`'s
/// own symlinks). `what` names the role in the message, e.g. "--output" or "manifest.json field
/// 'tensors[3].file'". Throws data_error naming the path.
inline std::uintmax_t require_regular_file(const std::filesystem::path& path, const std::string& what,
                                    const std::optional<std::filesystem::path>& case_dir = std::nullopt);

/// Reads a whole regular file of at most `cap` bytes (opened non-blocking and checked with fstat, so
/// a FIFO swapped in after require_regular_file cannot block either). Throws data_error naming it.
inline std::string read_file_capped(const std::filesystem::path& path, std::size_t cap,
                             const std::optional<std::filesystem::path>& case_dir = std::nullopt);

/// Non-recursive pre-pass over JSON text: refuses NUL bytes anywhere (e.g. bytes after a NUL at the
/// end of a manifest), nesting deeper than max_json_depth and duplicate keys in an object, each
/// with data_error "<file>: ..." naming the offset or field. Syntax errors are left to the parser.
inline void json_prepass(const std::string& text, const std::string& file);

/// a × b, or nullopt if it overflows 64 bits.
inline std::optional<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b);
/// a + b, or nullopt if it overflows 64 bits.
inline std::optional<std::uint64_t> checked_add(std::uint64_t a, std::uint64_t b);

/// An exclusive advisory lock (flock) on a directory, held until destruction; blocks while another
/// process holds it. Serialises concurrent `generate` runs publishing into the same --out.
class directory_lock {
public:
    explicit directory_lock(const std::filesystem::path& dir);
    ~directory_lock();
    directory_lock(const directory_lock&) = delete;
    directory_lock& operator=(const directory_lock&) = delete;

private:
    int fd_ = -1;
};

/// Writes `text` to `path` atomically (temporary file in the same directory, then rename). Without
/// `overwrite`, an existing `path` is an error and is left untouched (the final step is link(2),
/// which fails if the name exists, so a file that appears concurrently is not replaced either).
inline void write_file_atomic(const std::filesystem::path& path, std::string_view text, bool overwrite);

/// True if `a` and `b` name the same existing file (same device and inode).
inline bool same_file(const std::filesystem::path& a, const std::filesystem::path& b);


// ---------------------------------------------------------------------------------------------
// Definitions.


namespace safe_io_detail {
inline std::atomic<std::uint64_t> memory_limit{0};  ///< 0: not set, default_max_memory() applies

inline std::string gib(std::uint64_t bytes) {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, "%.3g GiB", static_cast<double>(bytes) / double(1u << 30));
    return buffer;
}

inline std::uint64_t sat_mul(std::uint64_t a, std::uint64_t b) {
    const std::optional<std::uint64_t> r = checked_mul(a, b);
    return r ? *r : UINT64_MAX;
}
inline std::uint64_t sat_add(std::uint64_t a, std::uint64_t b) {
    const std::optional<std::uint64_t> r = checked_add(a, b);
    return r ? *r : UINT64_MAX;
}
inline std::uint64_t sat_count(const std::vector<std::size_t>& shape) {
    std::uint64_t n = 1;
    for (std::size_t e : shape) n = e == 0 ? 0 : (n == 0 ? 0 : sat_mul(n, e));
    return n;
}
}  // namespace safe_io_detail
inline std::uint64_t default_max_memory() {
    std::uint64_t limit = min_default_max_memory;
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page > 0) limit = std::max(limit, safe_io_detail::sat_mul(std::uint64_t(pages), std::uint64_t(page)) / 2);
    struct rlimit as {};
    if (::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) limit = std::min(limit, std::uint64_t(as.rlim_cur));
    return limit;
}
inline std::uint64_t max_memory() {
    const std::uint64_t set = safe_io_detail::memory_limit.load();
    return set ? set : default_max_memory();
}
inline void set_max_memory(std::uint64_t bytes) { safe_io_detail::memory_limit.store(bytes); }

inline std::uint64_t parse_memory_size(const std::string& text, const std::string& flag) {
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

inline std::string printable(std::string_view text) {
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

inline std::uintmax_t require_regular_file(const std::filesystem::path& path, const std::string& what, const std::optional<std::filesystem::path>& case_dir) {
    const std::string name = path.string();
    auto fail = [&](const std::string& why) -> void { throw data_error(name + ": " + what + ": " + why); };
    std::error_code ec;
    const std::filesystem::file_status link = std::filesystem::symlink_status(path, ec);
    if (ec || !std::filesystem::exists(link)) fail("cannot open for reading (no such file)");
    if (case_dir && std::filesystem::is_symlink(link)) {
        // Where the link leads is the case's business only if it stays inside the case: the target
        // of an escaping link is neither opened, hashed nor named.
        const std::filesystem::path base = std::filesystem::canonical(*case_dir, ec);
        if (ec) fail("cannot resolve the case directory");
        const std::filesystem::path target = std::filesystem::canonical(path, ec);
        if (ec) fail("a symlink that cannot be resolved (refused)");
        auto b = base.begin(), t = target.begin();
        for (; b != base.end() && t != target.end() && *b == *t; ++b, ++t) {
        }
        if (b != base.end() || t == target.end()) fail("a symlink that resolves outside the case directory (refused)");
    }
    const std::filesystem::file_status status = std::filesystem::status(path, ec);
    if (ec) fail("cannot open for reading");
    if (std::filesystem::is_directory(status)) fail("is a directory");
    if (!std::filesystem::is_regular_file(status)) fail("not a regular file (a FIFO, socket or device is refused)");
    const std::uintmax_t size = std::filesystem::file_size(path, ec);
    if (ec) fail("cannot read its size");
    return size;
}

inline std::string read_file_capped(const std::filesystem::path& path, std::size_t cap, const std::optional<std::filesystem::path>& case_dir) {
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

namespace safe_io_detail {
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

}  // namespace safe_io_detail
inline void json_prepass(const std::string& text, const std::string& file) {
    if (const std::size_t nul = text.find('\0'); nul != std::string::npos)
        throw data_error(file + ": byte " + std::to_string(nul) + ": NUL byte in a JSON text (refused)");
    safe_io_detail::prepass_handler handler(file);
    try {
        (void)nlohmann::json::sax_parse(text, &handler);
    } catch (const nlohmann::json::exception&) {
        // Syntax and range errors are reported by the parser proper, with its own message.
    }
}

inline std::optional<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b) {
    std::uint64_t r = 0;
    if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
    return r;
}
inline std::optional<std::uint64_t> checked_add(std::uint64_t a, std::uint64_t b) {
    std::uint64_t r = 0;
    if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
    return r;
}

inline directory_lock::directory_lock(const std::filesystem::path& dir) {
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

inline directory_lock::~directory_lock() {
    if (fd_ >= 0) ::close(fd_);  // closing the descriptor releases the flock
}

inline void write_file_atomic(const std::filesystem::path& path, std::string_view text, bool overwrite) {
    static std::atomic<unsigned long> counter{0};
    const std::string name = path.string();
    if (path.filename().empty()) throw data_error(name + ": file: path has no file name");
    std::filesystem::path tmp = path;
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

inline bool same_file(const std::filesystem::path& a, const std::filesystem::path& b) {
    std::error_code ec;
    const bool r = std::filesystem::equivalent(a, b, ec);
    return !ec && r;
}

}  // namespace attnref::golden
