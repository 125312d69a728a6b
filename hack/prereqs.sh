#!/usr/bin/env bash
# Checks, in a few seconds and before any long build, what `make run` and
# `make test` need from the machine: Go at least as new as go.mod asks, and
# the Debian packages in .ci/packages. As root it installs missing packages
# itself (saying which); otherwise it stops with the one command to paste.
# PREREQS_PACKAGES names another package list and PREREQS_NO_INSTALL=1 never
# installs (tests).
set -euo pipefail
cd "$(dirname "$0")/.."
list=${PREREQS_PACKAGES:-.ci/packages}

want=$(awk '/^go /{print $2; exit}' go.mod)
if ! command -v go >/dev/null 2>&1; then
	echo "prerequisites: Go is not installed; agentboot needs Go $want or newer (https://go.dev/dl/)" >&2
	exit 1
fi
have=$(go env GOVERSION | sed 's/^go//')
if [ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -n1)" != "$want" ]; then
	echo "prerequisites: Go $have is older than the $want go.mod asks for; install a newer Go (https://go.dev/dl/)" >&2
	exit 1
fi

packages=$(grep -v '^#' "$list" | tr '\n' ' ')
missing=()
for p in $packages; do
	status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
	[ "$status" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	if [ "$(id -u)" = 0 ] && [ "${PREREQS_NO_INSTALL:-}" != 1 ]; then
		echo "prerequisites: installing the missing Debian packages: ${missing[*]}" >&2
		export DEBIAN_FRONTEND=noninteractive
		# Packages with services (isc-dhcp-server) must not start them:
		# the tests run their own instances inside network namespaces.
		if [ ! -e /usr/sbin/policy-rc.d ]; then
			printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
			chmod +x /usr/sbin/policy-rc.d
			trap 'rm -f /usr/sbin/policy-rc.d' EXIT
		fi
		apt-get update -qq
		apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	else
		echo "prerequisites: missing Debian packages: ${missing[*]}" >&2
		echo "install them first:  sudo apt-get install -y ${missing[*]}" >&2
		exit 1
	fi
fi
