#!/usr/bin/env bash
# Downloads two successive releases of a real software package (the `typescript` package from
# the npm registry, fetched with curl, 5.4.4 and 5.4.5) into target/test-data/, each as the uncompressed .tar
# and as the unpacked tree. Tests compare how well fixed and content-defined chunking find the
# data the two releases share. Idempotent: a release already present is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

package=typescript
versions=(5.4.4 5.4.5)
data_dir=target/test-data
mkdir -p "$data_dir"
command -v curl >/dev/null || { echo "fetch-test-data: curl is needed (apt-get install curl)" >&2; exit 1; }

for version in "${versions[@]}"; do
  name="$package-$version"
  if [ -f "$data_dir/$name.tar" ] && [ -d "$data_dir/$name" ]; then
    echo "fetch-test-data: $name present"
    continue
  fi
  # Work in a scratch directory and move the results in last, so an interrupted run leaves
  # nothing that looks complete.
  scratch=$(mktemp -d "$data_dir/.fetch.XXXXXX")
  curl --fail --silent --show-error --location --retry 3 \
    -o "$scratch/$name.tgz" "https://registry.npmjs.org/$package/-/$name.tgz"
  gzip -dc "$scratch/$name.tgz" >"$scratch/$name.tar"
  mkdir "$scratch/$name"
  tar -xf "$scratch/$name.tar" -C "$scratch/$name"
  rm -rf "${data_dir:?}/$name" "$data_dir/$name.tar"
  mv "$scratch/$name" "$data_dir/$name"
  mv "$scratch/$name.tar" "$data_dir/$name.tar"
  rm -rf "$scratch"
  echo "fetch-test-data: $name fetched"
done
