# CTest registrations owned by the checker work (issue 9/10); included from tests/CMakeLists.txt.
