#!/usr/bin/env bash
# Vendor Redoc's standalone bundle for GET /docs from the npm registry (npm pack), so the docs
# page loads nothing from outside the server. Usage: scripts/vendor_redoc.sh [version]
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-2.5.4}"
target=src/ortserve/server/http/static
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "redoc@$version" >/dev/null && tar xzf "redoc-$version.tgz")
mkdir -p "$target"
# The source map is not shipped, so the comment pointing at it goes too.
grep -v '^//# sourceMappingURL=' "$work/package/bundles/redoc.standalone.js" > "$target/redoc.standalone.js"
cp "$work/package/bundles/redoc.standalone.js.LICENSE.txt" "$target/"
cp "$work/package/LICENSE" "$target/redoc.LICENSE"
echo "redoc $version (npm pack redoc@$version: bundles/redoc.standalone.js)" > "$target/VERSION"
