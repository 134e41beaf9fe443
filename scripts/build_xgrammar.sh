#!/usr/bin/env bash
# Builds xgrammar's C++ core (the grammar engine of vLLM, SGLang and
# TensorRT-LLM; Apache-2.0) as a static library from its PyPI sdist, with the
# Python bindings off, into .deps/xgrammar/ (git-ignored): lib/libxgrammar.a and
# include/. CMake finds it there (KVSERVE_XGRAMMAR_ROOT); without it kvserve
# builds but refuses structured-output requests. docs/structured_output.md
# says why xgrammar.
#   usage: scripts/build_xgrammar.sh            (does nothing when already built)
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.2.9
SHA256=87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90
prefix=.deps/xgrammar
stamp="$prefix/.built-$VERSION"
[ -f "$stamp" ] && exit 0

mkdir -p .deps/cache
sdist=.deps/cache/xgrammar-$VERSION.tar.gz
if [ ! -s "$sdist" ]; then
  echo "fetching xgrammar $VERSION (PyPI sdist)..." >&2
  # The sdist's address from PyPI's simple index: pip itself would try to
  # build the Python package to read its metadata.
  url=$(curl -fsSL "https://pypi.org/simple/xgrammar/" | grep -o "https://[^\"#]*/xgrammar-$VERSION\.tar\.gz" | head -1 || true)
  if [ -n "$url" ] && curl -fsSL -o "$sdist.part" "$url"; then
    mv "$sdist.part" "$sdist"
  else
    # Through pip's own index settings (a mirror, a proxy); slower: pip prepares the package's metadata.
    python3 -m pip download --quiet --no-deps --no-binary :all: -d .deps/cache "xgrammar==$VERSION"
  fi
  [ -s "$sdist" ] || { echo "build_xgrammar.sh: could not fetch xgrammar-$VERSION.tar.gz from PyPI" >&2; exit 1; }
fi
echo "$SHA256  $sdist" | sha256sum --check --quiet

src=.deps/xgrammar-$VERSION
rm -rf "$src" "$prefix"
tar -xzf "$sdist" -C .deps
# A config.cmake in the build folder is read first; the sdist's own turns the
# Python bindings on whatever the command line says.
mkdir -p "$src/build"
printf 'set(XGRAMMAR_BUILD_PYTHON_BINDINGS OFF)\nset(XGRAMMAR_BUILD_CXX_TESTS OFF)\n' >"$src/build/config.cmake"
# -fno-lto: a GCC LTO archive would not link into the clang sanitizer build;
# -Wno-error: its -Werror must not fail on a newer compiler's new warnings.
cmake -S "$src" -B "$src/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS="-fno-lto -Wno-error" -DCMAKE_INSTALL_PREFIX="$PWD/$prefix" >/dev/null
cmake --build "$src/build" -j"$(nproc)"
cmake --install "$src/build" >/dev/null
rm -rf "$src"
touch "$stamp"
echo "xgrammar $VERSION built into $prefix" >&2
