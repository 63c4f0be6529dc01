#!/usr/bin/env bash
# Install Debian's headless-capable Chromium and its WebDriver for the report's browser test.
# Idempotent: does nothing when both are already on PATH. Needs root (or sudo) and apt-get.
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  echo "chromium and chromedriver already installed: $(command -v chromium), $(command -v chromedriver)"
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "apt-get not found: install chromium and chromedriver with your package manager;" \
       "the browser test skips without them" >&2
  exit 1
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends chromium chromium-driver
echo "installed: $(command -v chromium), $(command -v chromedriver)"
