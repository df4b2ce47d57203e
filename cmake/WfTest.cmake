# wf_add_test(NAME name LABELS l1 [l2] SOURCES s.c... [LIBS lib...] [TIMEOUT s] [SKIP_RC 77])
# One Criterion executable per call, registered with CTest under the given labels (label gpu: never
# two at once, see below). Tests find the
# repository (test data lies in tests/data/) and the build tree through the environment.
# Only a build with tests needs Criterion (a container's build stage has none: -DWF_TESTS=OFF).
if(WF_TESTS)
  find_library(CRITERION_LIB criterion REQUIRED)
endif()
function(wf_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "LABELS;SOURCES;LIBS" ${ARGN})
  if(NOT WF_TESTS)
    return()
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} ${CRITERION_LIB} Threads::Threads)
  if(WF_SANITIZE STREQUAL "thread")
    # Criterion's sandbox cannot place its arenas under TSan without this (the file says why).
    target_sources(${T_NAME} PRIVATE ${PROJECT_SOURCE_DIR}/tests/common/tsan_criterion.c)
    target_link_libraries(${T_NAME} PRIVATE ${CMAKE_DL_LIBS})
  endif()
  target_include_directories(${T_NAME} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  add_test(NAME ${T_NAME} COMMAND ${T_NAME} --jobs 1)
  set_tests_properties(${T_NAME} PROPERTIES
    LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT} SKIP_RETURN_CODE 77
    ENVIRONMENT "WF_SOURCE_DIR=${PROJECT_SOURCE_DIR};WF_BUILD_DIR=${PROJECT_BINARY_DIR}")
  # GPU tests never run at the same time: the contract tests assert that cudaMemGetInfo returns
  # to its baseline, and free memory is device-wide, so another GPU test process (a context alone
  # takes hundreds of MB; the kernel and engine suites allocate gigabytes) would move it. Every
  # test labelled gpu takes the resource lock "gpu", so `ctest -j N` runs them one after another
  # (other labels still run beside them). Keyed on the label, so a new gpu test needs nothing.
  if("gpu" IN_LIST T_LABELS)
    set_tests_properties(${T_NAME} PROPERTIES RESOURCE_LOCK gpu)
  endif()
endfunction()
