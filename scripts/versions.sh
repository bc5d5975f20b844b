# The one place where ComFuse pins its dependency versions. Sourced by setup.sh and gpu-check.sh.
# Debian packages (the machine image ships most of them; setup.sh installs what is missing).
COMFUSE_APT_PACKAGES="cmake ninja-build g++ libgtest-dev python3-venv"
# PyPI packages installed into the project-local virtualenv .venv
COMFUSE_PIP_PACKAGES="numpy==2.1.3 pytest==8.3.3 nanobind==2.9.2 scikit-build-core==0.11.6"
# PyTorch for the frontend (python/comfuse) and its CPU tests: the GPU machine's version. PyPI's wheel is a CUDA
# build; it is installed with --no-deps plus its pure-Python deps and only the three CUDA libraries the machine's
# CUDA toolkit lacks (the toolkit provides cudart, cuBLAS, cuDNN, NCCL, ...), not the several GB of nvidia-*
# wheels; triton is not needed on CPU.
COMFUSE_TORCH_PIP="torch==2.11.0"
COMFUSE_TORCH_DEPS="filelock==4.3.1 typing-extensions==4.16.0 sympy==1.14.0 mpmath==1.3.0 networkx==3.6.1 jinja2==3.1.6 markupsafe==3.0.4 fsspec==2026.9.0"
COMFUSE_TORCH_CUDA_LIBS="nvidia-cufile==1.15.1.6 nvidia-cusparselt-cu13==0.8.0 nvidia-nvshmem-cu13==3.4.5"
# Test dependency: Hugging Face transformers for the real-architecture tests (tests/python/test_hf_models.py builds
# BERT, Llama and GPT-2 from configs with random weights; nothing is downloaded) and bench/hf_models_bench.py.
# Pure Python; pip resolves its own dependencies (tokenizers, safetensors, huggingface-hub, ...). The GPU machine
# uses the transformers its image has.
COMFUSE_TEST_PIP="transformers==5.23.0"
# Plots of the benchmark results (bench/plot_perf.py), on the CPU machine
COMFUSE_PLOT_PIP="matplotlib==3.11.2 contourpy==1.3.3 cycler==0.12.1 fonttools==4.68.0 kiwisolver==1.5.1 pillow==13.0.0 pyparsing==3.3.3 python-dateutil==4.0.0 tzdata==2026.6"
# SASS tools for scripts/sass-diff.sh and reading generated kernels (the toolkit here ships without cuobjdump);
# 13.2 is the oldest PyPI has and reads sm_90a cubins of nvcc 13.0
COMFUSE_SASS_PIP="nvidia-cuda-cuobjdump==13.2.51 nvidia-cuda-nvdisasm==13.2.51"
# CUTLASS C++ headers (installed with --no-deps: we only want cutlass_library/source/include)
COMFUSE_CUTLASS_PIP="nvidia-cutlass==4.2.0.0"
