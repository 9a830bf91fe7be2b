#!/usr/bin/env bash
# Makes the system-tree dataset of `onecopy lab peers`: a Debian root made by debootstrap,
# changed by dpkg in a chroot, and a copy of its /usr after each change.
#
#   debian-snapshots.sh OUT SUITE MIRROR
#
# OUT/snapshots/N-NAME/usr is /usr after step N; OUT/snapshots/N-NAME.packages lists the
# installed packages (`dpkg-query -W`) then. The steps:
#   1-debootstrap  debootstrap SUITE (its default variant: required and important packages)
#                  from the release's main archive only, without its updates
#   2-install      + a development and scripting toolset (python3, perl, gcc, g++, make, git,
#                  curl, vim), without recommends
#   3-upgrade      + SUITE-updates and SUITE-security, apt-get upgrade: the updates
#                  published since the release's last point release
#   4-remove       apt-get purge g++ git vim, then autoremove --purge
# The snapshots are made in OUT/snapshots.partial and renamed to OUT/snapshots when all are
# there, so an interrupted run leaves nothing that passes for a dataset; the root is removed
# at the end. Needs root, debootstrap and rsync, and the mirror on the network. What the
# mirror serves changes over time (point releases, security updates): the .packages lists
# record what a run got.
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 OUT SUITE MIRROR" >&2; exit 2; }
out=$1 suite=$2 mirror=$3
root=$out/root
partial=$out/snapshots.partial
export DEBIAN_FRONTEND=noninteractive LC_ALL=C
mkdir -p "$out"
rm -rf "$root" "$partial"
mkdir -p "$partial"
cleanup() {
  if mountpoint -q "$root/proc"; then umount "$root/proc"; fi
}
trap cleanup EXIT

in_root() { chroot "$root" "$@"; }
snapshot() { # NAME
  mkdir -p "$partial/$1"
  rsync -aH "$root/usr/" "$partial/$1/usr/"
  in_root dpkg-query -W -f '${Package} ${Version}\n' >"$partial/$1.packages"
  echo "snapshot $1: $(du -sb "$partial/$1/usr" | cut -f1) bytes, $(wc -l <"$partial/$1.packages") packages" >&2
}

debootstrap "$suite" "$root" "$mirror" >&2
# No service starts inside the chroot; name resolution as on the host.
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"
cp /etc/resolv.conf "$root/etc/resolv.conf"
mount -t proc proc "$root/proc"
snapshot 1-debootstrap

in_root apt-get install -y -q --no-install-recommends \
  python3 perl gcc g++ make git curl vim >&2
in_root apt-get clean
snapshot 2-install

security=${mirror%/debian}/debian-security
cat >>"$root/etc/apt/sources.list" <<LIST
deb $mirror $suite-updates main
deb $security $suite-security main
LIST
in_root apt-get update -q >&2
in_root apt-get upgrade -y -q >&2
in_root apt-get clean
snapshot 3-upgrade

in_root apt-get purge -y -q g++ git vim >&2
in_root apt-get autoremove --purge -y -q >&2
in_root apt-get clean
snapshot 4-remove

umount "$root/proc"
rm -rf "$root"
rm -rf "$out/snapshots"
mv "$partial" "$out/snapshots"
