#pragma once
/// \file core/tensor.hpp
/// Storage and shapes. Every algorithm in attnref reads and writes through `tensor_view<T, Rank>`:
/// a pointer and row-major extents (the last index varies fastest). Two owners produce views:
/// - `tensor<T, Rank>`: run-time extents, contiguous heap storage (std::vector), for realistic sizes;
/// - `fixed_tensor<T, Extents...>`: extents as template parameters, std::array storage, a literal type
///   for compile-time evaluation.
/// So there is one copy of the math, whichever storage holds the numbers.

#include <array>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace attnref {

/// Thrown for run-time shape errors; the message names the dimension and what was expected.
class shape_error : public std::invalid_argument {
public:
    using std::invalid_argument::invalid_argument;
};

template <std::size_t Rank>
using extents_t = std::array<std::size_t, Rank>;

/// Product of the extents. Throws shape_error if it overflows std::size_t (so no tensor is ever
/// allocated, nor a view indexed, with a wrapped-around size): an extent of 0 makes the product 0
/// whatever the others are.
template <std::size_t Rank>
constexpr std::size_t element_count(const extents_t<Rank>& extents) {
    std::size_t n = 1;
    bool overflow = false;
    for (std::size_t e : extents) {
        if (e == 0) return 0;
        if (n > static_cast<std::size_t>(-1) / e) overflow = true;
        n *= e;
    }
    if (overflow) throw shape_error("tensor extents: the element count overflows std::size_t");
    return n;
}

/// Non-owning row-major view. `T` may be const-qualified.
template <class T, std::size_t Rank>
struct tensor_view {
    T* data = nullptr;
    extents_t<Rank> extents{};

    constexpr std::size_t size() const { return element_count(extents); }
    constexpr std::size_t extent(std::size_t axis) const { return extents[axis]; }
    /// A default-constructed view (all extents 0) stands for "no tensor". Decided by the extents, not
    /// by comparing the pointer, so it is a constant expression for views of temporaries too.
    constexpr bool empty() const { return size() == 0; }

    /// Linear offset of a multi-index; row-major. (A fold, not a loop over a temporary index array:
    /// the constant evaluator pays per operation. Hot loops take a row pointer once, data +
    /// offset(…, 0), and walk it.)
    template <class... I>
        requires(sizeof...(I) == Rank)
    constexpr std::size_t offset(I... index) const {
        std::size_t off = 0, axis = 0;
        ((off = off * extents[axis++] + static_cast<std::size_t>(index)), ...);
        return off;
    }
    template <class... I>
        requires(sizeof...(I) == Rank)
    constexpr T& operator()(I... index) const {
        return data[offset(index...)];
    }
    constexpr T& operator[](std::size_t linear) const { return data[linear]; }

    constexpr operator tensor_view<const T, Rank>() const
        requires(!std::is_const_v<T>)
    {
        return {data, extents};
    }
};

/// Owning tensor with run-time extents and contiguous storage.
template <class T, std::size_t Rank>
class tensor {
public:
    constexpr tensor() = default;
    constexpr explicit tensor(const extents_t<Rank>& extents, const T& fill = T(0))
        : extents_(extents), storage_(element_count(extents), fill) {}

    constexpr tensor_view<T, Rank> view() { return {storage_.data(), extents_}; }
    constexpr tensor_view<const T, Rank> view() const { return {storage_.data(), extents_}; }
    constexpr operator tensor_view<const T, Rank>() const { return view(); }

    template <class... I>
    constexpr T& operator()(I... index) { return view()(index...); }
    template <class... I>
    constexpr const T& operator()(I... index) const { return view()(index...); }
    constexpr T& operator[](std::size_t linear) { return storage_[linear]; }
    constexpr const T& operator[](std::size_t linear) const { return storage_[linear]; }

    constexpr const extents_t<Rank>& extents() const { return extents_; }
    constexpr std::size_t extent(std::size_t axis) const { return extents_[axis]; }
    constexpr std::size_t size() const { return storage_.size(); }
    constexpr T* data() { return storage_.data(); }
    constexpr const T* data() const { return storage_.data(); }
    constexpr std::vector<T>& storage() { return storage_; }
    constexpr const std::vector<T>& storage() const { return storage_; }

private:
    extents_t<Rank> extents_{};
    std::vector<T> storage_;
};

/// Owning tensor with extents fixed at compile time; a literal type when T is.
template <class T, std::size_t... Extents>
struct fixed_tensor {
    static constexpr std::size_t rank = sizeof...(Extents);
    static constexpr extents_t<rank> extents{Extents...};
    std::array<T, (Extents * ... * std::size_t{1})> values{};

    constexpr tensor_view<T, rank> view() { return {values.data(), extents}; }
    constexpr tensor_view<const T, rank> view() const { return {values.data(), extents}; }
    template <class... I>
    constexpr T& operator()(I... index) { return view()(index...); }
    template <class... I>
    constexpr const T& operator()(I... index) const { return view()(index...); }
};

/// Copies a view into an owning tensor (element type converted with static_cast).
template <class To, class From, std::size_t Rank>
constexpr tensor<To, Rank> to_tensor(tensor_view<From, Rank> source) {
    tensor<To, Rank> result(source.extents);
    for (std::size_t n = 0; n < source.size(); ++n) result[n] = static_cast<To>(source[n]);
    return result;
}

namespace detail {
inline std::string describe_extent(const char* what, std::size_t got, std::size_t expected) {
    return std::string(what) + ": expected " + std::to_string(expected) + ", got " + std::to_string(got);
}
}  // namespace detail

/// Throws shape_error naming `what` (prefixed by `owner` and a space when given) unless got == expected.
/// The message is only built on failure, so the check is usable in constant evaluation.
constexpr void require_extent(const char* what, std::size_t got, std::size_t expected, const char* owner = nullptr) {
    if (got != expected)
        throw shape_error(detail::describe_extent((owner ? std::string(owner) + " " + what : std::string(what)).c_str(), got, expected));
}

}  // namespace attnref
