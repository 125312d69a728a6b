#!/usr/bin/env bash
# gotool.sh NAME PACKAGE VERSION: builds a Go command once per version (and Go
# version) into a cache outside the clone and links it to bin/NAME, so fresh
# clones on the same machine reuse it.
set -euo pipefail
name=$1 pkg=$2 ver=$3
repo=$(cd "$(dirname "$0")/.." && pwd)
cache_root=${AGENTBOOT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agentboot}
dir="$cache_root/tools/$name-$ver-$(go env GOVERSION)"
if [ ! -x "$dir/$name" ]; then
	echo "building $name $ver into $dir (once)" >&2
	mkdir -p "$cache_root/tools"
	tmp=$(mktemp -d "$cache_root/tools/.build-XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	GOBIN="$tmp" CGO_ENABLED=0 GOFLAGS=-mod=mod go install "$pkg@$ver"
	# go install names the binary after the package directory.
	[ -x "$tmp/$name" ] || mv "$tmp/$(basename "$pkg")" "$tmp/$name"
	chmod 755 "$tmp"
	rm -rf "$dir"
	mv "$tmp" "$dir"
	trap - EXIT
fi
mkdir -p "$repo/bin"
ln -sf "$dir/$name" "$repo/bin/$name"
