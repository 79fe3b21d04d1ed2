#!/usr/bin/env bash
# Install a Chromium for static figure export (kaleido) and the browser tests (Playwright).
# Idempotent: does nothing when a Chrome/Chromium is already there. Debian/Ubuntu, as root.
set -euo pipefail

for name in chromium chromium-browser google-chrome google-chrome-stable; do
    if path=$(command -v "$name"); then
        echo "browser present: $path ($("$path" --version 2>/dev/null || echo 'version unknown'))"
        exit 0
    fi
done
if [ -n "${BROWSER_PATH:-}" ] && [ -x "$BROWSER_PATH" ]; then
    echo "browser present: BROWSER_PATH=$BROWSER_PATH"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "No Chrome/Chromium found, and installing one needs root. Either run:" >&2
    echo "    sudo apt-get update && sudo apt-get install -y chromium" >&2
    echo "or point BROWSER_PATH at a Chrome/Chromium executable you already have." >&2
    exit 1
fi
if ! command -v apt-get >/dev/null; then
    echo "No apt-get here: install Chrome/Chromium with your package manager," >&2
    echo "or set BROWSER_PATH to its executable." >&2
    exit 1
fi

echo "installing Debian's chromium (about 500 MB) ..."
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium >/dev/null
echo "installed: $(command -v chromium) ($(chromium --version))"
