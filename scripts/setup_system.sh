#!/usr/bin/env bash
# Install the Debian packages the integration tests use for real (a Prometheus server, headless
# Chromium + ChromeDriver for the dashboard browser tests). Skips what is already present.
set -euo pipefail
need=()
# prometheus (the server) and promtool (tests/mixdiag/test_prometheus_rules.py) come in one package
{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || need+=(prometheus)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
[ ${#need[@]} -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "installing Debian packages: ${need[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
