// Package nodepool is the service behind cluster-api-provider-agent, which
// HyperShift runs for every Agent-platform hosted cluster and which binds
// Agents to its Machines: for each Agent it bound, agentboot builds the
// day-2 worker's pointer Ignition (Ignition), and the worker controller
// follows the installed host into the hosted cluster (approving its kubelet
// CSRs, labelling its Node) until its Node is Ready. A NodePool whose
// machines wait for Agents gets events saying why none qualify.
//
// The binding is taken from objects only HyperShift and
// cluster-api-provider-agent write (internal/binding), never from the Agent
// alone. It reads AgentMachines, HostedControlPlanes, ClusterDeployments,
// AgentClusterInstalls, NodePools and their Secrets and never writes them;
// it writes Agents' status and, in hosted clusters, CSR approvals and Node
// labels. Scale-down is Cluster API's: it drains and deletes the Node, and
// cluster-api-provider-agent unbinds the Agent, which the Agent controller
// and the BMC controller return to the free pool.
package nodepool
