# cmake -DBUILD=<flexmodel build> -DSRC=<consumer source> -DWORK=<scratch> -P install_consumer.cmake
# Installs the build into WORK/prefix, then configures, builds and runs the
# consumer project against it with find_package(flexmodel).
file(REMOVE_RECURSE ${WORK})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message("${out}")
  set(run_out "${out}" PARENT_SCOPE)
endfunction()
run(${CMAKE_COMMAND} --install ${BUILD} --prefix ${WORK}/prefix)
foreach(f include/flex/hooks/module.h include/flex/quant/bnb_config.h include/flex/flexcore/flex_model.h lib/cmake/flexmodel/flexmodelConfig.cmake bin/flexmodel)
  if(NOT EXISTS ${WORK}/prefix/${f})
    message(FATAL_ERROR "install lacks ${f}")
  endif()
endforeach()
# The installed tool starts from its prefix alone, wherever the prefix is
# moved: its RUNPATH ($ORIGIN/../lib) finds the flexmodel libraries, with
# LD_LIBRARY_PATH cleared.
file(COPY ${WORK}/prefix/ DESTINATION ${WORK}/moved)
foreach(p prefix moved)
  run(${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH ${WORK}/${p}/bin/flexmodel --help)
  if(NOT run_out MATCHES "usage: flexmodel")
    message(FATAL_ERROR "installed flexmodel (${p}) --help printed no usage:\n${run_out}")
  endif()
endforeach()
run(${CMAKE_COMMAND} -S ${SRC} -B ${WORK}/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${WORK}/prefix)
run(${CMAKE_COMMAND} --build ${WORK}/build)
run(${WORK}/build/consumer)
