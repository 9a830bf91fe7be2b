#!/usr/bin/env bash
# Installs what onecopy's tests and benchmarks use on a fresh Debian machine: the standard NBD
# clients and servers (qemu-img/qemu-io, nbdcopy/nbdinfo/nbdfuse, nbdkit, fio with its nbd
# engine), FUSE, file system tools, the peers we compare against (restic, borg), and Garage, the
# distributed S3-compatible object store the object-storage tests and benchmarks run against.
# Safe to run again: apt-get skips what is installed.
set -euo pipefail

packages=(
  qemu-utils      # qemu-img, qemu-io, qemu-nbd
  libnbd-bin      # nbdcopy, nbdinfo, nbdfuse
  nbdkit          # plain NBD server: the benchmark baseline
  fio             # load generator with an nbd engine
  fuse3           # fusermount3: for nbdfuse and for `onecopy mount` (the fs face, fuser without libfuse)
  e2fsprogs       # mkfs.ext4, mke2fs -d, e2fsck, debugfs
  xfsprogs        # mkfs.xfs, for the xfs log hint
  util-linux      # losetup, mount
  restic          # backup peer
  borgbackup      # backup peer
  python3         # independent cross-checks in tests; bench/block's report
  diffutils       # diff -r of file trees in the block device's file-system test
  git             # the fs face's test clones a repository onto a mount and runs git fsck
  gdb             # thread stacks of a stalled server in the crash test's failure message
  curl            # test data and lab paper2: real software releases from the npm registry
  time            # /usr/bin/time: peak memory of the peers (lab paper2)
  tar             # unpacking the typescript releases of lab paper2; GNU tar extracts `backup restore -` archives in tests
  librsvg2-bin    # rsvg-convert: the lab's SVG figures as PNG, to look at them
  openssl         # certificates made by the NBD TLS tests
  bindfs          # FUSE passthrough file system: the fs face's benchmark baseline (bench/fs)
  rsync           # lab peers: stages each snapshot so unchanged files keep their inodes
  debootstrap     # lab peers: the Debian root whose /usr snapshots are its system-tree dataset
  libsodium-dev   # lab peers: what `cargo install bupstash` links against
  pkg-config      # lab peers: how bupstash's build finds libsodium
)

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$package")
done

if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "setup: all packages present"

# Garage (scripts/garage-cluster.sh starts a three-node cluster of it) has no Debian package, so
# it is built from crates.io: about 11 minutes on 2 cores, hence only when it is missing.
if ! command -v garage >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/garage" ]; then
  cargo install garage --locked --version 2.5.0
fi
echo "setup: garage present"

# The other peers of `onecopy lab peers`, rustic and bupstash, have no Debian package either,
# and building both takes about 40 minutes on 2 cores: no test needs them, so CI does not
# build them; the lab installs each (`cargo install rustic-rs|bupstash --locked`) when it is
# missing and asked to run it.

# Test data: two successive releases of a real package (see the script).
"$(dirname "$0")/fetch-test-data.sh"
