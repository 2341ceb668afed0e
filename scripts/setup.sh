#!/usr/bin/env bash
# Installs attncheck's build and test dependencies from Debian's packages, only those that are missing.
# Idempotent: a second run installs nothing and takes a second.
set -euo pipefail

# librandom123-dev: Philox4x32-10 (header-only), the core's dropout mask.
# ninja-build: the presets' generator (a target's sources compile while the libraries it links are still built).
# chromium: the report test (reports.html_in_chromium) renders index.html in it, headless and offline.
# libbenchmark-dev: the forward's benchmark (attention/bench), built by scripts/test.sh.
# python3-pytest: the pytest plugin's tests; python3-venv, -setuptools and -wheel: its test of the documented install
# (a venv, pip install harness/python); python3-cloudpickle: the fixture serves closures and partials; python3-yaml: the CI recipes' test (examples/ci/); clang-14 and
# libfuzzer-14-dev: the fuzz targets (fuzz/).
packages=(cmake ninja-build g++ libeigen3-dev librandom123-dev librapidcheck-dev libgtest-dev libcli11-dev nlohmann-json3-dev
          libbenchmark-dev python3-numpy python3-torch python3-pytest python3-venv python3-setuptools python3-wheel
          python3-yaml python3-cloudpickle chromium clang-14 libfuzzer-14-dev)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "attncheck setup: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
