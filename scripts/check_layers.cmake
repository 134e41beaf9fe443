# Fails when a file under src/ includes a folder its layer does not link.
#   cmake -DLAYERS_FILE=build/layers.cmake -DSOURCE_DIR=. -P scripts/check_layers.cmake
# LAYERS_FILE sets KVSERVE_LAYERS and KVSERVE_LAYER_EXCEPTIONS as CMakeLists.txt
# defines them (the build writes it); every build runs this before compiling
# the libraries. Static libraries alone would not catch a wrong-way include:
# every target sees all of src/.
cmake_minimum_required(VERSION 3.22)  # IN_LIST, list(POP_FRONT)
include(${LAYERS_FILE})

# A layer may include itself and everything the layers it names may include.
set(layers "")
foreach(entry IN LISTS KVSERVE_LAYERS)
  string(REGEX MATCHALL "[^ \t]+" deps "${entry}")
  list(POP_FRONT deps layer)
  set(reach_${layer} ${layer})
  foreach(dep IN LISTS deps)
    list(APPEND reach_${layer} ${reach_${dep}})
  endforeach()
  list(REMOVE_DUPLICATES reach_${layer})
  list(APPEND layers ${layer})
endforeach()

set(exceptions "")
foreach(entry IN LISTS KVSERVE_LAYER_EXCEPTIONS)
  string(REGEX REPLACE "[ \t]+" " " entry "${entry}")
  list(APPEND exceptions "${entry}")
endforeach()

file(GLOB_RECURSE files RELATIVE ${SOURCE_DIR}/src ${SOURCE_DIR}/src/*.h ${SOURCE_DIR}/src/*.cpp)
list(SORT files)
set(errors "")
foreach(file IN LISTS files)
  string(REGEX MATCH "^[^/]+" folder "${file}")
  if(NOT folder IN_LIST layers)
    list(APPEND errors "src/${file}: the folder src/${folder}/ is not in KVSERVE_LAYERS (CMakeLists.txt)")
    continue()
  endif()
  file(STRINGS ${SOURCE_DIR}/src/${file} lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"[^\"/]+/")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*" "\\1" header "${line}")
    string(REGEX MATCH "^[^/]+" included "${header}")
    # Quoted includes of other projects' folders (none today) are not ours to check.
    if(NOT IS_DIRECTORY ${SOURCE_DIR}/src/${included} AND NOT IS_DIRECTORY ${SOURCE_DIR}/${included})
      continue()
    endif()
    if(included IN_LIST reach_${folder} OR "${file} ${header}" IN_LIST exceptions)
      continue()
    endif()
    list(JOIN reach_${folder} ", " allowed)
    list(APPEND errors "src/${file}: #include \"${header}\": ${folder} does not link ${included} (it may include ${allowed})")
  endforeach()
endforeach()

if(errors)
  list(JOIN errors "\n  " message)
  message(FATAL_ERROR "wrong-way includes (layers in CMakeLists.txt, KVSERVE_LAYERS; docs/architecture.md):\n  ${message}\n")
endif()
