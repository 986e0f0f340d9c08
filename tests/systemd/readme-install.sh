#!/bin/sh
# Prints the install commands of README.md's "Running under systemd": its shell block up to and
# including the `systemctl ... enable --now` line. realsd.sh runs exactly these in the container.
#   tests/systemd/readme-install.sh [README]
awk '/^## Running under systemd/ {s = 1} s && /^```/ {n++; if (n == 2) exit; next} s && n == 1' \
    "${1:-$(dirname "$0")/../../README.md}" | sed '/enable --now/q'
