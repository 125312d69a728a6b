// Package api holds the Kubernetes API types agentboot serves and reads, and
// nothing else: Go types, their deepcopy functions and the kubebuilder markers
// from which `make generate` writes the CRDs into deploy/crds.
//
// The groups, kinds and JSON field names are fixed by compatibility with
// OpenShift's assisted-service (agent-install.openshift.io), metal3
// (metal3.io) and HyperShift (hypershift.openshift.io, read only). Packages
// below api/ import only k8s.io/api and k8s.io/apimachinery.
package api
