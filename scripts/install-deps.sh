#!/usr/bin/env bash
# Installs moesq's build dependencies from Debian 12 packages (run as root). Idempotent.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq cmake g++ ninja-build nlohmann-json3-dev libcli11-dev libopenblas-dev \
  libgtest-dev libgmock-dev libbenchmark-dev libssl-dev \
  pkg-config libpcre2-dev libicu-dev \
  clang libclang-rt-dev >/dev/null  # clang + compiler-rt (libFuzzer, ASan): scripts/fuzz.sh
