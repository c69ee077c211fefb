# CTest registrations of decisive verdicts: which inputs a verdict is about (check --input-format,
# generate --golden --input-format) and declared policies (check --policy); included from
# tests/CMakeLists.txt. A handful of `attnref run`/`check`/`generate` calls (≈ 0.1 s each).
if(TARGET attnref_cli AND NOT ATTNREF_SANITIZE)
  add_test(NAME decisive_rounded_inputs_and_policies COMMAND ${ATTNREF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/decisive/test_rounded_inputs.py
    $<TARGET_FILE:attnref_cli> ${PROJECT_SOURCE_DIR}/golden ${CMAKE_CURRENT_BINARY_DIR}/decisive)
endif()
# FP8 inputs with per-tensor descales (generate/check --input-format fp8e4m3, the fp8e4m3_fa3_bf16 policy).
if(TARGET attnref_cli AND NOT ATTNREF_SANITIZE)
  add_test(NAME decisive_fp8_inputs COMMAND ${ATTNREF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/decisive/test_fp8_inputs.py
    $<TARGET_FILE:attnref_cli> ${PROJECT_SOURCE_DIR}/golden ${CMAKE_CURRENT_BINARY_DIR}/decisive_fp8)
endif()
# The kernel-size catalog, reduced (bench/kernel_catalog.py --reduced: two shapes, 14 FlashAttention-style
# bf16 kernels each, ≈ 15 s): correct kernels PASS declared and never FAIL; detectable bugs FAIL declared
# but for the known misses the catalog lists.
if(TARGET attnref_cli AND NOT ATTNREF_SANITIZE)
  add_test(NAME kernel_catalog_reduced COMMAND ${ATTNREF_PYTHON} ${PROJECT_SOURCE_DIR}/bench/kernel_catalog.py
    $<TARGET_FILE:attnref_cli> ${CMAKE_CURRENT_BINARY_DIR}/kernel_catalog --reduced)
endif()
# Weights and lse under the kernel's own policy and undeclared in its format (tests/decisive/
# measure_weights_lse.sh on three cases and five policies, ≈ 20 s; the full table: docs/verdicts-by-format.md).
if(TARGET attnref_cli AND NOT ATTNREF_SANITIZE)
  add_test(NAME decisive_weights_lse_follow_the_policy COMMAND ${PROJECT_SOURCE_DIR}/tests/decisive/measure_weights_lse.sh
    $<TARGET_FILE:attnref_cli> "sdpa_[bst][aod]*" bf16 fp16 bf16_materialised fp32_p_fp8e4m3_s256 fp8e4m3_fa3_bf16)
endif()
