// Package infraenvcontroller reconciles InfraEnvs: it checks the pull
// secret, picks the OS image from the catalog, renders the discovery content
// (internal/discovery) and publishes the signed ISO and network-boot URLs and
// the ImageCreated condition in the InfraEnv's status.
//
// It writes only InfraEnv status and events. It never serves images (the
// image service does, from the same rendering) and never touches Agents.
package infraenvcontroller
