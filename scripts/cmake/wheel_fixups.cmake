# Injected by scripts/bootstrap.sh (-DCMAKE_PROJECT_INCLUDE=...) when msg/ is built with plain
# cmake against the ROS 2 wheels from PyPI. Not used by colcon on a real ROS 2 install.
#
# Trap: the wheels' exported CMake targets (<pkg>::<pkg>__rosidl_generator_py) carry the
# Python and NumPy include dirs of the machine that built the wheels
# (/opt/python/cp3XX-cp3XX/...). CMake refuses at generate time an imported target whose
# INTERFACE_INCLUDE_DIRECTORIES names a path that does not exist. Once the CMakeLists has
# run (deferred call) we rewrite every such path on every imported target to this
# interpreter's include dir (Python) or numpy.get_include() (NumPy), and drop any other
# missing path. Nothing is written outside the build tree.

if(NOT Python3_EXECUTABLE)
  message(FATAL_ERROR "wheel_fixups.cmake: pass -DPython3_EXECUTABLE=<venv python>")
endif()

execute_process(
  COMMAND "${Python3_EXECUTABLE}" -c
    "import sysconfig, numpy; print(sysconfig.get_paths()['include'] + ';' + numpy.get_include(), end='')"
  OUTPUT_VARIABLE _seqai_py_incs
  RESULT_VARIABLE _seqai_rc)
if(NOT _seqai_rc EQUAL 0)
  message(FATAL_ERROR "wheel_fixups.cmake: cannot query Python/NumPy include dirs from ${Python3_EXECUTABLE}")
endif()
list(GET _seqai_py_incs 0 SEQAI_PYTHON_INCLUDE_DIR)
list(GET _seqai_py_incs 1 SEQAI_NUMPY_INCLUDE_DIR)
if(NOT EXISTS "${SEQAI_PYTHON_INCLUDE_DIR}/Python.h")
  message(FATAL_ERROR "wheel_fixups.cmake: ${SEQAI_PYTHON_INCLUDE_DIR}/Python.h missing (install python3-dev)")
endif()

function(_seqai_fix_wheel_targets)
  get_property(_targets DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}" PROPERTY IMPORTED_TARGETS)
  set(_fixed 0)
  foreach(_t IN LISTS _targets)
    get_target_property(_inc "${_t}" INTERFACE_INCLUDE_DIRECTORIES)
    if(NOT _inc)
      continue()
    endif()
    set(_new "")
    set(_changed FALSE)
    foreach(_d IN LISTS _inc)
      if(_d MATCHES "^\\$<" OR EXISTS "${_d}")
        list(APPEND _new "${_d}")
      elseif(_d MATCHES "numpy")
        list(APPEND _new "${SEQAI_NUMPY_INCLUDE_DIR}")
        set(_changed TRUE)
      elseif(_d MATCHES "/include/python3")
        list(APPEND _new "${SEQAI_PYTHON_INCLUDE_DIR}")
        set(_changed TRUE)
      else()
        set(_changed TRUE)  # some other path of the wheel builder: drop it
      endif()
    endforeach()
    if(_changed)
      list(REMOVE_DUPLICATES _new)
      set_target_properties("${_t}" PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_new}")
      math(EXPR _fixed "${_fixed} + 1")
    endif()
  endforeach()
  message(STATUS "wheel_fixups: rewrote include dirs of ${_fixed} imported targets")
endfunction()

cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL _seqai_fix_wheel_targets)
