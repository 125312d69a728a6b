// Package devcluster runs a real, single-node Kubernetes control plane (etcd and
// kube-apiserver, the binaries `make testbin` builds) on loopback for `agentboot
// dev`: it generates the certificates and an admin kubeconfig, keeps state
// between runs, and stops its child processes on every exit path.
//
// It owns only the processes it starts and the files under its state
// directory; it never installs anything into the cluster (the caller does).
package devcluster
