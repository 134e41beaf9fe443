#!/usr/bin/env bash
# One-time setup on a fresh Debian machine: build dependencies (apt), a
# Release build in build/, and the default models in models/.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
# clang, its sanitizer/fuzzer runtimes and its OpenMP: the sanitizer and fuzzing stage of scripts/test.sh.
# Open MPI: pipeline parallelism (--pipeline-parallel, docs/scaling.md) and its mpirun tests.
for pkg in cmake ninja-build g++ libgtest-dev nlohmann-json3-dev libcpp-httplib-dev libcli11-dev python3-pip \
           clang libclang-rt-dev libomp-dev curl libopenmpi-dev openmpi-bin; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
# python3-pip is only needed where no pip is on PATH already (pyenv images have one).
if python3 -m pip --version >/dev/null 2>&1; then
  need_apt=("${need_apt[@]/python3-pip}")
fi
need_apt=(${need_apt[@]+"${need_apt[@]}"})
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing: ${need_apt[*]}" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# xgrammar's C++ core from its PyPI sdist (structured outputs), once.
./scripts/build_xgrammar.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVSERVE_MPI=ON >/dev/null
cmake --build build -j"$(nproc)"
./scripts/fetch_models.sh
