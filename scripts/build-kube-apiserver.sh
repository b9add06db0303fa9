#!/usr/bin/env bash
# The build script ships in the package (detector/devstack/build-kube-apiserver.sh), so that an
# installed wheel can build the server too: `python -m detector.devstack.kube_apiserver`.
exec bash "$(dirname "$0")/../detector/devstack/build-kube-apiserver.sh" "$@"
