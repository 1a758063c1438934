#!/usr/bin/env bash
# Installs moesq's build dependencies from Debian 12 packages (run as root). Idempotent.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq cmake g++ ninja-build nlohmann-json3-dev libcli11-dev libopenblas-dev \
  libgtest-dev libgmock-dev libbenchmark-dev libssl-dev libopenmpi-dev openmpi-bin \
  pkg-config libpcre2-dev libicu-dev libcpp-httplib-dev \
  python3-dev pybind11-dev libdlpack-dev python3-numpy \
  clang libclang-rt-dev >/dev/null  # clang + compiler-rt (libFuzzer, ASan): scripts/fuzz.sh
