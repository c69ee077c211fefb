# CTest registrations owned by the core work (issue 9/10); included from tests/CMakeLists.txt.
