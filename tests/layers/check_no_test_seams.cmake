# No test seam ships in the library (docs/architecture.md, "Test seams"): libengine.a
# defines no symbol whose demangled name says tamper, inject, testing or ScopedFault.
# The fault-injecting file operations, the checkpoint tampering and the throwing restore
# observer live in tests/support/ (engine_testing) and reach the library through its
# neutral interfaces. Run as: cmake -DNM=... -DLIB=.../libengine.a -P this file.
execute_process(COMMAND ${NM} -C ${LIB} RESULT_VARIABLE rc OUTPUT_VARIABLE symbols ERROR_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NM} -C ${LIB} failed (${rc})")
endif()
# Not vacuous: the listing must hold the library's own symbols.
if(NOT symbols MATCHES "engine::save_checkpoint\\(")
  message(FATAL_ERROR "${NM} -C ${LIB} lists no engine::save_checkpoint: not the engine library?")
endif()
string(REPLACE "\n" ";" lines "${symbols}")
set(found "")
set(count 0)
foreach(line IN LISTS lines)
  if(line MATCHES "tamper|inject|[Tt]esting|ScopedFault")
    math(EXPR count "${count} + 1")
    if(count LESS_EQUAL 20)
      string(APPEND found "\n  ${line}")
    endif()
  endif()
endforeach()
if(count GREATER 0)
  message(FATAL_ERROR "${LIB} holds ${count} test-seam symbol(s) (first 20):${found}")
endif()
message(STATUS "${LIB}: no test-seam symbols")
