#pragma once
/// \file golden/sha256.hpp
/// Owns SHA-256 digests for the golden manifest, through OpenSSL's EVP interface (link
/// OpenSSL::Crypto). The digest is returned as 64 lowercase hex digits, the form sha256sum prints
/// and the manifest stores.
///
///     attnref::golden::sha256_hex(std::as_bytes(std::span(std::string_view("abc"))))
///     // "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"

#include <array>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>

#include <openssl/evp.h>

namespace attnref::golden {

namespace detail {

/// An EVP_MD_CTX initialised for SHA-256; every OpenSSL failure throws std::runtime_error.
class sha256_context {
public:
    sha256_context() : context_(EVP_MD_CTX_new(), &EVP_MD_CTX_free) {
        if (!context_ || EVP_DigestInit_ex(context_.get(), EVP_sha256(), nullptr) != 1)
            throw std::runtime_error("sha256: OpenSSL EVP_DigestInit_ex failed");
    }

    void update(std::span<const std::byte> bytes) {
        if (!bytes.empty() && EVP_DigestUpdate(context_.get(), bytes.data(), bytes.size()) != 1)
            throw std::runtime_error("sha256: OpenSSL EVP_DigestUpdate failed");
    }

    std::string hex() {
        std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
        unsigned int length = 0;
        if (EVP_DigestFinal_ex(context_.get(), digest.data(), &length) != 1 || length != 32)
            throw std::runtime_error("sha256: OpenSSL EVP_DigestFinal_ex failed");
        constexpr char digits[] = "0123456789abcdef";
        std::string out;
        out.reserve(2 * length);
        for (unsigned int i = 0; i < length; ++i) {
            out += digits[digest[i] >> 4];
            out += digits[digest[i] & 0xf];
        }
        return out;
    }

private:
    std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> context_;
};

}  // namespace detail

/// SHA-256 of `bytes` as 64 lowercase hex digits.
inline std::string sha256_hex(std::span<const std::byte> bytes) {
    detail::sha256_context context;
    context.update(bytes);
    return context.hex();
}

/// SHA-256 of the file's contents as 64 lowercase hex digits, read in 64 KiB blocks.
/// Throws std::runtime_error naming the path if it is not a regular file or cannot be opened or read.
inline std::string sha256_file(const std::filesystem::path& path) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
        throw std::runtime_error(path.string() + ": sha256: is a directory");
    // Regular files only: a FIFO would block and a device such as /dev/zero never ends.
    if (!std::filesystem::is_regular_file(path, ec))
        throw std::runtime_error(path.string() + ": sha256: not a regular file");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error(path.string() + ": sha256: cannot open for reading");
    detail::sha256_context context;
    std::array<char, 65536> buffer;
    while (in) {
        in.read(buffer.data(), buffer.size());
        context.update(std::as_bytes(std::span(buffer.data(), static_cast<std::size_t>(in.gcount()))));
    }
    if (in.bad()) throw std::runtime_error(path.string() + ": sha256: read error");
    return context.hex();
}

}  // namespace attnref::golden
