#pragma once
/// \file core/name_table.hpp
/// Owns: (name, value) tables for enumerations — the one way attnref names an enum value and
/// parses a name back: name_in(table, e) and value_in(table, n). A table is a plain array of
/// std::pair<const char*, E>, so readers can also list it ("one of float64, float32, …",
/// names_of(table) for a command line's choices). Each enum's table stands beside the enum
/// (e.g. softmax_algorithm_names in softmax.hpp).

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace attnref {

/// The name of e in the table ("?" when it is not listed); a view of the table's NUL-terminated literal.
template <class E, std::size_t N>
constexpr std::string_view name_in(const std::pair<const char*, E> (&table)[N], E e) {
    for (const auto& [name, value] : table)
        if (value == e) return name;
    return "?";
}

/// The value called n in the table, or nullopt.
template <class E, std::size_t N>
constexpr std::optional<E> value_in(const std::pair<const char*, E> (&table)[N], std::string_view n) {
    for (const auto& [name, value] : table)
        if (n == name) return value;
    return std::nullopt;
}

/// The table's names in its order (a command line's list of choices).
template <class E, std::size_t N>
std::vector<std::string> names_of(const std::pair<const char*, E> (&table)[N]) {
    std::vector<std::string> names;
    for (const auto& entry : table) names.emplace_back(entry.first);
    return names;
}

}  // namespace attnref
