# Sharded generation (docs/sharding.md); included from tests/CMakeLists.txt. Each runs
# the whole committed suite once (≈ 10 s on 2 cores): the optimised build only.
if(TARGET attnref_cli AND NOT ATTNREF_SANITIZE)
  # N = 3 concurrent `generate --shard I/3` processes + `merge` = the committed suite, file for file;
  # merge refuses missing, duplicated, incomplete, foreign, tampered and mislabelled shards.
  add_test(NAME shard_merge_local COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/shard/local.sh $<TARGET_FILE:attnref_cli>
           ${PROJECT_SOURCE_DIR}/golden/suite.json ${CMAKE_CURRENT_BINARY_DIR}/shard_local)
  # The Slurm job array + merge job on a private single-node Slurm (Debian's slurm-wlm); skipped
  # (exit 77, with the reason) where its daemons cannot start.
  add_test(NAME shard_slurm COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/shard/slurm.sh $<TARGET_FILE:attnref_cli>
           ${PROJECT_SOURCE_DIR}/golden/suite.json ${CMAKE_CURRENT_BINARY_DIR}/shard_slurm ${PROJECT_SOURCE_DIR})
  set_tests_properties(shard_slurm PROPERTIES SKIP_RETURN_CODE 77 RUN_SERIAL ON)
endif()
if(NOT ATTNREF_SANITIZE)
  # The Kubernetes manifests against the API subset they use, and the check itself rejecting a
  # misspelt field and a completion count that disagrees with the shard count.
  add_test(NAME kubernetes_manifests COMMAND ${ATTNREF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/shard/kubernetes_check.py
           ${PROJECT_SOURCE_DIR}/deploy/kubernetes)
  add_test(NAME kubernetes_check_rejects_errors COMMAND sh -c
    "rm -rf k8s_bad && mkdir -p k8s_bad/a k8s_bad/b && cp ${PROJECT_SOURCE_DIR}/deploy/kubernetes/*.yaml k8s_bad/a && cp ${PROJECT_SOURCE_DIR}/deploy/kubernetes/*.yaml k8s_bad/b && sed -i 's/completionMode:/completionMod:/' k8s_bad/a/golden-shards.yaml && sed -i 's/parallelism: 8/parallelism: 4/' k8s_bad/b/golden-shards.yaml && ! ${ATTNREF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/shard/kubernetes_check.py k8s_bad/a && ! ${ATTNREF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/shard/kubernetes_check.py k8s_bad/b"
    WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
endif()
