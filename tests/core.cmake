# CTest registrations of the core library: soundness, floating-point environment, exhaustive math,
# PyTorch comparisons, constant evaluation, certification methods; included from tests/CMakeLists.txt.

# Floating-point environment (docs/conventions.md): a consumer built with the headers directly and
# -march=x86-64-v3 -ffp-contract=fast must refuse (naming -ffp-contract=off) or compute the
# reference bits; under FE_UPWARD it must refuse.
add_test(NAME fp_environment_consumer
  COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${PROJECT_SOURCE_DIR} -DBINARY_DIR=${CMAKE_CURRENT_BINARY_DIR}
          -DCXX=${CMAKE_CXX_COMPILER} -P ${CMAKE_CURRENT_SOURCE_DIR}/fp_environment_consumer.cmake)

# attnref::math exhaustively over all 2^32 floats, both cores: 130-160 s on this 2-core
# machine, which the CI budget (20 min for both workflows) cannot carry; label exhaustive, run by
# `ctest --preset exhaustive`. CI's `math` asserts the same per-type table at 2.5·10^5 sampled points
# (float, double; 10^6 in `math_full`).
if(NOT ATTNREF_SANITIZE)
  add_test(NAME math_exhaustive_float COMMAND math.test --run_test=exhaustive_float --log_level=message)
  set_tests_properties(math_exhaustive_float PROPERTIES LABELS "slow;exhaustive")
endif()

# An element that cannot be certified by narrowing ends `attnref generate` with exit 1 (golden/README.md:
# "an element could not be certified") and one line naming the case, tensor and index. The ad-hoc case:
# key length 0 valid keys (the row is empty) under the uniform policy, so every weight is exactly 1/3
# (computed as an interval of width ~2^-134), and output element c is exactly (v_0c + v_1c + v_2c)/3
# of float16 values; for seed 2, c = 6 is exactly halfway between two float16 numbers (found with
# Python's exact fractions from golden/README.md's splitmix64-v1 recipe, independently of attnref),
# so its float16 copy stays undecided at every rung: exit 1 (undecided), not 2 (bad input).
if(TARGET attnref_cli)
  add_test(NAME generate_uncertifiable_exits_1 COMMAND sh -c
    "$<TARGET_FILE:attnref_cli> generate --name uncertifiable_midpoint --kind sdpa --batch 1 --heads 1 --sq 1 --sk 3 --dk 1 --dv 8 --key-lengths 0 --empty-rows uniform --input-format float16 --targets float16 --seed 2 --quiet --out ${CMAKE_CURRENT_BINARY_DIR}/uncertifiable 2> ${CMAKE_CURRENT_BINARY_DIR}/uncertifiable.err; rc=$?; cat ${CMAKE_CURRENT_BINARY_DIR}/uncertifiable.err; test $rc -eq 1 && grep -q \"case 'uncertifiable_midpoint'.*tensor 'output' element (0, 0, 0, 6) target float16\" ${CMAKE_CURRENT_BINARY_DIR}/uncertifiable.err && test ! -e ${CMAKE_CURRENT_BINARY_DIR}/uncertifiable/uncertifiable_midpoint/manifest.json")
endif()

# The backward pass against PyTorch's autograd (docs/backward.md): Debian's python3-torch through the
# Debian Python (the python3 first on PATH may lack numpy and torch).
set(ATTNREF_PYTHON /usr/bin/python3 CACHE FILEPATH "Python with numpy and torch, for the PyTorch comparisons")
if(TARGET backward_torch.test)
  target_compile_definitions(backward_torch.test PRIVATE ATTNREF_PYTHON="${ATTNREF_PYTHON}")
endif()

# The seed example constant-evaluated whole (docs/compile-time.md): tests/static/seed_example.constexpr.cpp holds
# static_asserts over the constant-evaluated forward pass (rows of P sum to 1 within row_sum_bound,
# weights masked by the seed mask exactly 0) and a main() that compares it bitwise with the run-time
# result. Clang 14 evaluates the 21 M multiply-adds in about a minute; GCC 12 is far slower and uses
# far more memory (docs/compile-time.md, bench/compile_time.sh), so Clang builds it here, with the
# step limit the evaluation needs (-fconstexpr-steps; docs/compile-time.md). Not a *.static.cpp file:
# the GCC object library of the static tests must not pick it up.
# In CI the seed example's shape with d_model = 128 (head dim 16: 1.3 M multiply-adds, ≈ 7 s of Clang);
# the seed example itself (d_model = 512, 21 M, ≈ 70 s) is `seed_example_constexpr_full`, label
# exhaustive (`ctest --preset exhaustive`): CI's 20-minute budget.
if(ATTNREF_CLANGXX AND NOT ATTNREF_SANITIZE)
  foreach(_seed_test IN ITEMS seed_example_constexpr seed_example_constexpr_full)
    set(_seed_exe ${CMAKE_CURRENT_BINARY_DIR}/${_seed_test})
    if(_seed_test STREQUAL "seed_example_constexpr")
      set(_seed_dim -DATTNREF_SEED_MODEL_DIM=128)
    else()
      set(_seed_dim -DATTNREF_SEED_MODEL_DIM=512)
    endif()
    add_test(NAME ${_seed_test} COMMAND sh -c
      "rm -f ${_seed_exe} && ${ATTNREF_CLANGXX} -std=c++20 -O1 -Wall -Wextra -Wpedantic -Werror -ffp-contract=off -fconstexpr-steps=400000000 ${_seed_dim} -I${PROJECT_SOURCE_DIR}/include ${CMAKE_CURRENT_SOURCE_DIR}/static/seed_example.constexpr.cpp -o ${_seed_exe} -pthread && ${_seed_exe}")
  endforeach()
  set_tests_properties(seed_example_constexpr PROPERTIES LABELS slow TIMEOUT 900)
  set_tests_properties(seed_example_constexpr_full PROPERTIES LABELS "slow;exhaustive" TIMEOUT 900)
endif()

# The two certification methods give the same bytes (docs/fast-certify.md): `generate --method mpfi` (the MPFI
# ladder alone) on cases from every family — soft-cap (whole case to MPFI in the fast path), empty
# rows under nan, GQA, bf16 inputs with targets, MHA with biases and the seed example — writes
# tensors identical to the committed ones, which `generate` (fast path) reproduces.
if(TARGET attnref_cli AND NOT ATTNREF_SANITIZE)
  add_test(NAME generate_mpfi_method_same_bytes COMMAND sh -c
    "rm -rf mpfi_method && $<TARGET_FILE:attnref_cli> generate --suite ${PROJECT_SOURCE_DIR}/golden/suite.json --method mpfi --quiet --threads 2 --out mpfi_method --case sdpa_basic --case sdpa_softcap --case sdpa_combined_conventions --case sdpa_gqa --case mha_seed_example --case mha_cross_attention && for f in mpfi_method/*/*.npy; do cmp $f ${PROJECT_SOURCE_DIR}/golden/\${f#mpfi_method/} || exit 1; done && test $(ls mpfi_method/*/*.npy | wc -l) -gt 30 && grep -q mpfi-interval mpfi_method/sdpa_basic/manifest.json"
    WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
endif()

# The suite's certified gradients (golden backward cases, docs/backward.md): the manifest contract (version 1
# still read, version 3 refused, gradients need weights and lse, tampered grad_output refused) and the
# committed float64 gradients of three small backward cases against attnref's MPFR backward (>= 256
# bits, both algorithms) and central finite differences of the 512-bit MPFR forward. Numerics-heavy
# and its reader paths are the ones golden/hostile run under the sanitizers: optimised build only.
if(TARGET attnref_verify AND NOT ATTNREF_SANITIZE)
  add_executable(golden_gradients.test ${CMAKE_CURRENT_SOURCE_DIR}/backward/golden_gradients.test.cpp)
  target_link_libraries(golden_gradients.test PRIVATE attnref_certify_compiled Boost::unit_test_framework fmt::fmt OpenSSL::Crypto)
  target_include_directories(golden_gradients.test PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/support)
  target_compile_definitions(golden_gradients.test PRIVATE ATTNREF_SOURCE_DIR="${PROJECT_SOURCE_DIR}" ATTNREF_BINARY_DIR="${PROJECT_BINARY_DIR}")
  if(_attnref_pch_owner)
    target_precompile_headers(golden_gradients.test REUSE_FROM ${_attnref_pch_owner})
  endif()
  add_test(NAME golden_gradients COMMAND golden_gradients.test --log_level=message --report_level=short)
endif()
