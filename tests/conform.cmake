# Conformance of real implementations (docs/conformance.md): the CPU table regenerated with the
# adapters of tools/conform (PyTorch CPU, the seed chapter's NumPy class; ONNX Runtime when
# tools/conform/node_modules holds onnxruntime-node, else one line saying it is skipped) and its
# verdicts compared with the committed docs/conformance.json: a changed verdict fails. About 40 s on 2 cores.
if(TARGET attnref_cli AND NOT ATTNREF_SANITIZE)  # the optimised build's command; once is enough
add_test(NAME conformance_cpu
  COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tools/conform/conform.py --attnref $<TARGET_FILE:attnref_cli>
          --golden-dir ${PROJECT_SOURCE_DIR}/golden --compare ${PROJECT_SOURCE_DIR}/docs/conformance.json --jobs 2)
set_tests_properties(conformance_cpu PROPERTIES TIMEOUT 180 ENVIRONMENT "PYTHONDONTWRITEBYTECODE=1")
endif()
