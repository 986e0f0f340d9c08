#!/bin/sh
# Prints the install commands of docs/manual.md's "Running under systemd": its shell block up to and
# including the `systemctl ... enable --now` line. realsd.sh runs exactly these in the container.
#   tests/systemd/readme-install.sh [docs/manual.md]
awk '/^## Running under systemd/ {s = 1} s && /^```/ {n++; if (n == 2) exit; next} s && n == 1' \
    "${1:-$(dirname "$0")/../../docs/manual.md}" | sed '/enable --now/q'
