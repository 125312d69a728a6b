// Package agent is agentboot's on-host agent: it registers the host with the
// agent API, reports its hardware inventory and virtualization support,
// heartbeats, and runs the steps the service asks for. It is linked into the
// small static bin/agent, so it must never import client-go, controller-
// runtime or anything from Kubernetes.
//
// The service side of the agent API and the Agent resource lifecycle live
// in agent-service/ (`agentboot agent-api` and the manager).
package agent
