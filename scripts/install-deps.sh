#!/usr/bin/env bash
# Installs the Debian 12 packages wafer's build and tests need. Idempotent; uses sudo when not root.
set -euo pipefail
pkgs=(build-essential clang libclang-rt-14-dev libjansson-dev libfyaml-dev libcurl4-openssl-dev
      libsqlite3-dev libhiredis-dev redis-server libcmocka-dev
      python3-pytest python3-httpx python3-prometheus-client python3-jsonschema chromium
      nginx libnginx-mod-http-echo)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "deps: all ${#pkgs[@]} packages present"
    exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
echo "deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
