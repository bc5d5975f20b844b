// Compiled into programs that link the static libcomfuse through find_package(comfuse): tells the library where
// the package's kernel headers are (the JIT compiles against them). comfuseConfig.cmake defines the macro.
extern "C" __attribute__((weak)) const char* comfuse_package_include_dir() { return COMFUSE_PACKAGE_INCLUDE_DIR; }
