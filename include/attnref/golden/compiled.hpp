#pragma once
/// \file golden/compiled.hpp
/// The switch between the golden module's two uses. Header-only (the CMake target attnref::golden):
/// every definition inline. Compiled (attnref::golden_compiled, which defines ATTNREF_GOLDEN_COMPILED
/// for its users): the checker's entry points and reports (check/api.hpp) and the case reader and
/// writer (golden/manifest.hpp, golden/case.hpp) are defined once in that library
/// (src/check/compiled.cpp, which also defines ATTNREF_GOLDEN_DEFINE), and the files linking it
/// see only their declarations.
///
///   ATTNREF_GOLDEN_FN      `inline` header-only, nothing compiled: on each such declaration and definition
///   ATTNREF_GOLDEN_BODIES  1 where the definitions are compiled (header-only use, or the library's file)

#if defined(ATTNREF_GOLDEN_COMPILED)
#define ATTNREF_GOLDEN_FN
#else
#define ATTNREF_GOLDEN_FN inline
#endif
#if !defined(ATTNREF_GOLDEN_COMPILED) || defined(ATTNREF_GOLDEN_DEFINE)
#define ATTNREF_GOLDEN_BODIES 1
#else
#define ATTNREF_GOLDEN_BODIES 0
#endif
