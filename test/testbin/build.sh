#!/usr/bin/env bash
# Builds the real control-plane binaries (etcd, kube-apiserver, kubectl) that
# tests and `make run` use, once per version, into a cache outside the clone,
# and links them into <repo>/bin/testbin. Idempotent: a warm cache costs a
# hash and three hard links.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:-$repo/bin/testbin}
cache_root=${AGENTBOOT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agentboot}

# The version a go.mod requires, in either `require m v` or block form.
required() { awk -v m="$2" '$1==m{print $2} $1=="require" && $2==m{print $3}' "$1"; }
k8s_version=$(required "$here/go.mod" k8s.io/kubernetes)
etcd_version=$(required "$here/etcd/go.mod" go.etcd.io/etcd/server/v3)
key=$( (cat "$here/go.mod" "$here/go.sum" "$here/etcd/go.mod" "$here/etcd/go.sum" "$0"; go version) | sha256sum | cut -c1-12)
cached="$cache_root/testbin/k8s-$k8s_version-etcd-$etcd_version-$key"

if [ ! -x "$cached/kube-apiserver" ] || [ ! -x "$cached/kubectl" ] || [ ! -x "$cached/etcd" ]; then
	echo "testbin: building kube-apiserver, kubectl $k8s_version and etcd $etcd_version into $cached (5-10 minutes, once)" >&2
	mkdir -p "$cache_root/testbin"
	tmp=$(mktemp -d "$cache_root/testbin/.build-XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	minor=$(echo "$k8s_version" | cut -d. -f2)
	ver="-X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
	ver="$ver -X k8s.io/client-go/pkg/version.gitVersion=$k8s_version -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
	ver="$ver -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitTreeState=clean"
	cd "$here"
	export CGO_ENABLED=0
	(cd etcd && go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3)
	go build -trimpath -ldflags "-s -w $ver" -o "$tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
	go build -trimpath -ldflags "-s -w $ver" -o "$tmp/kubectl" k8s.io/kubernetes/cmd/kubectl
	rm -rf "$cached"
	mv "$tmp" "$cached"
	trap - EXIT
fi

mkdir -p "$out"
for b in etcd kube-apiserver kubectl; do
	ln -f "$cached/$b" "$out/$b" 2>/dev/null || cp -f "$cached/$b" "$out/$b"
done
echo "$cached" > "$out/.source"
