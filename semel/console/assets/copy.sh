#!/usr/bin/env bash
# Installs the pinned front-end libraries (package.json, package-lock.json) and copies
# their built files into ../static, which is committed and ships in the wheel: the
# console fetches nothing at run time.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
npm ci --no-audit --no-fund
cp node_modules/htmx.org/dist/htmx.min.js node_modules/htmx-ext-sse/dist/sse.min.js \
   node_modules/uplot/dist/uPlot.iife.min.js node_modules/uplot/dist/uPlot.min.css ../static/
rm -rf node_modules
