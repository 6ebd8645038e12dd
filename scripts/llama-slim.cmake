# Included after each project() of the llama-cpp-python build (CMAKE_PROJECT_INCLUDE, set by
# scripts/install-backend.sh). llama-cpp-python forces llama.cpp's `common` library on (its
# CMakeLists sets the cache entry with FORCE), but its Python bindings load only libllama and
# libggml*: `common` (chat parsers, argument parsing, downloads through cpp-httplib) is compiled
# and shipped unused, a third of the compile time and cpp-httplib's with it. A normal variable
# outranks the cache entry (policies CMP0126 and CMP0077), so llama.cpp's option() reads OFF.
set(LLAMA_BUILD_COMMON OFF)
