# CTest registrations owned by the hostile work (issue 9/10); included from tests/CMakeLists.txt.
