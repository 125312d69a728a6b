// Package nodepool keeps HyperShift NodePools of Agent-platform hosted
// clusters supplied with Agents: it binds approved, validated, connected
// Agents that match a NodePool's agentLabelSelector, and releases Agents that
// have not started installing when the NodePool shrinks. It reads HyperShift's
// HostedClusters and NodePools and never writes them (it explains itself with
// events on the NodePool); it writes Agents' spec and labels only. NodePools
// that cluster-api-provider-agent serves, and the Agents it bound, are left
// alone.
package nodepool
