// Package nodepool keeps HyperShift NodePools of Agent-platform hosted
// clusters supplied with worker nodes. The binder binds approved, validated,
// connected Agents that match a NodePool's agentLabelSelector; the agent API
// then hands each its installation (the OS disk image and the NodePool's
// user-data Ignition, see Ignition); the worker controller follows the host
// into the hosted cluster (approving its kubelet CSRs) until its Node is
// Ready, and on scale-down drains and deletes the Node and unbinds the Agent.
// It reads HyperShift's HostedClusters, NodePools and user-data Secrets and
// never writes them (it explains itself with events on the NodePool); it
// writes Agents. NodePools that cluster-api-provider-agent serves, and the
// Agents it bound, are left alone.
package nodepool
