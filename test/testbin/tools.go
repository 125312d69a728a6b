//go:build tools

// Package testbin pins the versions of the real control-plane binaries that
// agentboot's tests and `make run` use: kube-apiserver and kubectl from
// k8s.io/kubernetes. etcd lives in ./etcd, a module of its own, because
// kubernetes requires a newer etcd server than the one we pin. Keeping these
// in their own modules means the main module never sees k8s.io/kubernetes.
package testbin

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
