/// The compiled study point (the build's internal CMake target attnref_study_compiled): run_point()
/// (study/study.hpp), which instantiates the measurements for every precision policy, defined once
/// here as an external function. `attnref study` and study.test link the target and include
/// study/study.hpp as usual.
#define ATTNREF_STUDY_DEFINE
#include "attnref/study/study.hpp"
