//go:build tools

// Package etcd pins the etcd server that agentboot's tests and `make run` use.
// It is a module of its own because k8s.io/kubernetes requires a newer etcd
// server module, which minimal version selection would otherwise pick.
package etcd

import _ "go.etcd.io/etcd/server/v3"
