# CTest registrations of the checker (include/attnref/check/, `attnref check`); included from tests/CMakeLists.txt.
if(TARGET attnref_verify)
  # The bug catalog (tests/runtime/bug_catalog.test.cpp) judges wrong implementations with the
  # checker's library code: one CTest test per candidate format and declared policy, so
  # that they run in parallel.
  if(TARGET bug_catalog.test)  # not in the sanitizer build (tests/CMakeLists.txt)
    target_link_libraries(bug_catalog.test PRIVATE attnref_certify_compiled)
    set_tests_properties(bug_catalog PROPERTIES DISABLED ON)  # the seven below run the same test cases
    foreach(_f float64 float32 bfloat16 float16 bf16_fp32acc fp16_fp32acc fp8)
      add_test(NAME bug_catalog_${_f} COMMAND bug_catalog.test --run_test=${_f}_candidates --log_level=message --report_level=short)
    endforeach()
  endif()

  # A shell command run after checker_cli_prepare (the candidates it writes under ${_t}).
  function(checker_cli_test name script)
    add_test(NAME ${name} COMMAND sh -c "${script}")
    set_tests_properties(${name} PROPERTIES FIXTURES_REQUIRED checker_cli)
  endfunction()
  set(_g ${PROJECT_SOURCE_DIR}/golden/sdpa_basic)
  set(_t ${CMAKE_CURRENT_BINARY_DIR}/checker_cli)
  # The bound cache is gone: its flags are usage errors (exit 2), and a file where the cache used to
  # be has no effect (bounds are recomputed every run; check.test shows a forged bound cannot pass).
  add_test(NAME checker_cli_prepare COMMAND /usr/bin/python3 -c
    "import numpy as n,os,shutil;d='${_t}';shutil.rmtree(d,ignore_errors=True);os.makedirs(d);o=n.load('${_g}/output.npy');n.save(d+'/ok.npy',o.astype(n.float32));n.save(d+'/off.npy',(o+0.05).astype(n.float32));w=n.load('${_g}/weights.npy');n.save(d+'/w.npy',w.astype(n.float32));n.save(d+'/offset.npy',n.load('${PROJECT_SOURCE_DIR}/golden/sdpa_adv_logit_offset_1000/output.npy').astype(n.float32))")
  set_tests_properties(checker_cli_prepare PROPERTIES FIXTURES_SETUP checker_cli)
  foreach(_pair "no_cache:--no-cache" "cache_dir:--cache-dir ${_t}/cache" "verbose:--verbose")
    string(FIND "${_pair}" ":" _at)
    string(SUBSTRING "${_pair}" 0 ${_at} _id)
    math(EXPR _at "${_at} + 1")
    string(SUBSTRING "${_pair}" ${_at} -1 _args)
    checker_cli_test(checker_cli_removed_${_id} "$<TARGET_FILE:attnref_cli> check --golden ${_g} --output ${_t}/ok.npy ${_args}; test $? -eq 2")
  endforeach()
  # A forged entry in the old cache location, keyed exactly as the removed cache keyed it (bounds
  # 1e300 for this case, float32, data-aware: the old code read it and passed), does not make a
  # candidate off by 0.05 everywhere pass.
  checker_cli_test(checker_cli_forged_cache_ignored
    "/usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/checker_forge_cache.py ${_t}/xdg ${PROJECT_SOURCE_DIR}/include/attnref/bounds/tolerance.hpp ${_g} 256 1e300 && XDG_CACHE_HOME=${_t}/xdg $<TARGET_FILE:attnref_cli> check --golden ${_g} --output ${_t}/off.npy; test $? -eq 1")
  # JSON and JUnit carry the verdict: PASS for a float32 copy of the reference.
  checker_cli_test(checker_cli_verdict_reports
    "$<TARGET_FILE:attnref_cli> check --golden ${_g} --output ${_t}/ok.npy --json ${_t}/ok.json --junit ${_t}/ok.xml && grep -q '\"verdict\": \"PASS\"' ${_t}/ok.json && grep -q 'name=\"verdict\" value=\"PASS\"' ${_t}/ok.xml")
  # INCONCLUSIVE (exit 1, in the table, JSON and JUnit): a bfloat16 candidate on a case whose
  # logits sit near 1000 (bf16 cannot resolve them: the bound is larger than the outputs).
  checker_cli_test(checker_cli_inconclusive
    "$<TARGET_FILE:attnref_cli> check --golden ${PROJECT_SOURCE_DIR}/golden/sdpa_adv_logit_offset_1000 --output ${_t}/offset.npy --dtype bfloat16 --json ${_t}/inc.json --junit ${_t}/inc.xml > ${_t}/inc.txt; test $? -eq 1 && grep -q '^INCONCLUSIVE: ' ${_t}/inc.txt && grep -q '\"verdict\": \"INCONCLUSIVE\"' ${_t}/inc.json && grep -q 'type=\"INCONCLUSIVE\"' ${_t}/inc.xml")
  # --empty-row-lse: a FlashAttention 2/3 candidate (lse = +inf on fully masked rows) passes with
  # +inf (and any), fails with the default -inf; attnref's own candidate (-inf) fails with +inf.
  set(_e ${PROJECT_SOURCE_DIR}/golden/sdpa_empty_rows_zero)
  checker_cli_test(checker_cli_empty_row_lse
    "/usr/bin/python3 -c \"import numpy as n;d='${_e}/';l=n.load(d+'lse.npy');n.save('${_t}/fa_lse.npy',n.where(n.isneginf(l),n.inf,l).astype(n.float32));n.save('${_t}/e_out.npy',n.load(d+'output.npy').astype(n.float32));n.save('${_t}/e_w.npy',n.load(d+'weights.npy').astype(n.float32));n.save('${_t}/e_lse.npy',l.astype(n.float32))\" && c='$<TARGET_FILE:attnref_cli> check --golden ${_e} --output ${_t}/e_out.npy --weights ${_t}/e_w.npy' && $c --lse ${_t}/fa_lse.npy --empty-row-lse +inf && $c --lse ${_t}/fa_lse.npy --empty-row-lse any && $c --lse ${_t}/e_lse.npy && { $c --lse ${_t}/fa_lse.npy; test $? -eq 1; } && { $c --lse ${_t}/e_lse.npy --empty-row-lse +inf; test $? -eq 1; }")
  # The declared convention holds for the lse alone (no --weights, so no P = exp(S - lse) invariant):
  # attnref's -inf in the empty rows fails under +inf, FlashAttention's +inf under the default -inf.
  checker_cli_test(checker_cli_empty_row_lse_alone
    "/usr/bin/python3 -c \"import numpy as n;d='${_e}/';l=n.load(d+'lse.npy');n.save('${_t}/fa_lse1.npy',n.where(n.isneginf(l),n.inf,l).astype(n.float32));n.save('${_t}/e_out1.npy',n.load(d+'output.npy').astype(n.float32));n.save('${_t}/e_lse1.npy',l.astype(n.float32))\" && c='$<TARGET_FILE:attnref_cli> check --golden ${_e} --output ${_t}/e_out1.npy' && $c --lse ${_t}/fa_lse1.npy --empty-row-lse +inf && $c --lse ${_t}/e_lse1.npy && { $c --lse ${_t}/e_lse1.npy --empty-row-lse +inf > ${_t}/lse1.txt; test $? -eq 1; } && grep -q 'empty rows without the declared lse (+inf)' ${_t}/lse1.txt && { $c --lse ${_t}/fa_lse1.npy; test $? -eq 1; }")
  # Each file is judged in its own format: on sdpa_bwd_gqa a float64 output with one element x1.001
  # fails alone, and still fails beside a correct float16 grad_query (which passes alone); the JSON
  # gives each tensor's dtype and the header says "mixed".
  set(_b ${PROJECT_SOURCE_DIR}/golden/sdpa_bwd_gqa)
  checker_cli_test(checker_cli_per_tensor_format
    "/usr/bin/python3 -c \"import numpy as n;d='${_b}/';o=n.load(d+'output.npy');o.flat[5]*=1.001;n.save('${_t}/gqa_out64.npy',o);n.save('${_t}/gqa_dq16.npy',n.load(d+'grad_query.npy').astype(n.float16))\" && c='$<TARGET_FILE:attnref_cli> check --golden ${_b}' && $c --grad-query ${_t}/gqa_dq16.npy && { $c --output ${_t}/gqa_out64.npy; test $? -eq 1; } && { $c --grad-query ${_t}/gqa_dq16.npy --output ${_t}/gqa_out64.npy --json ${_t}/gqa.json --force; test $? -eq 1; } && grep -q '\"dtype\": \"float16\"' ${_t}/gqa.json && grep -q '\"candidate_dtype\": \"mixed\"' ${_t}/gqa.json")
  # Numeric options: --max-memory refuses NaN, negative, infinite, out-of-range and empty values
  # (exit 2, naming the flag) instead of falling back to the default.
  checker_cli_test(checker_cli_numeric_options
    "for v in nan -1 inf -inf 1e400 0 ''; do $<TARGET_FILE:attnref_cli> check --golden ${_g} --output ${_t}/ok.npy --max-memory \"$v\" 2> ${_t}/mm.err; r=$?; test $r -eq 2 && grep -q -- '--max-memory' ${_t}/mm.err || { echo \"--max-memory '$v': exit $r\"; exit 1; }; done")
endif()
