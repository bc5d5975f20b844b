# The one place where ComFuse pins its dependency versions. Sourced by setup.sh and gpu-check.sh.
# Debian packages (the machine image ships most of them; setup.sh installs what is missing).
COMFUSE_APT_PACKAGES="cmake ninja-build g++ libgtest-dev python3-venv"
# PyPI packages installed into the project-local virtualenv .venv
COMFUSE_PIP_PACKAGES="numpy==2.1.3 pytest==8.3.3"
# CUTLASS C++ headers (installed with --no-deps: we only want cutlass_library/source/include)
COMFUSE_CUTLASS_PIP="nvidia-cutlass==4.2.0.0"
