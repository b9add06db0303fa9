#!/usr/bin/env bash
# Builds a real kube-apiserver from the Go module proxy (no Kubernetes release binary is packaged
# for Debian, and project-site downloads are not available to CI). The Kubernetes adapter's slow
# test and `splitbrain demo --source kubernetes` run it against etcd.
#
# k8s.io/kubernetes cannot be `go install`ed: its go.mod requires its staging modules at v0.0.0
# with replaces to ./staging, which a dependent module ignores. A throwaway module that requires
# k8s.io/kubernetes and replaces every staging module with its published v0.<minor>.<patch> tag
# builds cmd/kube-apiserver. About 14 minutes on 2 cores; the binary is cached.
#
# Usage: build-kube-apiserver.sh [--print-path]   (also: python -m detector.devstack.kube_apiserver)
#   KUBE_VERSION (default 1.35.4), SPLITBRAIN_CACHE (default ~/.cache/splitbrain),
#   GO_BUILD_PARALLELISM (default 1: the build shares the machine).
set -euo pipefail
version=${KUBE_VERSION:-1.35.4}
cache=${SPLITBRAIN_CACHE:-$HOME/.cache/splitbrain}
out="$cache/kube-apiserver-v$version/kube-apiserver"
if [[ ${1:-} == --print-path ]]; then
  echo "$out"
  exit 0
fi
if [[ -x $out ]]; then
  echo "$out"
  exit 0
fi
command -v go >/dev/null || { echo "go is not installed (Debian: apt-get install golang-go)" >&2; exit 2; }
staging_version="v0.${version#1.}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
export GOFLAGS=-mod=mod GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
kube_gomod=$(go mod download -json "k8s.io/kubernetes@v$version" \
  | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
[[ -f $kube_gomod ]] || { echo "could not fetch k8s.io/kubernetes@v$version's go.mod" >&2; exit 1; }
# The staging modules: kubernetes' own `k8s.io/x => ./staging/src/k8s.io/x` replaces.
mapfile -t staging < <(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/.*#\1#p' "$kube_gomod")
((${#staging[@]} > 0)) || { echo "no staging modules found in $kube_gomod" >&2; exit 1; }
go_directive=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$kube_gomod")
# An older go (Debian 12 has 1.19, which cannot switch toolchains by itself) fetches the one
# kubernetes needs as a module from the same proxy: golang.org/toolchain.
have=$(go env GOVERSION | sed 's/^go//')
if [[ $(printf '%s\n%s\n' "$go_directive" "$have" | sort -V | head -1) != "$go_directive" ]]; then
  toolchain="golang.org/toolchain@v0.0.1-go$go_directive.$(go env GOOS)-$(go env GOARCH)"
  echo "go $have is older than $go_directive: using $toolchain" >&2
  toolchain_dir=$(go mod download -json "$toolchain" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
  export PATH="$toolchain_dir/bin:$PATH"
  chmod +x "$toolchain_dir"/bin/* "$toolchain_dir"/pkg/tool/*/* 2>/dev/null || true
fi
{
  echo "module splitbrain.local/kube-apiserver-build"
  echo
  echo "go $go_directive"
  echo
  echo "require k8s.io/kubernetes v$version"
  echo
  echo "replace ("
  for module in "${staging[@]}"; do
    echo "	$module => $module $staging_version"
  done
  echo ")"
} >go.mod
echo "building kube-apiserver v$version (${#staging[@]} staging modules at $staging_version) in $work" >&2
go get "k8s.io/kubernetes/cmd/kube-apiserver@v$version" >&2
mkdir -p "$(dirname "$out")"
nice -n 19 go build -p "${GO_BUILD_PARALLELISM:-1}" -trimpath -o "$out.tmp" k8s.io/kubernetes/cmd/kube-apiserver
mv "$out.tmp" "$out"
echo "$out"
